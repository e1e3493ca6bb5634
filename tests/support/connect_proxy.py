"""A real forward proxy on 127.0.0.1: ``CONNECT`` tunnels and absolute-URI requests.

A ``CONNECT host:port`` gets ``200 Connection established`` and then bytes relayed both ways
until either side closes (so TLS inside runs end to end: the proxy sees only ciphertext). A
request whose target is an absolute ``http://`` URI is sent on to its origin in origin form and
the answer relayed back. Every request head the proxy reads is recorded (:attr:`heads`), so a
test can see what went through it. With ``require_auth`` a request without that
``Proxy-Authorization`` value gets ``407``.

Every thread is non-daemon and joined by :meth:`ConnectProxy.stop`.
"""

from __future__ import annotations

import select
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Head:
    """A request head as the proxy read it."""

    method: str
    target: str
    headers: dict[str, str]


class ConnectProxy:
    def __init__(self, *, require_auth: str | None = None) -> None:
        self.require_auth = require_auth
        self.heads: list[Head] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> ConnectProxy:
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stop.set()
        while True:
            with self._lock:
                threads = [t for t in self._threads if t.is_alive()]
            if not threads:
                break
            for t in threads:
                t.join()
        self._listener.close()

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, name="connect-proxy")  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(5.0)
            head, rest = _read_head(client)
            if head is None:
                return
            with self._lock:
                self.heads.append(head)
            if self.require_auth and head.headers.get("proxy-authorization") != self.require_auth:
                client.sendall(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'Proxy-Authenticate: Basic realm="test"\r\ncontent-length: 0\r\n\r\n'
                )
                return
            if head.method == "CONNECT":
                host, _, port = head.target.rpartition(":")
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5.0)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
            else:
                url = urlsplit(head.target)
                upstream = socket.create_connection((url.hostname, url.port or 80), timeout=5.0)
                origin = url.path + (f"?{url.query}" if url.query else "")
                lines = [f"{head.method} {origin or '/'} HTTP/1.1"]
                lines += [
                    f"{k}: {v}" for k, v in head.headers.items() if k != "proxy-authorization"
                ]
                upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + rest)
            self._relay(client, upstream)
        except OSError:
            pass
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        while not self._stop.is_set():
            ready, _, _ = select.select([a, b], [], [], 0.05)
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                peers[s].sendall(data)


def _read_head(sock: socket.socket) -> tuple[Head | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(4096)
        if not piece:
            return None, b""
        data += piece
    raw, _, rest = data.partition(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Head(method, target, headers), rest
