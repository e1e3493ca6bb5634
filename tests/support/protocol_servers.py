"""Real HTTP servers on 127.0.0.1 that speak the providers' streaming protocols.

A :class:`ProtocolServer` plays a queue of scripted :class:`Exchange` values, one per incoming
request, and records every request it received. Bodies stream as HTTP/1.1 chunked transfer
encoding, one flushed chunk per SSE event, as the real services do. Behaviours: a normal stream,
an HTTP error status (with headers such as ``Retry-After``), a stream cut mid-message (the socket
is closed halfway through an event), a server that reads the request and then never answers, and
a stream that never ends.

Every handler thread is non-daemon and joined by :meth:`ProtocolServer.stop`; hanging and endless
handlers end on the server's stop event or on the client closing its socket.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TLS_DIR = Path(__file__).resolve().parent / "tls"
TEST_CA = TLS_DIR / "ca.pem"
"""The test CA that signed ``server.pem`` (``tests/support/tls/make.sh``)."""


def tls_server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS_DIR / "server.pem", TLS_DIR / "server.key")
    return context


@dataclass
class Exchange:
    """How the server answers one request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] = ()
    """SSE events, each written and flushed as one chunk."""
    body: bytes | None = None
    """A whole (non-streaming) body, for error statuses."""
    cut_after: int | None = None
    """Send this many chunks and half of the next one, then drop the connection."""
    hang: bool = False
    """Read the request, then send nothing until the server stops or the client leaves."""
    forever: bytes | None = None
    """After ``chunks``, send this chunk every ``interval`` seconds until the client leaves."""
    interval: float = 0.01


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""
    """The body's bytes as sent (prefix-stability tests compare them)."""


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client refusing the test certificate (a verification test) is expected."""
        import sys

        if not isinstance(sys.exc_info()[1], ssl.SSLError):
            super().handle_error(request, client_address)


class ProtocolServer:
    """A scripted streaming HTTP server on an ephemeral 127.0.0.1 port."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: serve https (``tests/support/tls/``: a server certificate for localhost
        signed by the committed test CA, :func:`tls_server_context`)."""
        self._tls = tls is not None
        self._queue: deque[Exchange] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.stopping = threading.Event()
        self.client_gone = threading.Event()
        """Set when a streaming handler saw the client close its connection."""
        self.request_seen = threading.Condition(self._lock)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 5.0

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                exchange = server._record(
                    RecordedRequest(
                        "POST",
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        raw,
                    )
                )
                self.close_connection = True
                server._answer(self, exchange)

        httpd = _Server(("127.0.0.1", 0), Handler)
        if tls is not None:
            httpd.socket = tls.wrap_socket(
                httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        httpd.daemon_threads = False
        httpd.block_on_close = True
        self._httpd = httpd
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        if self._tls:  # the certificate names localhost
            return f"https://localhost:{port}"
        return f"http://{host!s}:{port}"

    def start(self) -> ProtocolServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="protocol-server",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()  # joins every handler thread
        if self._thread is not None:
            self._thread.join()

    def script(self, *exchanges: Exchange) -> None:
        with self._lock:
            self._queue.extend(exchanges)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> bool:
        with self.request_seen:
            return self.request_seen.wait_for(lambda: len(self.requests) >= n, timeout)

    def _record(self, req: RecordedRequest) -> Exchange:
        with self.request_seen:
            self.requests.append(req)
            self.request_seen.notify_all()
            if self._queue:
                return self._queue.popleft()
        return Exchange(
            status=400,
            body=json.dumps({"error": {"message": "no scripted exchange left"}}).encode(),
        )

    def _answer(self, h: BaseHTTPRequestHandler, ex: Exchange) -> None:
        if ex.hang:
            # Wait until teardown or until the client closes its end.
            while not self.stopping.wait(0.02):
                if _peer_closed(h.connection):
                    self.client_gone.set()
                    return
            return
        if ex.body is not None or ex.status != 200:
            body = ex.body or b""
            h.send_response(ex.status)
            for k, v in ex.headers.items():
                h.send_header(k, v)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        for k, v in ex.headers.items():
            h.send_header(k, v)
        h.end_headers()
        try:
            for i, chunk in enumerate(ex.chunks):
                if ex.cut_after is not None and i == ex.cut_after:
                    _write_chunk(h, chunk[: max(1, len(chunk) // 2)])
                    h.connection.shutdown(socket.SHUT_RDWR)
                    return
                _write_chunk(h, chunk)
            if ex.cut_after is not None:
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            if ex.forever is not None:
                while not self.stopping.wait(ex.interval):
                    _write_chunk(h, ex.forever)
                return
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            self.client_gone.set()


def _write_chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    h.wfile.flush()


def _peer_closed(conn: socket.socket) -> bool:
    try:
        conn.settimeout(0.0)
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        finally:
            conn.settimeout(5.0)
    except BlockingIOError:
        return False
    except OSError:
        return True


# ---------------------------------------------------------------------------------------------
# Protocol encoders


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def _pieces(s: str, n: int = 3) -> list[str]:
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


def openai_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    finish: str | None = None,
    usage: tuple[int, int] | None = (12, 5),
    done: bool = True,
) -> list[bytes]:
    """A chat-completions stream: text in pieces, each tool call's arguments in pieces."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    out = [sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})]
    for piece in _pieces(text):
        out.append(sse({**base, "choices": [{"index": 0, "delta": {"content": piece}}]}))
    for i, (call_id, name, args) in enumerate(tool_calls):
        first: dict[str, Any] = {
            "index": i,
            "id": call_id,
            "type": "function",
            "function": {"name": name},
        }
        first["function"]["arguments"] = ""
        out.append(sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]}))
        for piece in _pieces(args):
            frag = {"index": i, "function": {"arguments": piece}}
            out.append(sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [frag]}}]}))
    reason = finish or ("tool_calls" if tool_calls else "stop")
    out.append(sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
    if usage is not None:
        u = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
        out.append(sse({**base, "choices": [], "usage": u}))
    if done:
        out.append(sse("[DONE]"))
    return out


def anthropic_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    stop_reason: str | None = None,
    usage: tuple[int, int] = (12, 5),
) -> list[bytes]:
    """A Messages API stream with pings, a text block and tool_use blocks in pieces."""
    msg = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "usage": {"input_tokens": usage[0], "output_tokens": 1},
    }
    out = [sse({"type": "message_start", "message": msg}, "message_start")]
    out.append(sse({"type": "ping"}, "ping"))
    index = 0
    if text:
        start: dict[str, Any] = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text"},
        }
        start["content_block"]["text"] = ""
        out.append(sse(start, "content_block_start"))
        for piece in _pieces(text):
            delta = {"type": "text_delta", "text": piece}
            ev = {"type": "content_block_delta", "index": 0, "delta": delta}
            out.append(sse(ev, "content_block_delta"))
        out.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        index = 1
    for call_id, name, args in tool_calls:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        ev = {"type": "content_block_start", "index": index, "content_block": block}
        out.append(sse(ev, "content_block_start"))
        for piece in _pieces(args):
            delta = {"type": "input_json_delta", "partial_json": piece}
            ev = {"type": "content_block_delta", "index": index, "delta": delta}
            out.append(sse(ev, "content_block_delta"))
        out.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    reason = stop_reason or ("tool_use" if tool_calls else "end_turn")
    md = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": usage[1]},
    }
    out.append(sse(md, "message_delta"))
    out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


