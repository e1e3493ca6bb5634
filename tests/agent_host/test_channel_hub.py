"""The channel hub (actors/channel_hub.py): one thread reads many agent-host channels, each in
its own order, and no channel can stall another.

Real duplex pipes (``multiprocessing.Pipe``, Unix sockets) in this process; the hub's thread is
the only reader of the control ends.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from exarch_actors.actors.channel import AgentChannel
from exarch_actors.actors.channel_hub import ChannelHub
from exarch_actors.runtime.fleet.agent_channel import (
    ChannelMessage,
    Envelope,
    PeerGone,
    Ping,
    Pong,
    encode,
)
from tests.support.waiting import HANG_GUARD, wait_for


@pytest.fixture
def hub() -> Iterator[ChannelHub]:
    h = ChannelHub("test-hub")
    try:
        yield h
    finally:
        h.close()


def test_one_hub_thread_reads_twenty_channels_each_in_the_order_it_was_sent(
    hub: ChannelHub,
) -> None:
    seen: dict[int, list[int]] = {k: [] for k in range(20)}
    readers: set[str] = set()
    pairs = [multiprocessing.Pipe(duplex=True) for _ in range(20)]

    def on_notify(k: int) -> Any:
        def note(msg: ChannelMessage) -> None:
            readers.add(threading.current_thread().name)
            assert isinstance(msg, Pong)
            seen[k].append(msg.seq)

        return note

    ctls = [
        AgentChannel(a, peer=f"host {k}", on_notify=on_notify(k)).start(hub=hub)
        for k, (a, _) in enumerate(pairs)
    ]
    hosts = [AgentChannel(b, peer="control").start() for _, b in pairs]
    try:
        for i in range(50):
            for host in hosts:
                host.send(Pong(i, 0))
        wait_for(lambda: all(len(v) == 50 for v in seen.values()), what="every frame read")
        assert all(v == list(range(50)) for v in seen.values())
        assert readers == {"test-hub"}
        assert not any(t.name.startswith("channel-host") for t in threading.enumerate())
    finally:
        for ch in ctls + hosts:
            ch.close()


def test_a_host_stopped_halfway_through_a_frame_stalls_no_other_channel(hub: ChannelHub) -> None:
    stalled_a, stalled_b = multiprocessing.Pipe(duplex=True)
    live_a, live_b = multiprocessing.Pipe(duplex=True)
    got: list[tuple[str, ChannelMessage]] = []
    stalled = AgentChannel(
        stalled_a, peer="stalled", on_notify=lambda m: got.append(("stalled", m))
    ).start(hub=hub)
    live = AgentChannel(live_a, peer="live", on_notify=lambda m: got.append(("live", m))).start(
        hub=hub
    )
    sender = AgentChannel(live_b, peer="control").start()
    try:
        body = encode(Envelope(Pong(7, 0)))
        frame = struct.pack("!i", len(body)) + body
        half = len(frame) // 2
        os.write(stalled_b.fileno(), frame[:half])  # its writer stops here
        sender.send(Pong(1, 0))
        wait_for(lambda: ("live", Pong(1, 0)) in got, what="the live channel's frame")
        assert [name for name, _ in got] == ["live"]
        os.write(stalled_b.fileno(), frame[half:])  # it resumes: its frame arrives whole
        wait_for(lambda: ("stalled", Pong(7, 0)) in got, what="the stalled channel's frame")
    finally:
        stalled.close()
        live.close()
        sender.close()
        stalled_b.close()


def test_the_peer_closing_fails_a_waiting_request_and_the_end_of_file_is_reported_once(
    hub: ChannelHub,
) -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    eofs: list[str] = []
    host = AgentChannel(b, peer="control", on_request=lambda env: host.close()).start()
    ctl = AgentChannel(a, peer="host", on_eof=eofs.append).start(hub=hub)
    try:
        with pytest.raises(PeerGone, match="host closed the channel before answering ping"):
            ctl.request(Ping(1), timeout=10)
        assert ctl.closed.wait(HANG_GUARD)
        assert len(eofs) == 1
    finally:
        ctl.close()
        host.close()


def test_a_channel_closed_by_its_own_callback_on_the_hub_ends_once_and_the_hub_reads_on(
    hub: ChannelHub,
) -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    c, d = multiprocessing.Pipe(duplex=True)
    eofs: list[str] = []
    after: list[ChannelMessage] = []
    closing = AgentChannel(
        a, peer="closing", on_notify=lambda m: closing.close(), on_eof=eofs.append
    ).start(hub=hub)
    other = AgentChannel(c, peer="other", on_notify=after.append).start(hub=hub)
    peer_b = AgentChannel(b, peer="control").start()
    peer_d = AgentChannel(d, peer="control").start()
    try:
        peer_b.send(Pong(1, 0))
        assert closing.closed.wait(HANG_GUARD)
        peer_d.send(Pong(2, 0))
        wait_for(lambda: after == [Pong(2, 0)], what="the other channel read after the close")
        assert eofs == ["closed locally"]
    finally:
        for ch in (closing, other, peer_b, peer_d):
            ch.close()


def test_a_closed_hub_takes_no_more_channels(hub: ChannelHub) -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    first = AgentChannel(a, peer="first").start(hub=hub)
    first.close()
    b.close()
    hub.close()
    c, d = multiprocessing.Pipe(duplex=True)
    try:
        with pytest.raises(RuntimeError, match="closed"):
            AgentChannel(c, peer="late").start(hub=hub)
    finally:
        c.close()
        d.close()


def test_a_read_that_raises_ends_that_channel_alone_and_the_hub_reads_on(hub: ChannelHub) -> None:
    class Broken:
        """A channel whose read has a bug (never a peer's bytes: those are typed refusals)."""

        peer = "broken"

        def __init__(self) -> None:
            self.mine, self.theirs = socket.socketpair()
            self.ended = threading.Event()

        def fileno(self) -> int:
            return self.mine.fileno()

        def pump(self) -> bool:
            raise RuntimeError("a bug in the read")

        def finish_pumped(self) -> None:
            self.ended.set()

        def lost_before_read(self, detail: str) -> None:
            self.ended.set()

    broken = Broken()
    a, b = multiprocessing.Pipe(duplex=True)
    got: list[ChannelMessage] = []
    live = AgentChannel(a, peer="live", on_notify=got.append).start(hub=hub)
    sender = AgentChannel(b, peer="control").start()
    try:
        hub.add(broken)
        broken.theirs.send(b"x")  # readable: its read raises
        assert broken.ended.wait(HANG_GUARD)
        sender.send(Pong(3, 0))
        wait_for(lambda: got == [Pong(3, 0)], what="the live channel read after the broken one")
    finally:
        live.close()
        sender.close()
        broken.mine.close()
        broken.theirs.close()
