"""OpenTelemetry export (``--otlp-endpoint``): a run's spans reach a real OTLP/HTTP receiver on
the loopback, started by the test, with the GenAI attributes and the spawn tree as parentage."""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import exarch_actors
from exarch_actors.runtime.observe.otel import trace_id_of, traces_url
from tests.observe.conftest import FANOUT, exarch

pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http",
    reason="the otel extra is not installed (pip install -e '.[test]' brings it)",
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span posted to ``/v1/traces``."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.take(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, path: str, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            self.paths.append(path)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": int.from_bytes(span.trace_id, "big"),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "kind": span.kind,
                                "error": span.status.code == 2,
                                "attrs": {a.key: _value(a.value) for a in span.attributes},
                            }
                        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_run_exports_genai_spans_with_the_spawn_tree_as_parentage(
    tmp_path: Path, receiver: Receiver, agents: str
) -> None:
    session = tmp_path / "s"
    result = exarch_actors.run(
        str(FANOUT), session_dir=session, agents=agents, otlp_endpoint=receiver.url
    )
    assert result.reply == "499500"
    spans = receiver.spans  # the fleet's close flushed them: every span is here now
    assert set(receiver.paths) == {"/v1/traces"}
    assert {s["trace_id"] for s in spans} == {trace_id_of(session)}
    (trunk,) = by_name(spans, "invoke_agent trunk")
    (lo,) = by_name(spans, "invoke_agent lo")
    (hi,) = by_name(spans, "invoke_agent hi")
    assert trunk["parent"] == ""  # the root of the trace
    assert lo["parent"] == hi["parent"] == trunk["span_id"]
    for agent in (trunk, lo, hi):
        assert agent["attrs"]["gen_ai.operation.name"] == "invoke_agent"
        assert agent["attrs"]["exarch.outcome"] == "replied"
    chats = by_name(spans, "chat fanout")
    assert len(chats) == 8  # trunk 6, lo 1, hi 1: every round trip of the scenario
    for chat in chats:
        attrs = chat["attrs"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["gen_ai.request.model"] == "fanout"
        assert attrs["gen_ai.response.finish_reasons"] in (["tool_use"], ["end_turn"])
        assert chat["kind"] == 3  # SPAN_KIND_CLIENT
        owner = {trunk["span_id"]: "trunk", lo["span_id"]: "lo", hi["span_id"]: "hi"}
        assert owner[chat["parent"]] == attrs["gen_ai.agent.name"]
    tools = by_name(spans, "execute_tool ral")
    assert len(tools) == 7
    assert all(t["attrs"]["gen_ai.tool.name"] == "ral" for t in tools)
    assert {t["parent"] for t in tools} == {trunk["span_id"], lo["span_id"], hi["span_id"]}


def test_trace_sends_a_finished_session_to_the_collector(
    tmp_path: Path, receiver: Receiver
) -> None:
    session = tmp_path / "s"
    exarch_actors.run(str(FANOUT), session_dir=session, agents="thread")
    done = exarch(
        "trace", str(session), "-o", str(tmp_path / "t.json"), "--otlp-endpoint", receiver.url
    )
    assert done.returncode == 0, done.stderr
    assert "otlp: 18 spans sent" in done.stderr  # 3 agents, 8 requests, 7 ral calls
    assert len(receiver.spans) == 18
    (lo,) = by_name(receiver.spans, "invoke_agent lo")
    (trunk,) = by_name(receiver.spans, "invoke_agent trunk")
    assert lo["parent"] == trunk["span_id"]


def test_run_exports_to_the_collector_the_standard_variable_names(
    tmp_path: Path, receiver: Receiver
) -> None:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    done = exarch(
        "run", str(FANOUT), "--session-dir", str(tmp_path / "s"), "--agents", "thread", env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "499500", done.stderr
    names = sorted(s["name"] for s in receiver.spans if s["name"].startswith("invoke_agent"))
    assert names == ["invoke_agent hi", "invoke_agent lo", "invoke_agent trunk"]


def test_otlp_endpoint_without_the_otel_extra_is_refused_naming_the_extra(
    tmp_path: Path,
) -> None:
    hide = "import sys; sys.modules['opentelemetry'] = None  # as if the extra were missing"
    session = tmp_path / "s"
    done = exarch(
        "run",
        str(FANOUT),
        "--session-dir",
        str(session),
        "--otlp-endpoint",
        "http://127.0.0.1:9",
        before=hide,
    )
    assert done.returncode == 2
    assert "pip install 'exarch-actors[otel]'" in done.stderr
    assert not session.exists()  # refused before anything was written


def test_the_endpoint_is_the_collector_base_url_as_the_standard_variable_holds_it() -> None:
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://h:4318/v1/traces") == "http://h:4318/v1/traces"