# ---------------------------------------------------------------------------------------------
# Local OpenAI-compatible servers, each as its source code writes a chat-completions stream.
# Every encoder takes (text, tool_calls, usage, include_usage): ``include_usage`` is what the
# client's ``stream_options.include_usage`` asked for, which the dialect may ignore.


def _chunk(base: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse({**base, "choices": [{"finish_reason": finish, "index": 0, "delta": delta}]})


def llamacpp_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    usage: tuple[int, int] = (12, 5),
    include_usage: bool = True,
) -> list[bytes]:
    """llama.cpp's ``llama-server --jinja`` since June 2025 (tools/server/server-task.cpp,
    ``to_json_oaicompat_chat_stream``; common/chat.cpp, ``common_chat_msg_diff_to_json_oaicompat``).

    A role chunk with ``content: null``; one chunk per diff: content, or a tool call whose first
    diff has the server-generated 32-character id, ``type`` and the name with empty arguments and
    whose next diffs carry only argument text; an empty-delta chunk with the finish reason; the
    usage chunk (``choices: []``) only when asked, with llama.cpp's ``timings`` on the last
    chunk; ``[DONE]``."""
    base = {
        "created": 1_760_000_000,
        "id": "chatcmpl-Xq3vR8sLkP2mN7tB",
        "model": "qwen2.5-7b-instruct-q4_k_m.gguf",
        "system_fingerprint": "b6123-8e0d7a2f",
        "object": "chat.completion.chunk",
    }
    out = [_chunk(base, {"role": "assistant", "content": None})]
    for piece in _pieces(text):
        out.append(_chunk(base, {"content": piece}))
    for i, (call_id, name, args) in enumerate(tool_calls):
        first = {"index": i, "id": call_id, "type": "function"}
        first["function"] = {"name": name, "arguments": ""}
        out.append(_chunk(base, {"tool_calls": [first]}))
        for piece in _pieces(args):
            frag = {"index": i, "function": {"arguments": piece}}
            out.append(_chunk(base, {"tool_calls": [frag]}))
    out.append(_chunk(base, {}, "tool_calls" if tool_calls else "stop"))
    timings = {"prompt_n": usage[0], "predicted_n": usage[1], "predicted_per_second": 41.7}
    if include_usage:
        u = {"completion_tokens": usage[1], "prompt_tokens": usage[0]}
        u["total_tokens"] = sum(usage)
        out.append(sse({**base, "choices": [], "usage": u, "timings": timings}))
    else:
        last = json.loads(out[-1].decode().removeprefix("data: "))
        out[-1] = sse({**last, "timings": timings})
    out.append(sse("[DONE]"))
    return out


