"""The one-shot launch listener (``actors/launch_listener.py``): a peer that is not the launched
host is logged and passed over, and the listener goes on to take the real one.

Runs everywhere (no ``ray`` marker, no cluster): real TCP sockets on loopback, the real host's
side of the challenge in a subprocess. Before, the first peer to connect was the only one
tried: garbage sent to the port ended a Ray run with ``RayHostFailed: ... refused a peer
(digest received was wrong)``, a traceback, exit 1 and no ``result.json`` (issue 34)."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator

import pytest

from exarch_actors.actors import launch_listener
from exarch_actors.actors.launch_listener import LaunchAddressRefused, accept_host, open_listener

KEY = bytes(range(32))

HOST_SIDE = """
import socket, sys
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("connected", flush=True)
conn = Connection(sock.detach())
key = bytes.fromhex(sys.argv[3])
answer_challenge(conn, key)
deliver_challenge(conn, key)
conn.send_bytes(b"the real host")
conn.recv_bytes()  # the test's goodbye
"""
"""What a launched host does (``agent_host_connect_main``): connect, answer, challenge back."""


class GaveUp(Exception):
    """The test's ``watch`` ended the wait."""


@pytest.fixture
def server() -> Iterator[socket.socket]:
    with open_listener("127.0.0.1") as s:
        yield s


def _start_host(server: socket.socket, key: bytes = KEY) -> subprocess.Popen[str]:
    """The host's side in a subprocess, returned once its connection is in the backlog."""
    host, port = server.getsockname()[:2]
    p = subprocess.Popen(
        [sys.executable, "-c", HOST_SIDE, host, str(port), key.hex()],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == "connected\n"
    return p


def _reap(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        p.kill()
        p.communicate()


def _never_gives_up() -> None:
    return None


def test_a_peer_sending_garbage_is_refused_logged_and_the_real_host_is_taken_after_it(
    server: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    garbage = socket.create_connection(server.getsockname()[:2])  # first in the backlog
    garbage.sendall(b"\x00\x00\x00\x10GET / HTTP/1.0\r\n\r\n" * 4)
    host = _start_host(server)
    try:
        with caplog.at_level(logging.WARNING, logger=launch_listener.__name__):
            conn = accept_host(server, KEY, "w", _never_gives_up)
        with conn:
            assert conn.recv_bytes() == b"the real host"
            conn.send_bytes(b"bye")
        assert host.wait(30) == 0
    finally:
        garbage.close()
        _reap(host)
    refused = [r.getMessage() for r in caplog.records]
    assert len(refused) == 1, refused
    assert "agent w: refused a peer at 127.0.0.1:" in refused[0]
    assert "still waiting for its host" in refused[0]


def test_a_peer_holding_another_key_is_refused_and_the_real_host_is_taken_after_it(
    server: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    impostor = _start_host(server, key=b"\xff" * 32)
    host = _start_host(server)
    try:
        with caplog.at_level(logging.WARNING, logger=launch_listener.__name__):
            conn = accept_host(server, KEY, "w", _never_gives_up)
        with conn:
            assert conn.recv_bytes() == b"the real host"
            conn.send_bytes(b"bye")
        assert impostor.wait(30) != 0  # refused by the listener, it failed its own side
    finally:
        _reap(impostor, host)
    refused = [r.getMessage() for r in caplog.records]
    assert len(refused) == 1 and "digest received was wrong" in refused[0], refused


def test_a_silent_peer_is_refused_after_the_handshake_timeout_and_the_real_host_is_taken(
    server: socket.socket, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch_listener, "HANDSHAKE_TIMEOUT", 0.2)
    silent = socket.create_connection(server.getsockname()[:2])  # connects, never answers
    host = _start_host(server)
    try:
        with caplog.at_level(logging.WARNING, logger=launch_listener.__name__):
            conn = accept_host(server, KEY, "w", _never_gives_up)
        with conn:
            # the handshake's timeouts are gone: the channel blocks as a pipe does
            view = socket.socket(fileno=conn.fileno())
            try:
                for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                    raw = view.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("ll"))
                    assert struct.unpack("ll", raw) == (0, 0)
            finally:
                view.detach()
            assert conn.recv_bytes() == b"the real host"
            conn.send_bytes(b"bye")
    finally:
        silent.close()
        _reap(host)
    refused = [r.getMessage() for r in caplog.records]
    assert len(refused) == 1 and "agent w: refused a peer" in refused[0], refused


def test_a_refused_peer_never_ends_the_wait_only_watch_does(
    server: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    def give_up() -> None:
        raise GaveUp

    with socket.create_connection(server.getsockname()[:2]) as garbage:
        garbage.sendall(b"garbage")
        with (
            caplog.at_level(logging.WARNING, logger=launch_listener.__name__),
            pytest.raises(GaveUp),
        ):
            accept_host(server, KEY, "w", give_up)
    assert ["refused a peer" in r.getMessage() for r in caplog.records] == [True]


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", ""])
def test_the_listener_refuses_a_wildcard_address(wildcard: str) -> None:
    with pytest.raises(LaunchAddressRefused, match="the node's own address"):
        open_listener(wildcard)


def test_the_listener_is_bound_to_the_node_address_it_was_given(server: socket.socket) -> None:
    assert server.getsockname()[0] == "127.0.0.1"
