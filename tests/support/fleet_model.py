"""A rate-limited model server on 127.0.0.1 that drives a fan-out fleet, in either dialect.

What a user meets at a hosted model, made small: a token bucket of requests (``rate`` a second,
``burst`` deep) and, optionally, one of input tokens; a request over either is answered 429
with ``retry-after-ms`` and ``x-ratelimit-*`` headers (OpenAI) or ``retry-after`` and
``anthropic-ratelimit-*`` headers (Anthropic); every answer carries the headers, so a client
can learn the limits. ``latency`` delays each answer (a model that takes its time).

The "model" is a stateless policy read off the request's conversation:

- the trunk (its first user message is the run's prompt) forks ``children`` children in its
  first call (``agent cI 'child I'``), collects them all in its second (``agent-wait``) and
  replies with the sum of their replies (and again when it is turned back to verify);
- a child (its prompt is ``child I``) makes ``calls`` ral calls, the last one ``reply I``.

With ``resumable``, the trunk reads the conversation as a model would after a resume: a
collection whose result says it did not complete (the control process died during it, and
``resume`` marked it interrupted) is made again, instead of going on to ``reply $total`` with
nothing collected. A scripted provider cannot: it plays its rounds by position
(docs/drills.md, "Resuming a scripted run").

So a run of N children makes N x ``calls`` child requests and about four of the trunk's.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.protocol_servers import anthropic_chunks, openai_chunks

COLLECT = (
    "let ends = agent-wait; "
    "let total = fold { |a, n| add $a $ends[$n][reply] } 0 (keys $ends); reply $total"
)
"""The trunk's fan-in: every child's reply in one call, summed."""
CHILD = re.compile(r"^child (\d+)$")


@dataclass
class TokenBucket:
    rate: float
    burst: float
    level: float = -1.0
    at: float = 0.0

    def take(self, amount: float, now: float) -> float:
        """0.0 if ``amount`` was taken, else the seconds until it could be."""
        if self.level < 0:
            self.level, self.at = self.burst, now
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate

    def reset_in(self) -> float:
        return max(0.0, (self.burst - self.level) / self.rate)


@dataclass
class FleetModel:
    """The server's settings and what it saw."""

    dialect: str = "openai"
    rate: float = 20.0
    burst: float = 10.0
    token_rate: float | None = None
    """Input tokens a second (a request's tokens are its body's bytes over 4); None: no limit."""
    token_burst: float = 0.0
    children: int = 40
    calls: int = 5
    latency: float = 0.0
    headers: bool = True
    """Send the rate-limit headers (False: a server that only ever says 429)."""
    resumable: bool = False
    """Collect again when the collection's result says it was interrupted (see above)."""
    ok: int = 0
    refused: int = 0
    times: list[float] = field(default_factory=list)
    """When each answered (200) request arrived."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.requests = TokenBucket(self.rate, self.burst)
        self.tokens = (
            TokenBucket(self.token_rate, self.token_burst) if self.token_rate is not None else None
        )

    @property
    def total(self) -> int:
        return self.ok + self.refused

    @property
    def refused_share(self) -> float:
        return self.refused / self.total if self.total else 0.0

    # -- the limits ----------------------------------------------------------------------------

    def admit(self, cost: int) -> tuple[float, dict[str, str]]:
        """(seconds to wait, 0.0 if admitted; the rate-limit headers)."""
        with self.lock:
            now = time.monotonic()
            wait = self.requests.take(1, now)
            if wait == 0.0 and self.tokens is not None:
                wait = self.tokens.take(cost, now)
                if wait > 0:  # give the request back: it was not served
                    self.requests.level += 1
            if wait > 0:
                self.refused += 1
            else:
                self.ok += 1
                self.times.append(now)
            return wait, self._headers(wait)

    def _headers(self, wait: float) -> dict[str, str]:
        if not self.headers:
            return {"retry-after-ms": str(math.ceil(wait * 1000))} if wait else {}
        r = self.requests
        if self.dialect == "openai":
            h = {
                "x-ratelimit-limit-requests": str(round(r.rate * 60)),
                "x-ratelimit-remaining-requests": str(int(r.level)),
                "x-ratelimit-reset-requests": f"{math.ceil(r.reset_in() * 1000)}ms",
            }
            if self.tokens is not None:
                t = self.tokens
                h["x-ratelimit-limit-tokens"] = str(round(t.rate * 60))
                h["x-ratelimit-remaining-tokens"] = str(int(t.level))
                h["x-ratelimit-reset-tokens"] = f"{math.ceil(t.reset_in() * 1000)}ms"
            if wait:
                h["retry-after-ms"] = str(math.ceil(wait * 1000))
            return h
        stamp = datetime.fromtimestamp(time.time() + r.reset_in(), UTC).isoformat()
        h = {
            "anthropic-ratelimit-requests-limit": str(round(r.rate * 60)),
            "anthropic-ratelimit-requests-remaining": str(int(r.level)),
            "anthropic-ratelimit-requests-reset": stamp,
        }
        if self.tokens is not None:
            t = self.tokens
            at = datetime.fromtimestamp(time.time() + t.reset_in(), UTC).isoformat()
            h["anthropic-ratelimit-input-tokens-limit"] = str(round(t.rate * 60))
            h["anthropic-ratelimit-input-tokens-remaining"] = str(int(t.level))
            h["anthropic-ratelimit-input-tokens-reset"] = at
        if wait:
            h["retry-after"] = str(max(1, math.ceil(wait)))
        return h

    # -- the model -----------------------------------------------------------------------------

    def answer(self, body: dict[str, Any], cost: int) -> list[bytes]:
        """The reply's chunks; its usage says ``cost`` input tokens, as the limiter counted."""
        usage = (cost, 20)
        texts = _user_texts(body, self.dialect)
        first = texts[0] if texts else ""
        calls_made = _tool_results(body, self.dialect)
        child = CHILD.match(first.strip().split("\n", 1)[0])  # a resume note may follow it
        if child is not None:
            i = int(child.group(1))
            script = f"reply {i}" if calls_made + 1 >= self.calls else f"let x{calls_made} = {i}"
            return self._call(f"call_{calls_made}", script, usage)
        if calls_made == 0:
            script = "; ".join(f"agent c{i} 'child {i}'" for i in range(self.children))
            return self._call("call_spawn", script, usage)
        if self.resumable and not _collected(body, self.dialect):
            return self._call(f"call_wait{calls_made}", COLLECT, usage)
        if calls_made == 1:  # one call collects every child (agent-wait), then replies
            return self._call("call_wait", COLLECT, usage)
        return self._call(f"call_r{calls_made}", "reply $total", usage)

    def _call(self, call_id: str, script: str, usage: tuple[int, int]) -> list[bytes]:
        args = json.dumps({"script": script})
        if self.dialect == "openai":
            return openai_chunks(tool_calls=[(call_id, "ral", args)], usage=usage)
        return anthropic_chunks(tool_calls=[(call_id, "ral", args)], usage=usage)

    def _text(self, text: str, usage: tuple[int, int]) -> list[bytes]:
        if self.dialect == "openai":
            return openai_chunks(text=text, usage=usage)
        return anthropic_chunks(text=text, usage=usage)


