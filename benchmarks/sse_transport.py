"""Streaming overhead of the providers' own stdlib transport against httpx, over loopback SSE.

A loopback HTTP/1.1 server streams an OpenAI-style chat-completions reply of ``--events`` text
deltas (chunked, one flushed chunk per event, as the hosted services do). Each peer runs whole
round trips — connect, POST, read the event stream, assemble the message with the same
``OpenAIProvider.read_stream`` — so only the transport differs:

- ``own``: ``OpenAIProvider.complete`` (``runtime/providers/http.py``: a socket, ``http.client``,
  its own SSE line reader);
- ``httpx``: ``httpx.Client.stream`` + ``iter_lines`` feeding the same ``read_stream`` (a fresh
  client per round trip, as ours connects afresh; a pooled client is shown too);
- ``floor``: a raw socket that sends the request and reads the reply to EOF without parsing.

Both over plain http and over https (the committed test CA of ``tests/support/tls/``; no raw
floor there). Figures per peer, the median of ``--repeat`` round trips: time to the first text
delta, time for the whole reply, and events per second; then the ratios against ``own``
measured in the same run. A peer that is not installed is reported as skipped
(``pip install -e '.[bench]'``).

    PYTHONPATH=. python benchmarks/sse_transport.py [--events 2000] [--repeat 15] [--quick]
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import UserMessage
from exarch_actors.runtime.providers.base import StreamEvent, TextDelta
from exarch_actors.runtime.providers.openai import OpenAIProvider

RoundTrip = Callable[[], tuple[float, float]]
"""One round trip: (seconds to the first text delta, seconds for the whole reply)."""


def reply_chunks(events: int) -> list[bytes]:
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "m"}
    out = []
    for i in range(events):
        delta = {"index": 0, "delta": {"content": f"token{i} "}}
        out.append(f"data: {json.dumps({**base, 'choices': [delta]})}\n\n".encode())
    stop = {"index": 0, "delta": {}, "finish_reason": "stop"}
    out.append(f"data: {json.dumps({**base, 'choices': [stop]})}\n\n".encode())
    usage = {"prompt_tokens": 10, "completion_tokens": events}
    out.append(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return [f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in out] + [b"0\r\n\r\n"]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client closing a kept-alive connection is not news


TLS_DIR = Path(__file__).resolve().parents[1] / "tests" / "support" / "tls"
"""The committed test CA and its localhost certificate (``tests/support/tls/make.sh``)."""


class SSEServer:
    def __init__(self, events: int, tls: bool = False) -> None:
        chunks = reply_chunks(events)
        self.tls = tls

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for c in chunks:
                    self.wfile.write(c)
                    self.wfile.flush()

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(TLS_DIR / "server.pem", TLS_DIR / "server.key")
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        port = self.httpd.server_address[1]
        return f"https://localhost:{port}/v1" if self.tls else f"http://127.0.0.1:{port}/v1"

    def __enter__(self) -> SSEServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


CA = str(TLS_DIR / "ca.pem")


def own(url: str, events: int) -> RoundTrip:
    provider = OpenAIProvider(model="m", base_url=url, api_key="k", max_retries=0, ca_file=CA)

    def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        first: list[float] = []

        def on_event(ev: StreamEvent) -> None:
            if not first and isinstance(ev, TextDelta):
                first.append(time.perf_counter() - t0)

        msg = provider.complete([UserMessage("go")], cancel=CancelScope(), on_event=on_event)
        total = time.perf_counter() - t0
        assert msg.text.count("token") == events
        return first[0], total

    return once


def httpx_peer(url: str, events: int, *, pooled: bool) -> RoundTrip | None:
    try:
        import httpx
    except ImportError:
        return None
    provider = OpenAIProvider(model="m", base_url=url, api_key="k", max_retries=0)
    path, headers, body = provider.build_request([UserMessage("go")], None, (), False)
    payload = json.dumps(body).encode()
    headers = {"content-type": "application/json", "accept": "text/event-stream", **headers}
    target = url.removesuffix("/v1") + path

    def make() -> Any:
        return httpx.Client(timeout=120.0, verify=ssl.create_default_context(cafile=CA))

    shared = make() if pooled else None

    def sse(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
        event, data = "", list[str]()
        for line in lines:
            if not line:
                if data or event:
                    yield event or "message", "\n".join(data)
                event, data = "", []
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif line.startswith("event:"):
                event = line[6:].removeprefix(" ")

    def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        first: list[float] = []

        def emit(ev: StreamEvent) -> None:
            if not first and isinstance(ev, TextDelta):
                first.append(time.perf_counter() - t0)

        client = shared or make()
        try:
            with client.stream("POST", target, content=payload, headers=headers) as resp:
                msg = provider.read_stream(sse(resp.iter_lines()), emit, CancelScope())
        finally:
            if shared is None:
                client.close()
        total = time.perf_counter() - t0
        assert msg.text.count("token") == events
        return first[0], total

    return once


def floor(url: str, events: int) -> RoundTrip | None:
    if url.startswith("https"):
        return None  # a raw socket does not speak TLS
    port = int(url.split(":")[2].split("/")[0])
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 2\r\n"
        b"connection: close\r\n\r\n{}"
    )

    def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request)
            first = 0.0
            while True:
                data = s.recv(65536)
                if not first:
                    first = time.perf_counter() - t0
                if not data or data.endswith(b"0\r\n\r\n"):
                    break
        return first, time.perf_counter() - t0

    return once


def measure(once: RoundTrip, repeat: int) -> tuple[float, float]:
    once()  # warm up (imports, first connection)
    runs = [once() for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="200 events, 3 round trips")
    args = ap.parse_args()
    events, repeat = (200, 3) if args.quick else (args.events, args.repeat)
    for tls in (False, True):
        compare(events, repeat, tls)
    return 0


def compare(events: int, repeat: int, tls: bool) -> None:
    scheme = "https (test CA)" if tls else "http"
    print(f"loopback SSE over {scheme}, {events} text deltas per reply, median of {repeat} trips")
    with SSEServer(events, tls) as server:
        peers: list[tuple[str, RoundTrip | None]] = [
            ("own (stdlib)", own(server.url, events)),
            ("httpx", httpx_peer(server.url, events, pooled=False)),
            ("httpx pooled", httpx_peer(server.url, events, pooled=True)),
            ("floor (raw socket)", floor(server.url, events)),
        ]
        results: dict[str, tuple[float, float]] = {}
        for name, once in peers:
            if once is None:
                why = (
                    "no TLS on a raw socket"
                    if name.startswith("floor")
                    else "httpx is not installed (pip install -e '.[bench]')"
                )
                print(f"  {name:<20} skipped: {why}")
                continue
            results[name] = measure(once, repeat)
    base = results["own (stdlib)"]
    print(f"  {'peer':<20} {'first delta':>12} {'whole reply':>12} {'events/s':>10} {'x own':>7}")
    for name, (first, total) in results.items():
        print(
            f"  {name:<20} {first * 1e3:>9.2f} ms {total * 1e3:>9.2f} ms "
            f"{events / total:>10.0f} {total / base[1]:>7.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