def llamacpp_may2025_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    usage: tuple[int, int] = (12, 5),
    include_usage: bool = True,
) -> list[bytes]:
    """llama.cpp's server in the builds between tool-call streaming landing
    (ggml-org/llama.cpp#12379, late May 2025) and its format fix days later (#13800, reported as
    #13774): **no id on the tool call** — it sat in ``function.id``, and a call id of ``""``
    here sends none at all —, no ``type``, and the name repeated on every diff (a client that
    concatenates names gets ``ralral...``). Usage rode on the finish chunk whatever was asked."""
    base = {"created": 1_748_000_000, "id": "chatcmpl-k2", "model": "gpt-3.5-turbo"}
    base["object"] = "chat.completion.chunk"
    out = [_chunk(base, {"role": "assistant", "content": None})]
    for piece in _pieces(text):
        out.append(_chunk(base, {"content": piece}))
    for i, (call_id, name, args) in enumerate(tool_calls):
        for piece in _pieces(args):
            fn = {"name": name, "arguments": piece}
            if call_id:
                fn["id"] = call_id
            out.append(_chunk(base, {"tool_calls": [{"index": i, "function": fn}]}))
    finish = sse(
        {
            **base,
            "choices": [
                {"finish_reason": "tool_calls" if tool_calls else "stop", "index": 0, "delta": {}}
            ],
            "usage": {
                "completion_tokens": usage[1],
                "prompt_tokens": usage[0],
                "total_tokens": sum(usage),
            },
        }
    )
    return [*out, finish, sse("[DONE]")]


