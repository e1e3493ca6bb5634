"""OpenTelemetry export of a fleet: the bus's events as spans following the GenAI semantic
conventions, sent over OTLP/HTTP (docs/observability.md). Optional: the packages come with
``pip install 'exarch-actors[otel]'`` and are imported only when an export is asked for.

- one ``invoke_agent NAME`` span per agent incarnation (``Born`` to ``Died``), whose parent is
  its spawner's span: the spawn tree is the trace's parentage;
- one ``chat MODEL`` span (kind CLIENT) per provider round trip (``ModelCall``), with
  ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.usage.*`` and
  ``gen_ai.response.finish_reasons``, and the cost, attempts and rate-limit wait as
  ``exarch.*`` attributes;
- one ``execute_tool ral`` span per ral call (``Io``), its status an error when the call failed;
- notices, errors, rejected messages and notes as span events on the agent's span.

Every span of a session shares one trace id, derived from the session directory's name, so a
resumed run (a new control process) adds to the same trace. The export never slows the run: the
live exporter reads a bounded bus subscription on a thread of its own (a consumer that falls
behind is counted, never waited for) and the SDK's batch processor sends in the background.
Content (scripts, replies, prompts) is not exported: only the first line of a ral call, as
``exarch.script``, like the trace's span names.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.events import Event
from exarch_actors.runtime.observe.spans import epoch, first_line
from exarch_actors.runtime.state.session_dir import SessionDir

INSTALL = "pip install 'exarch-actors[otel]'"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
TRACES_PATH = "/v1/traces"
EXPORT_TIMEOUT = 3.0
"""Seconds one export (with its retries) and the final flush may take: a collector that is down
costs the end of a run at most about this much, never the run itself."""
LIVE_BUFFER = 65536
"""Events the live exporter's bus subscription holds before it counts the rest as missed."""


class OtelMissing(ExarchError):
    """An OpenTelemetry export was asked for but its packages are not installed."""

    def __init__(self) -> None:
        super().__init__(
            f"OpenTelemetry export needs the otel extra: {INSTALL} "
            "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
        )


