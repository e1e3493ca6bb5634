"""The one-shot launch listener: where an agent host a Ray node forked connects back to the driver.

:meth:`actors.ray_backend.RayBackend.launch` opens one listener per launch (:func:`open_listener`)
and takes from it the first peer that proves it holds the launch's random key
(:func:`accept_host`); the host does the same of the driver (``multiprocessing``'s HMAC
challenge, both ways). What this authenticates and what it does not: docs/scale-out.md.

Invariants:
- The listener is bound to the node's own address, never to a wildcard (``0.0.0.0``, ``::``):
  :class:`LaunchAddressRefused` rather than a port every interface answers on.
- A peer that fails the challenge -- garbage, a wrong key, silence for :data:`HANDSHAKE_TIMEOUT`,
  a closed connection -- is logged, closed and passed over: the listener keeps waiting for the
  real host. One bad connection ended the whole run before (``RayHostFailed``, exit 1, no
  ``result.json``; issue 34).
- Only the caller's ``watch`` ends the wait (the host ended, its time is up): a refused peer
  never does.
- The handshake's reads and writes are bounded by socket timeouts, removed once it succeeds:
  the channel after it blocks as a pipe does.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from exarch_actors.runtime.errors import ExarchError

log = logging.getLogger(__name__)

ACCEPT_POLL = 0.05
"""Seconds between looks at whether the host ended before it connected back (``watch``)."""

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a connected peer may take over each read or write of the key challenge before it is
refused (a hang guard: the real host answers in milliseconds; a silent peer must not hold the
listener while the real host waits behind it in the backlog)."""


class LaunchAddressRefused(ExarchError):
    """The address to listen on for a launched host is a wildcard, not one node address."""


def open_listener(host: str) -> socket.socket:
    """A TCP listener on ``host`` (the node's address), any free port, polled every
    :data:`ACCEPT_POLL`; :class:`LaunchAddressRefused` for a wildcard address."""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = not host  # a host name: resolved by the bind, "" is every interface
    if unspecified:
        raise LaunchAddressRefused(
            f"the launch listener must bind the node's own address, not {host!r}"
        )
    server = socket.create_server((host, 0))
    server.settimeout(ACCEPT_POLL)
    return server


def accept_host(
    server: socket.socket, key: bytes, name: str, watch: Callable[[], None]
) -> Connection:
    """The first connection to ``server`` that passes the key challenge both ways, as a
    channel-ready :class:`Connection` (TCP_NODELAY, blocking). Every other peer is logged and
    closed. ``watch`` is called between polls and after each refused peer; it raises to give
    up (the host ended, or its time is up)."""
    while True:
        try:
            sock, peer = server.accept()
        except TimeoutError:
            watch()
            continue
        try:
            return _handshake(sock, key)
        except Exception as e:  # garbage, a wrong key, silence, a reset: never the real host
            cause = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.warning(
                "agent %s: refused a peer at %s (%s); still waiting for its host",
                name, _address(peer), cause,
            )  # fmt: skip
        watch()


def _handshake(sock: socket.socket, key: bytes) -> Connection:
    sock.settimeout(None)
    # Without it a frame written right after another (a Publish batch, then a Call) waits for
    # the peer's delayed ACK: 45 ms a ral call against 0.9 ms locally (Nagle's rule).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _bound_io(sock, HANDSHAKE_TIMEOUT)
    conn = Connection(sock.detach())
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        view = socket.socket(fileno=conn.fileno())
        try:
            _bound_io(view, 0.0)
        finally:
            view.detach()  # the Connection keeps the descriptor
    except BaseException:
        conn.close()
        raise
    return conn


def _bound_io(sock: socket.socket, seconds: float) -> None:
    """Kernel timeouts on a blocking socket's reads and writes (0: none): a read that waits
    longer fails with EAGAIN, which ``Connection`` raises as an ``OSError``."""
    whole = int(seconds)
    tv = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _address(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
