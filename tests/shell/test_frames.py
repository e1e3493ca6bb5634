"""Frames: length-prefixed msgpack over a duplex pipe, with typed refusals for bad bytes."""

from __future__ import annotations

import multiprocessing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.actors.frames import (
    KINDS,
    Channel,
    ChannelClosed,
    Frame,
    FrameError,
    UnencodableFrame,
    decode_frame,
    encode_frame,
)

_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(kind=st.sampled_from(sorted(KINDS)), fields=st.dictionaries(st.text(), _plain, max_size=5))
def test_every_frame_kind_round_trips_with_its_fields(kind: str, fields: dict) -> None:
    frame = decode_frame(encode_frame(Frame(kind, fields)))
    assert frame.kind == kind
    assert dict(frame.fields) == fields


def test_an_unknown_kind_is_refused_on_both_sides() -> None:
    with pytest.raises(FrameError, match="unknown frame kind"):
        encode_frame(Frame("teleport", {}))
    import msgpack

    with pytest.raises(FrameError, match="unknown frame kind"):
        decode_frame(msgpack.packb(["teleport", {}]))


def test_garbage_bytes_are_refused_with_a_frame_error_not_a_crash() -> None:
    with pytest.raises(FrameError):
        decode_frame(b"\xc1\xff\x00")
    with pytest.raises(FrameError, match="malformed"):
        decode_frame(b"\x93\x01\x02\x03")


def test_a_closed_peer_reads_as_channel_closed() -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    here, there = Channel(a), Channel(b)
    here.send("run", id=1, source="echo hi")
    assert there.recv() == Frame("run", {"id": 1, "source": "echo hi"})
    there.close()
    with pytest.raises(ChannelClosed):
        here.recv()
    assert here.try_send("cancel", run=1) is False
    here.close()


@given(
    head=st.text(max_size=20),
    tail=st.text(max_size=20),
    surrogate=st.integers(0xD800, 0xDFFF).map(chr),
)
def test_a_lone_surrogate_in_a_field_is_refused_as_an_unencodable_frame_naming_it(
    head: str, tail: str, surrogate: str
) -> None:
    with pytest.raises(UnencodableFrame, match=f"U\\+{ord(surrogate):04X}, a lone surrogate"):
        encode_frame(Frame("run", {"id": 1, "source": head + surrogate + tail}))


def test_a_refused_frame_sends_nothing_and_the_channel_carries_the_next_one() -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    here, there = Channel(a), Channel(b)
    with pytest.raises(UnencodableFrame):
        here.send("run", id=1, source='echo "a\ud800"')
    here.send("run", id=2, source="echo hi")
    assert there.recv() == Frame("run", {"id": 2, "source": "echo hi"})
    here.close()
    there.close()


def test_frames_read_together_are_each_delivered_in_order_and_the_second_needs_no_poll() -> None:
    a, b = multiprocessing.Pipe(duplex=True)
    here, there = Channel(a), Channel(b)
    here.send("notice", program=7)
    here.send("result", value="1")
    assert there.recv() == Frame("notice", {"program": 7})  # one read(2) took both
    assert there.has_frame() and there.poll(0)
    assert there.recv() == Frame("result", {"value": "1"})
    assert not there.has_frame() and not there.poll(0)
    here.close()
    there.close()


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 100_000), min_size=1, max_size=4))  # past the 64 KiB join
def test_bodies_of_any_size_cross_a_channel_whole_and_read_as_connection_writes_them(
    sizes: list[int],
) -> None:
    """The wire is ``Connection``'s: a peer that reads with ``recv_bytes`` gets each body."""
    a, b = multiprocessing.Pipe(duplex=True)
    here, there = Channel(a), Channel(b)
    bodies = [bytes([n % 251]) * n for n in sizes]
    for body in bodies:
        here.send_bytes(body)
        assert b.recv_bytes() == body  # a plain Connection reads the channel's frame
        a.send_bytes(body)
        assert there.recv_bytes() == body  # and the channel reads a Connection's
    here.close()
    there.close()
