"""The HTTP machinery shared by the network providers: stdlib only (``http.client``).

One round-trip is a POST whose reply streams as server-sent events. Invariants:

- **Cancellation is prompt.** Each attempt runs under a child of the caller's scope. Connecting
  polls that scope every 50 ms; once connected, a cancel shuts the socket down from the
  cancelling thread (``CancelScope.on_cancel``), which wakes the blocked read at once. The attempt
  then raises :class:`~runtime.cancel.Cancelled`, never a transport error. (A TLS handshake in
  progress is the one wait bounded by ``read_timeout`` instead.)
- **Timeouts are per byte, not per reply.** ``read_timeout`` bounds the wait for the *next* byte,
  so a slow but live stream is never cut, and a hung server fails as :class:`ProviderTimeout`.
- **Retries** (``max_retries`` extra attempts, exponential backoff from ``backoff_base`` capped at
  ``backoff_max``, with 25% jitter so a fleet does not retry in lockstep) cover 408, 429, 5xx,
  529, refused/reset connections, timeouts and streams cut before the message completed. A
  ``Retry-After`` (seconds or HTTP date) or ``retry-after-ms`` header replaces the backoff, capped
  at ``retry_after_max``. Before each retry a :class:`StreamReset` voids the deltas already
  emitted. Other 4xx fail at once as :class:`RequestRejected`; a reply that is not the protocol
  fails at once as :class:`MalformedReply`.
- **Proxies** (``runtime/providers/proxy.py``): with ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
  ``ALL_PROXY`` set and the host not in ``NO_PROXY``, the TCP connection goes to the proxy; an
  https endpoint is reached through a ``CONNECT`` tunnel with TLS end to end inside it, an http
  one by sending the absolute URI. Connecting to the proxy polls for cancellation like any
  connect, and the tunnelled socket is shut down by a cancel like a direct one.

Why our own transport and not httpx: no dependency for a single POST-and-stream, and the same
or lower streaming overhead (``benchmarks/sse_transport.py``, figures in docs/benchmarks.md);
proxies were the one missing piece, and they are the hundred lines above.
"""

from __future__ import annotations

import copy
import email.utils
import errno
import http.client
import json
import os
import random
import select
import socket
import ssl
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.messages import (
    AssistantMessage,
    ToolCall,
    ToolResult,
    TranscriptItem,
    UserMessage,
)
from exarch_actors.runtime.providers.base import (
    RAL_TOOL,
    SUMMARIZE_INSTRUCTION,
    MalformedReply,
    OnEvent,
    Provider,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    RateWait,
    RequestRejected,
    StreamEvent,
    StreamReset,
    ToolSpec,
    TransportError,
)
from exarch_actors.runtime.providers.endpoints import api_key_required
from exarch_actors.runtime.providers.governor import Ask, Gate
from exarch_actors.runtime.providers.proxy import proxy_for
from exarch_actors.runtime.providers.traffic import RATE_LIMIT_STATUSES, Cost, parse_rate_headers
from exarch_actors.runtime.providers.windows import window_for

CONNECT_POLL = 0.05
"""Seconds between cancellation checks while a TCP connect is in flight."""

MAX_SSE_LINE = 16 << 20
"""One SSE line longer than 16 MiB is not a protocol any provider speaks."""

MAX_PROXY_HEAD = 64 * 1024
"""A proxy's answer to CONNECT longer than this is not HTTP."""

ERROR_BODY_EXCERPT = 600
"""Characters of an HTTP error body kept in the error message (enough for a JSON error)."""


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StreamIncomplete(Exception):
    """The event stream ended (EOF) before the protocol's terminal event."""


class _EmitFailed(Exception):
    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class Retryable(Exception):
    """A failed attempt the retry loop may repeat."""

    def __init__(self, error: ProviderError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port][/path], got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def sse_events(resp: http.client.HTTPResponse) -> Iterator[tuple[str, str]]:
    """Server-sent events as (event name, data). EOF mid-event drops the partial event."""
    event = ""
    data: list[str] = []
    while True:
        raw = resp.readline(MAX_SSE_LINE)
        if not raw:
            return
        if len(raw) >= MAX_SSE_LINE and not raw.endswith(b"\n"):
            raise MalformedReply(f"an event-stream line exceeds {MAX_SSE_LINE} bytes")
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data or event:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)