def _user_texts(body: dict[str, Any], dialect: str) -> list[str]:
    out: list[str] = []
    for m in body.get("messages") or ():
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "text":
                    out.append(str(block.get("text", "")))
    return out


def _collected(body: dict[str, Any], dialect: str) -> bool:
    """Whether a collection (``call_wait*``) has a result that is not an error or interrupted."""
    for m in body.get("messages") or ():
        if dialect == "openai" and m.get("role") == "tool":
            results = [(str(m.get("tool_call_id")), m.get("content"))]
        elif dialect == "anthropic" and isinstance(m.get("content"), list):
            results = [
                (str(b.get("tool_use_id")), b.get("content"))
                for b in m["content"]
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
        else:
            continue
        for call_id, content in results:
            text = content if isinstance(content, str) else json.dumps(content)
            broken = "[error]" in text[:80] or "interrupted" in text or "cancelled" in text
            if call_id.startswith("call_wait") and not broken:
                return True
    return False


def _tool_results(body: dict[str, Any], dialect: str) -> int:
    n = 0
    for m in body.get("messages") or ():
        if dialect == "openai" and m.get("role") == "tool":
            n += 1
        elif dialect == "anthropic" and isinstance(m.get("content"), list):
            n += sum(
                1 for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"
            )
    return n


@contextmanager
def serving(model: FleetModel) -> Iterator[str]:
    """Serve ``model`` on an ephemeral 127.0.0.1 port; yields the base URL for ``--base-url``
    (``/v1`` appended for the OpenAI dialect). Stopped and joined on exit."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10.0

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            self.close_connection = True
            try:
                request = json.loads(raw)
            except ValueError:  # a client killed mid-send (the kill drills): nobody to answer
                try:
                    self.send_error(400, "torn request body")
                except OSError:
                    pass
                return
            cost = max(1, len(raw) // 4)
            wait, headers = model.admit(cost)
            if wait > 0:
                payload = json.dumps({"error": {"type": "rate_limit_error"}}).encode()
                self.send_response(429)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if model.latency:
                time.sleep(model.latency)
            chunks = model.answer(request, cost)
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-type", "text/event-stream")
            data = b"".join(chunks)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except OSError:
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="fleet-model", daemon=True)
    thread.start()
    host, port = httpd.server_address[:2]
    url = f"http://{host!s}:{port}"
    try:
        yield url + "/v1" if model.dialect == "openai" else url
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5.0)


def main() -> None:
    """``python -m tests.support.fleet_model [--dialect D] [--rate R] ...``: serve until standard
    input closes (for a server inside a network namespace: the Ray tests'); prints the base URL
    on its first line, and what it answered as one JSON line at the end."""
    import argparse
    import sys

    ap = argparse.ArgumentParser()
    ap.add_argument("--dialect", default="openai")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--burst", type=float, default=10.0)
    ap.add_argument("--children", type=int, default=40)
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    model = FleetModel(a.dialect, a.rate, a.burst, children=a.children, calls=a.calls)
    with serving(model) as url:
        print(url, flush=True)
        sys.stdin.read()
    print(json.dumps({"ok": model.ok, "refused": model.refused}), flush=True)


if __name__ == "__main__":
    main()