def otel_available() -> bool:
    try:
        return (
            importlib.util.find_spec("opentelemetry.sdk.trace") is not None
            and importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
        )
    except ModuleNotFoundError:
        return False


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base ``endpoint`` (what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` holds: ``http://host:4318`` -> ``.../v1/traces``); a URL
    that already ends in ``/v1/traces`` is kept."""
    url = endpoint.rstrip("/")
    return url if url.endswith(TRACES_PATH) else url + TRACES_PATH


def endpoint_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The collector the standard variables name: the traces endpoint itself, or the base one."""
    env = os.environ if env is None else env
    return env.get(TRACES_ENDPOINT_ENV) or env.get(ENDPOINT_ENV) or None


def trace_id_of(session_root: str | os.PathLike[str]) -> int:
    """The session's trace id: 128 bits of a hash of its directory's name (never zero)."""
    digest = hashlib.sha256(Path(session_root).resolve().name.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def _ns(at: Any) -> int | None:
    t = epoch(at)
    return None if t is None else int(t * 1e9)


class SpanExport:
    """Transcript records in, spans out: :meth:`feed` each record in order, :meth:`close` at the
    end (flushes; an agent still open is ended there, marked as not ended)."""

    def __init__(self, session_root: str | os.PathLike[str], endpoint: str) -> None:
        if not otel_available():
            raise OtelMissing()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.session = Path(session_root).resolve().name
        self._provider = TracerProvider(
            resource=Resource.create(
                {"service.name": "exarch-actors", "exarch.session": str(session_root)}
            ),
            id_generator=_session_ids(trace_id_of(session_root)),
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=EXPORT_TIMEOUT)
            )
        )
        self._tracer = self._provider.get_tracer("exarch-actors")
        self._open: dict[str, Any] = {}
        self._last: dict[str, Any] = {}  # an agent's latest span, open or ended: a parent
        self.spans = 0

    def feed(self, r: Mapping[str, Any]) -> None:
        kind, agent, at = r.get("kind"), str(r.get("agent", "")), _ns(r.get("at"))
        if at is None:
            return
        if kind == "Born":
            self._born(agent, r, at)
        elif kind == "Died":
            self._died(agent, r, at)
        elif kind == "ModelCall":
            self._model_call(agent, r, at)
        elif kind == "Io":
            self._tool(agent, r, at)
        elif kind in ("Notice", "ProviderError", "InboxRejected", "SystemNote"):
            span = self._open.get(agent)
            if span is not None:
                attrs = {k: str(v) for k, v in r.items() if k not in ("kind", "agent", "at")}
                span.add_event(str(r.get("notice") or kind), attributes=attrs, timestamp=at)

    def _context(self, agent: str | None) -> Any:
        from opentelemetry import trace

        parent = self._last.get(agent) if agent else None
        return trace.set_span_in_context(parent) if parent is not None else None

    def _born(self, agent: str, r: Mapping[str, Any], at: int) -> None:
        parent = r.get("parent") if isinstance(r.get("parent"), str) else None
        old = self._open.pop(agent, None)
        if old is not None:
            old.end(end_time=at)
        span = self._tracer.start_span(
            f"invoke_agent {agent}",
            context=self._context(parent),
            start_time=at,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                "gen_ai.agent.id": f"{self.session}/{agent}",
                "gen_ai.conversation.id": self.session,
                "exarch.parent": parent or "",
                "exarch.node": str(r.get("node") or "local"),
            },
        )
        self._open[agent] = self._last[agent] = span
        self.spans += 1

    def _died(self, agent: str, r: Mapping[str, Any], at: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._open.pop(agent, None)
        if span is None:
            return
        outcome = str(r.get("outcome") or "")
        span.set_attribute("exarch.outcome", outcome)
        if r.get("cause"):
            span.set_attribute("exarch.cause", str(r.get("cause")))
        if outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, str(r.get("cause") or "failed")))
        span.end(end_time=at)

    def _child(self, agent: str, name: str, start: int, end: int, attrs: dict[str, Any]) -> Any:
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if attrs.get("gen_ai.operation.name") == "chat" else None
        span = self._tracer.start_span(
            name,
            context=self._context(agent),
            kind=kind or SpanKind.INTERNAL,
            start_time=start,
            attributes={k: v for k, v in attrs.items() if v is not None},
        )
        self.spans += 1
        return span

    def _model_call(self, agent: str, r: Mapping[str, Any], at: int) -> None:
        model = str(r.get("model") or "")
        start = at - int(float(r.get("seconds") or 0) * 1e9)
        span = self._child(
            agent,
            f"chat {model}".strip(),
            start,
            at,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": str(r.get("provider") or ""),
                "gen_ai.request.model": model,
                "gen_ai.response.model": model,
                "gen_ai.agent.name": agent,
                "gen_ai.conversation.id": self.session,
                "gen_ai.usage.input_tokens": r.get("input_tokens"),
                "gen_ai.usage.output_tokens": r.get("output_tokens"),
                "gen_ai.usage.cache_read.input_tokens": r.get("cache_read_tokens"),
                "gen_ai.usage.cache_creation.input_tokens": r.get("cache_write_tokens"),
                "gen_ai.response.finish_reasons": [str(r.get("stop_reason") or "")],
                "exarch.operation": str(r.get("operation") or "chat"),
                "exarch.cost_usd": r.get("cost"),
                "exarch.attempts": int(r.get("attempts") or 1),
                "exarch.rate_wait_seconds": float(r.get("rate_wait") or 0.0),
            },
        )
        span.end(end_time=at)

    def _tool(self, agent: str, r: Mapping[str, Any], at: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        start = at - int(float(r.get("seconds") or 0) * 1e9)
        span = self._child(
            agent,
            "execute_tool ral",
            start,
            at,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "ral",
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": str(r.get("call_id") or ""),
                "gen_ai.agent.name": agent,
                "exarch.script": first_line(str(r.get("script") or ""), 200),
            },
        )
        if r.get("error"):
            span.set_status(Status(StatusCode.ERROR, first_line(str(r.get("value") or ""), 200)))
        span.end(end_time=at)

    def close(self) -> None:
        import time

        now = time.time_ns()
        for span in self._open.values():
            span.set_attribute("exarch.outcome", "(not ended)")
            span.end(end_time=now)
        self._open.clear()
        self._provider.shutdown()  # sends what is queued (one export: EXPORT_TIMEOUT at most)


def _session_ids(trace_id: int) -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class SessionIds(IdGenerator):
        """Random span ids; every root span of the session in the session's trace."""

        def generate_span_id(self) -> int:
            return random.getrandbits(64) or 1

        def generate_trace_id(self) -> int:
            return trace_id

    return SessionIds()


class EventSource(Protocol):
    """A bus subscription (``actors/bus.py``): the next event, None once closed and drained."""

    def get(self, timeout: float | None = None) -> Event | None: ...


class LiveExport:
    """The live exporter of a run: a thread feeding a :class:`SpanExport` from the fleet's bus
    until the bus closes. :meth:`close` waits for it and flushes."""

    def __init__(self, source: EventSource, export: SpanExport) -> None:
        self.export = export
        self.missed = 0
        self._source = source
        self._thread = threading.Thread(target=self._pump, name="otlp-export", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while (event := self._source.get()) is not None:
            if event.kind == "Overflow":
                self.missed += int(getattr(event, "missed", 0))
                continue
            try:
                self.export.feed(event.to_record())
            except Exception:  # a malformed event costs its span, never the run
                self.missed += 1

    def close(self, timeout: float = 10.0) -> None:
        """Once the bus is closed: wait for the last events, end what is open, flush."""
        self._thread.join(timeout)
        self.export.close()


def export_session(session: SessionDir, endpoint: str) -> int:
    """Send a finished session's spans (its transcript, in order) to ``endpoint``; how many."""
    from exarch_actors.runtime.drills.session_logs import SessionLogs

    export = SpanExport(session.root, endpoint)
    for r in SessionLogs(session).transcript:
        export.feed(r)
    export.close()
    return export.spans