def parse_retry_after(headers: http.client.HTTPMessage) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def decode_arguments(raw: str) -> dict[str, Any] | str:
    """Assembled tool-call arguments: the decoded object, ``{}`` for none, else the raw text
    (admission repairs a non-object to ``{}``; keeping the raw text keeps the evidence)."""
    if not raw.strip():
        return {}
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw
    return decoded if isinstance(decoded, dict) else raw


def transcript_uses_tools(transcript: Sequence[TranscriptItem]) -> bool:
    return any(
        isinstance(m, ToolResult) or (isinstance(m, AssistantMessage) and m.tool_calls)
        for m in transcript
    )


def object_arguments(call: ToolCall) -> dict[str, Any]:
    args = decode_arguments(call.arguments) if isinstance(call.arguments, str) else call.arguments
    return args if isinstance(args, dict) else {}


class HttpStreamingProvider(Provider):
    """A provider that POSTs JSON and reads the reply as an SSE stream, with retries."""

    default_base_url = ""
    api_key_env = ""
    base_url_env = ""
    """The variable naming the endpoint when no ``base_url`` is given (the SDKs' own name)."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        retry_after_max: float = 60.0,
        max_tokens: int | None = None,
        window_tokens: int | None = None,
        extra_headers: dict[str, str] | None = None,
        ca_file: str | None = None,
        proxy_env: Mapping[str, str] | None = None,
        governor: Gate | None = None,
    ) -> None:
        self.model = model
        self.governor = governor
        """The run's traffic governor (``runtime/providers/governor.py``): every request waits
        there before it is sent; ``None``: ungoverned (a provider built outside a run)."""
        self.base_url = (
            base_url or os.environ.get(self.base_url_env) or self.default_base_url
        ).rstrip("/")
        self.endpoint = Endpoint.parse(self.base_url)
        self.api_key = api_key if api_key is not None else os.environ.get(self.api_key_env)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_retries = max(0, max_retries)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.max_tokens = max_tokens
        self.window_explicit = window_tokens is not None
        """``--window-tokens`` was given: it holds across ``/model``; else the table answers."""
        self.window_tokens = window_tokens if window_tokens is not None else window_for(model)
        self.extra_headers = dict(extra_headers or {})
        self.ca_file = ca_file
        self._tls_context: ssl.SSLContext | None = None
        self.proxy = proxy_for(
            self.endpoint.scheme,
            self.endpoint.host,
            self.endpoint.port,
            os.environ if proxy_env is None else proxy_env,
        )
        """``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` as read when the provider was made
        (``runtime/providers/proxy.py``); ``None``: connect directly."""

    @property
    def missing_key(self) -> str | None:
        """Why this provider cannot work at all, or ``None``: no key for the hosted service.

        The rule is :func:`runtime.providers.endpoints.api_key_required`: a custom endpoint (a
        local server) may need no key, so only the provider's own hosted API is refused up
        front; anywhere else a 401/403 fails the first request instead."""
        if self.api_key or not api_key_required(self.name, self.base_url):
            return None
        return f"no API key: set {self.api_key_env} or pass --api-key"

    def with_model(self, model: str) -> Self:
        """``/model NAME``: the same endpoint, key, timeouts and retries with another model.

        A new object, so a turn already holding this provider keeps its model to the end. Its
        window is the new model's from the table unless ``--window-tokens`` set one."""
        clone = copy.copy(self)
        clone.model = model
        if not self.window_explicit:
            clone.window_tokens = window_for(model)
        clone.extra_headers = dict(self.extra_headers)
        return clone

    # -- protocol hooks ------------------------------------------------------------------------

    @abstractmethod
    def build_request(
        self,
        transcript: Sequence[TranscriptItem],
        system: str | None,
        tools: Sequence[ToolSpec],
        tool_choice_none: bool,
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        """(path, headers, JSON body) of one streaming request."""

    @abstractmethod
    def read_stream(
        self,
        events: Iterator[tuple[str, str]],
        emit: Callable[[StreamEvent], None],
        scope: CancelScope,
    ) -> AssistantMessage:
        """Assemble one message from the SSE events; raise :class:`StreamIncomplete` at EOF
        before the terminal event, :class:`MalformedReply` on a non-protocol event, and
        :class:`Retryable` for a retryable mid-stream error event."""

    def classify_status(self, status: int) -> tuple[type[ProviderError], bool]:
        """(error class, retryable) of a non-200 status."""
        if status == 429:
            return RateLimited, True
        if status == 408:
            return ProviderTimeout, True
        if status >= 500:
            return TransportError, True
        return RequestRejected, False

    # -- the round-trip ------------------------------------------------------------------------

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        return self._round_trip(transcript, system, tools, False, cancel, on_event)

    def summarize(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> str:
        return self.summary_reply(transcript, cancel, system=system).text

    def summary_reply(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> AssistantMessage:
        # A strict backend refuses tool-use history without tool definitions, so the tools stay
        # declared and tool_choice forbids calling them.
        uses = transcript_uses_tools(transcript)
        return self._round_trip(
            [*transcript, UserMessage(SUMMARIZE_INSTRUCTION)],
            system,
            (RAL_TOOL,) if uses else (),
            uses,
            cancel,
            None,
        )

    def _round_trip(
        self,
        transcript: Sequence[TranscriptItem],
        system: str | None,
        tools: Sequence[ToolSpec],
        tool_choice_none: bool,
        cancel: CancelScope,
        on_event: OnEvent | None,
    ) -> AssistantMessage:
        path, headers, body = self.build_request(transcript, system, tools, tool_choice_none)
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **headers,
            **self.extra_headers,
        }
        if self.governor is not None:
            return self._governed(self.governor, path, headers, payload, cancel, on_event)
        attempt = 0
        while True:
            cancel.check()
            try:
                return self._attempt(path, headers, payload, cancel, on_event)
            except Retryable as r:
                attempt = self._retry_or_raise(r, attempt, cancel, on_event)

    def _retry_or_raise(
        self, r: Retryable, attempt: int, cancel: CancelScope, on_event: OnEvent | None
    ) -> int:
        """Back off before the next transport attempt (its number returned), or raise the error
        once ``max_retries`` are spent."""
        err = r.error
        err.attempts = attempt + 1
        if attempt >= self.max_retries:
            raise err from None
        delay = self._delay(attempt, r.retry_after)
        if on_event is not None:
            on_event(StreamReset(attempt + 1, f"{err}; retrying in {delay:.2f}s"))
        if cancel.wait(delay):
            raise Cancelled(cancel.reason or "cancelled") from None
        return attempt + 1

    def _governed(
        self,
        gate: Gate,
        path: str,
        headers: dict[str, str],
        payload: bytes,
        cancel: CancelScope,
        on_event: OnEvent | None,
    ) -> AssistantMessage:
        """The round trip through the fleet's governor: each attempt waits for its grant; a
        429/529 is reported to the governor and waits again, in its first place, without
        spending a transport retry (``max_retries`` stays for broken connections and 5xx)."""
        first = time.monotonic()
        waited = 0.0
        attempt = 0
        key = (self.base_url, self.model)

        def on_wait(waiting: bool, seconds: float) -> None:
            if on_event is not None:
                since = time.time() - seconds if not waiting else time.time()
                on_event(RateWait(since, None if waiting else seconds))

        while True:
            cancel.check()
            ticket, seconds = gate.admit(
                Ask(key, len(payload), self.max_tokens, time.monotonic() - first, waited),
                cancel,
                on_wait,
            )
            waited += seconds

            def observe(status: int, reply_headers: Mapping[str, str], t: str = ticket) -> None:
                gate.observe(t, status, parse_rate_headers(reply_headers))

            try:
                msg = self._attempt(path, headers, payload, cancel, on_event, observe)
            except Retryable as r:
                gate.finish(ticket, None)
                if (
                    ticket  # a process with no gate installed is ungoverned: retries as before
                    and isinstance(r.error, RateLimited)
                    and (r.error.status is None or r.error.status in RATE_LIMIT_STATUSES)
                ):
                    if on_event is not None:
                        on_event(StreamReset(attempt + 1, f"{r.error}; waiting for the rate limit"))
                    continue
                attempt = self._retry_or_raise(r, attempt, cancel, on_event)
                continue
            except BaseException:
                gate.finish(ticket, None)
                raise
            usage = msg.usage
            gate.finish(
                ticket,
                Cost(usage.input_tokens, usage.output_tokens) if usage is not None else None,
            )
            return msg

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_max)
        base = min(self.backoff_max, self.backoff_base * (2**attempt))
        return base * (1.0 - 0.25 * random.random())

    def _attempt(
        self,
        path: str,
        headers: dict[str, str],
        payload: bytes,
        cancel: CancelScope,
        on_event: OnEvent | None,
        on_headers: Callable[[int, Mapping[str, str]], None] | None = None,
    ) -> AssistantMessage:
        scope = cancel.child()
        guard = threading.Lock()
        held: list[socket.socket] = []

        def abort() -> None:
            with guard:
                for s in held:
                    try:
                        # The base-class shutdown acts on the fd only; SSLSocket.shutdown would
                        # also drop the TLS object under the reading thread's feet.
                        socket.socket.shutdown(s, socket.SHUT_RDWR)
                    except OSError:
                        pass

        def emit(ev: StreamEvent) -> None:
            if on_event is None:
                return
            try:
                on_event(ev)
            except BaseException as e:
                raise _EmitFailed(e) from e

        scope.on_cancel(abort)
        conn: http.client.HTTPConnection | None = None
        sock: socket.socket | None = None
        try:
            sock = self._connect(scope)
            with guard:
                held.append(sock)
            scope.check()  # a cancel that ran before the socket was held
            if self.proxy is not None and self.endpoint.scheme == "https":
                self._tunnel(sock)
            if self.endpoint.scheme == "https":
                sock = self._tls().wrap_socket(sock, server_hostname=self.endpoint.host)
                with guard:
                    held.append(sock)
                scope.check()
            conn = http.client.HTTPConnection(self.endpoint.host, self.endpoint.port)
            conn.sock = sock
            target = path
            if self.proxy is not None and self.endpoint.scheme == "http":
                # a plain-HTTP request through a proxy names its absolute URI
                ep = self.endpoint
                target = f"http://{_authority(ep.host, ep.port)}{path}"
                headers = {**headers, **self.proxy.headers}
            conn.request("POST", target, body=payload, headers=headers)
            resp = conn.getresponse()
            if on_headers is not None:
                on_headers(resp.status, resp.msg)  # type: ignore[arg-type]
            if resp.status != 200:
                raise self._status_error(resp)
            return self.read_stream(sse_events(resp), emit, scope)
        except _EmitFailed as e:
            raise e.original from None
        except (Cancelled, Retryable, ProviderError):
            if scope.cancelled:
                raise Cancelled(scope.reason or "cancelled") from None
            raise
        except StreamIncomplete as e:
            if scope.cancelled:
                raise Cancelled(scope.reason or "cancelled") from None
            raise Retryable(
                TransportError(f"stream cut before the message completed: {e}")
            ) from None
        except TimeoutError as e:
            if scope.cancelled:
                raise Cancelled(scope.reason or "cancelled") from None
            what = str(e) or f"no byte for {self.read_timeout:g}s"
            raise Retryable(ProviderTimeout(f"{self.describe()} timed out: {what}")) from None
        except (OSError, http.client.HTTPException) as e:
            if scope.cancelled:
                raise Cancelled(scope.reason or "cancelled") from None
            raise Retryable(
                TransportError(f"{self.describe()} transport failure: {type(e).__name__}: {e}")
            ) from None
        finally:
            with guard:
                held.clear()
            if conn is not None:
                conn.close()
            elif sock is not None:
                sock.close()
            scope.cancel("request finished")  # releases the child scope and its callback

    def _status_error(self, resp: http.client.HTTPResponse) -> BaseException:
        try:
            body = resp.read(64 * 1024).decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException):
            body = ""
        cls, retryable = self.classify_status(resp.status)
        excerpt = body.strip()[:ERROR_BODY_EXCERPT]
        msg = f"{self.describe()} answered HTTP {resp.status} {resp.reason}: {excerpt}"
        if resp.status in (401, 403) and not self.api_key:
            msg += f" (no API key: set {self.api_key_env} or pass --api-key)"
        err: ProviderError
        if cls is RequestRejected:
            err = RequestRejected(msg, status=resp.status, body=body)
        elif cls is RateLimited:
            err = RateLimited(msg, status=resp.status, retry_after=parse_retry_after(resp.msg))
        else:
            err = cls(msg, status=resp.status)
        if not retryable:
            return err
        return Retryable(err, parse_retry_after(resp.msg))

    def _tls(self) -> ssl.SSLContext:
        """The client TLS context: the system's trust store (``SSL_CERT_FILE`` /
        ``SSL_CERT_DIR`` honoured by OpenSSL), plus ``ca_file`` (a corporate proxy's CA).

        Made once per provider and shared by its round trips (and its ``/model`` clones):
        loading the trust store took 20 ms per context on the development machine, which a
        context per request paid on every round trip. Two threads racing here both build one;
        either is right."""
        context = self._tls_context
        if context is None:
            context = ssl.create_default_context()
            if self.ca_file:
                context.load_verify_locations(cafile=self.ca_file)
            self._tls_context = context
        return context

    def _tunnel(self, sock: socket.socket) -> None:
        """``CONNECT host:port`` through the proxy on ``sock``; returns once the proxy says
        200, after which the socket is a byte pipe to the endpoint (TLS runs inside it). Any
        other answer is the proxy refusing: 407 and 403 are not retried, 5xx are."""
        assert self.proxy is not None
        ep = self.endpoint
        authority = _authority(ep.host, ep.port)
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{k}: {v}" for k, v in self.proxy.headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = b""
        while b"\r\n\r\n" not in head:
            piece = sock.recv(4096)
            if not piece:
                raise ConnectionResetError(f"proxy {self.proxy.host} closed during CONNECT")
            head += piece
            if len(head) > MAX_PROXY_HEAD:
                raise MalformedReply(f"proxy {self.proxy.host} sent an oversized CONNECT reply")
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1", errors="replace")
        parts = status_line.split(" ", 2)
        code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if code == 200:
            return
        message = (
            f"proxy {self.proxy.host}:{self.proxy.port} ({self.proxy.source}) refused "
            f"CONNECT {authority}: {status_line}"
        )
        if code == 407:
            message += " (the proxy wants credentials: http://USER:PASSWORD@host:port)"
        if code >= 500 or code == 0:
            raise Retryable(TransportError(message, status=code or None))
        raise RequestRejected(message, status=code, body="")

    def _connect(self, scope: CancelScope) -> socket.socket:
        """A connected TCP socket, to the proxy when one applies, else to the endpoint; polls
        ``scope`` so a cancel during connect is prompt."""
        ep = self.endpoint if self.proxy is None else self.proxy
        deadline = time.monotonic() + self.connect_timeout
        last: OSError | None = None
        for family, kind, proto, _, addr in socket.getaddrinfo(
            ep.host, ep.port, type=socket.SOCK_STREAM
        ):
            s = socket.socket(family, kind, proto)
            try:
                s.setblocking(False)
                rc = s.connect_ex(addr)
                if rc not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                    raise OSError(rc, f"connect to {ep.host}:{ep.port}: {errno.errorcode.get(rc)}")
                poller = select.poll()
                poller.register(s, select.POLLOUT | select.POLLERR)
                while not poller.poll(int(CONNECT_POLL * 1000)):
                    scope.check()
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"connect to {ep.host}:{ep.port} took over {self.connect_timeout:g}s"
                        )
                rc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if rc:
                    raise ConnectionRefusedError(
                        rc, f"connect to {ep.host}:{ep.port}: {errno.errorcode.get(rc, rc)}"
                    )
                s.setblocking(True)
                s.settimeout(self.read_timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except BaseException as e:
                s.close()
                if isinstance(e, OSError) and not isinstance(e, TimeoutError):
                    last = e
                    continue
                raise
        raise last or OSError(f"cannot resolve {ep.host}")