def vllm_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    usage: tuple[int, int] = (12, 5),
    include_usage: bool = True,
) -> list[bytes]:
    """vLLM's ``vllm serve --enable-auto-tool-choice --tool-call-parser hermes``
    (vllm/entrypoints/openai/serving_chat.py, ``chat_completion_stream_generator``; chunks dumped
    with ``exclude_unset``).

    A role chunk with ``content: ""``; a tool call's first delta has the
    ``chatcmpl-tool-<32 hex>`` id, ``type`` and the name but **no arguments key**; the parser
    streams the arguments it is sure of, and the finish chunk carries **the rest of the arguments
    together with** ``finish_reason: "tool_calls"``; the usage chunk only when asked; ``[DONE]``."""
    base: dict[str, Any] = {"id": "chatcmpl-5b1c9e0f2a7d4c3e", "object": "chat.completion.chunk"}
    base.update({"created": 1_760_000_000, "model": "Qwen/Qwen2.5-7B-Instruct"})

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        return sse({**base, "choices": [choice]})

    out = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(text):
        out.append(chunk({"content": piece}))
    last_rest = ""
    for i, (call_id, name, args) in enumerate(tool_calls):
        first = {"id": call_id, "type": "function", "index": i, "function": {"name": name}}
        out.append(chunk({"tool_calls": [first]}))
        *sure, rest = _pieces(args, 4) or [""]
        for piece in sure:
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        if i < len(tool_calls) - 1:
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": rest}}]}))
        else:
            last_rest = rest
    if tool_calls:
        frag = {"index": len(tool_calls) - 1, "function": {"arguments": last_rest}}
        out.append(chunk({"tool_calls": [frag]}, "tool_calls"))
    else:
        out.append(chunk({"content": ""}, "stop"))
    if include_usage:
        u = {"prompt_tokens": usage[0], "total_tokens": sum(usage), "completion_tokens": usage[1]}
        out.append(sse({**base, "choices": [], "usage": u}))
    out.append(sse("[DONE]"))
    return out


def ollama_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    usage: tuple[int, int] = (12, 5),
    include_usage: bool = True,
) -> list[bytes]:
    """Ollama's ``/v1/chat/completions`` (openai/openai.go ``ToChunk``, middleware/openai.go
    ``ChatWriter``), as of 2025.

    Every delta repeats ``role`` and carries ``content`` (``""`` beside tool calls); **the tool
    calls arrive whole in one chunk** — ``call_<8 chars>`` ids, an index, the arguments as one
    complete JSON string —; the done chunk says ``tool_calls`` once a call was sent; the usage
    chunk (``choices: []``) only when asked; ``[DONE]``."""
    return _ollama(text, tool_calls, usage if include_usage else None, "qwen2.5:7b", legacy=False)


def ollama_2024_chunks(
    text: str = "",
    tool_calls: Sequence[tuple[str, str, str]] = (),
    usage: tuple[int, int] = (12, 5),
    include_usage: bool = True,
) -> list[bytes]:
    """Ollama's ``/v1`` before early 2025: as :func:`ollama_chunks`, but the tool calls carry
    **no index** (ollama/ollama#7881), the done chunk says **``stop`` although calls were made**
    (changed by ollama/ollama#7963), and **no usage** reaches the stream whatever was asked."""
    return _ollama(text, tool_calls, None, "llama3.1:8b", legacy=True)


def _ollama(
    text: str,
    tool_calls: Sequence[tuple[str, str, str]],
    usage: tuple[int, int] | None,
    model: str,
    *,
    legacy: bool,
) -> list[bytes]:
    base = {"id": "chatcmpl-417", "object": "chat.completion.chunk", "created": 1_760_000_000}
    base.update({"model": model, "system_fingerprint": "fp_ollama"})

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": piece}) for piece in _pieces(text)]
    if tool_calls:
        calls: list[dict[str, Any]] = []
        for i, (cid, name, args) in enumerate(tool_calls):
            call: dict[str, Any] = {"id": cid, "index": i, "type": "function"}
            call["function"] = {"name": name, "arguments": args}
            if legacy:
                del call["index"]
            calls.append(call)
        out.append(chunk({"role": "assistant", "content": "", "tool_calls": calls}))
    finish = "tool_calls" if tool_calls and not legacy else "stop"
    out.append(chunk({"role": "assistant", "content": ""}, finish))
    if usage is not None:
        u = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
        out.append(sse({**base, "choices": [], "usage": u}))
    out.append(sse("[DONE]"))
    return out
