"""The agent-host channel protocol: the codec round-trips every message, bad bytes are typed
errors, and requests end in exactly one of a reply, a reported timeout or ``PeerGone``.

The I/O tests run two :class:`AgentChannel` ends over a real duplex pipe in this process.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.actors.channel import AgentChannel
from exarch_actors.runtime.fleet.agent_channel import (
    BY_KIND,
    MESSAGE_TYPES,
    CancelFrame,
    ChannelMessage,
    ChannelProtocolError,
    Correlator,
    Envelope,
    PeerGone,
    Ping,
    Pong,
    ReplyTimeout,
    RunScript,
    decode,
    encode,
)
from tests.support.waiting import HANG_GUARD, wait_for

# -- the codec --------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_natives = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _value_for(annotation: str) -> st.SearchStrategy[Any]:
    """A strategy for one field, from its annotation string (``from __future__`` annotations)."""
    optional = "| None" in annotation
    base = annotation.replace(" | None", "")
    strat: st.SearchStrategy[Any]
    if base == "str":
        strat = st.text(max_size=30)
    elif base == "int":
        strat = st.integers(min_value=-(2**63), max_value=2**63 - 1)
    elif base == "bool":
        strat = st.booleans()
    elif base == "bytes":
        strat = st.binary(max_size=64)
    elif base.startswith("tuple[dict"):
        strat = st.lists(
            st.dictionaries(st.text(max_size=8), _natives, max_size=3), max_size=3
        ).map(tuple)
    elif base.startswith("dict"):
        strat = st.dictionaries(st.text(max_size=8), _natives, max_size=4)
    elif base == "Any":
        strat = _natives
    else:  # pragma: no cover - a new field type must get a strategy here
        raise AssertionError(f"no strategy for {annotation}")
    return st.none() | strat if optional else strat


def _message_strategy(cls: type[ChannelMessage]) -> st.SearchStrategy[ChannelMessage]:
    fields = {f.name: _value_for(str(f.type)) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


messages = st.one_of(*(_message_strategy(t) for t in MESSAGE_TYPES))
ids = st.none() | st.integers(min_value=0, max_value=2**63 - 1)


@pytest.mark.slow
@settings(max_examples=400)
@given(msg=messages, rid=ids, reply_to=ids)
def test_every_message_survives_encode_then_decode_unchanged(
    msg: ChannelMessage, rid: int | None, reply_to: int | None
) -> None:
    env = Envelope(msg, rid, reply_to)
    assert decode(encode(env)) == env


def test_every_message_type_has_its_own_kind() -> None:
    assert sorted(BY_KIND) == sorted(t.KIND for t in MESSAGE_TYPES)
    assert len(BY_KIND) == len(MESSAGE_TYPES)


@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_decode_to_a_message_or_a_protocol_error_and_nothing_else(
    data: bytes,
) -> None:
    try:
        decode(data)
    except ChannelProtocolError:
        pass


@pytest.mark.parametrize(
    ("frame", "named"),
    [
        (["nope", None, None, {}], "unknown message kind 'nope'"),
        (["ping", None, None], "malformed frame"),
        (["ping", "7", None, {}], "id must be an integer"),
        (["ping", None, None, {"seq": 1, "extra": 2}], "fields do not match"),
        (["cancel", None, None, {}], "fields do not match"),
    ],
)
def test_a_malformed_frame_is_a_protocol_error_that_names_what_is_wrong(
    frame: list[Any], named: str
) -> None:
    with pytest.raises(ChannelProtocolError, match=named):
        decode(msgpack.packb(frame))


def test_a_field_that_msgpack_cannot_carry_is_a_protocol_error_at_encode() -> None:
    with pytest.raises(ChannelProtocolError, match="not msgpack-native"):
        encode(Envelope(RunScript(object())))  # type: ignore[arg-type]


# -- correlation ------------------------------------------------------------------------------


def test_a_reply_after_its_deadline_is_counted_late_and_never_matches_a_newer_request() -> None:
    c = Correlator()
    first = c.open("run", now=0.0, timeout=1.0)
    assert c.expire(now=1.0) == [(first, "run")]
    second = c.open("run", now=1.0, timeout=1.0)
    assert second != first
    assert c.close(first) is False
    assert c.late == 1
    assert c.close(second) is True
    assert c.pending() == {}


@given(
    st.lists(
        st.tuples(st.floats(0, 10), st.sampled_from(["reply", "expire", "drain"])), max_size=30
    )
)
def test_every_request_leaves_the_table_exactly_once(steps: list[tuple[float, str]]) -> None:
    c = Correlator()
    opened: list[int] = []
    left: list[int] = []
    now = 0.0
    for dt, action in steps:
        now += dt
        opened.append(c.open("x", now, timeout=2.0))
        if action == "reply":
            rid = opened[len(opened) // 2]
            if c.close(rid):
                left.append(rid)
        elif action == "expire":
            left.extend(rid for rid, _ in c.expire(now))
        else:
            left.extend(rid for rid, _ in c.drain())
    left.extend(rid for rid, _ in c.drain())
    assert sorted(left) == sorted(opened)


@given(st.lists(st.booleans(), min_size=1, max_size=400))
def test_answered_requests_leave_no_deadlines_behind_and_the_open_ones_still_expire(
    answered: list[bool],
) -> None:
    c = Correlator()
    kept: list[int] = []
    for i, answer in enumerate(answered):
        rid = c.open("call", now=float(i), timeout=1000.0)
        if answer:
            assert c.close(rid) is True
        else:
            kept.append(rid)
        assert len(c._deadlines) <= 2 * len(kept) + 65  # bounded by the open requests
    assert c.next_deadline() == (None if not kept else 1000.0 + answered.index(False))
    assert sorted(rid for rid, _ in c.expire(now=1e9)) == kept


# -- the I/O side over a real pipe ------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[Any, Any]]:
    a, b = multiprocessing.Pipe(duplex=True)
    yield a, b


def test_a_control_frame_reaches_its_callback_while_the_request_handler_is_still_busy(
    pair: Any,
) -> None:
    a, b = pair
    busy = threading.Event()
    release = threading.Event()
    seen: list[ChannelMessage] = []
    got_cancel = threading.Event()
    worker_threads: list[threading.Thread] = []

    def slow_request(env: Envelope) -> None:
        def work() -> None:
            busy.set()
            release.wait(10)
            host.reply(env.id or 0, Pong(0, 0))

        t = threading.Thread(target=work, daemon=True)
        worker_threads.append(t)
        t.start()

    def control(msg: ChannelMessage) -> None:
        seen.append(msg)
        got_cancel.set()

    host = AgentChannel(b, peer="control", on_request=slow_request, on_control=control).start()
    ctl = AgentChannel(a, peer="host").start()
    try:
        answer: list[ChannelMessage] = []
        asker = threading.Thread(target=lambda: answer.append(ctl.request(Ping(1), timeout=10)))
        asker.start()
        assert busy.wait(10)
        ctl.send(CancelFrame("a", "stop"))
        assert got_cancel.wait(10)
        assert seen == [CancelFrame("a", "stop")]
        assert not answer  # the request is still in flight
        release.set()
        asker.join(10)
        assert answer == [Pong(0, 0)]
    finally:
        release.set()
        ctl.close()
        host.close()
        for t in worker_threads:
            t.join(5)


def test_a_request_without_a_reply_raises_reply_timeout_and_the_late_reply_is_counted(
    pair: Any,
) -> None:
    a, b = pair
    held: list[Envelope] = []

    def handle(env: Envelope) -> None:
        if isinstance(env.message, Ping) and env.message.seq == 5:
            held.append(env)  # answered only after the requester gave up
        else:
            host.reply(env.id or 0, Pong(6, 0))

    host = AgentChannel(b, peer="control", on_request=handle).start()
    ctl = AgentChannel(a, peer="agent host t").start()
    try:
        with pytest.raises(ReplyTimeout, match="agent host t did not answer ping"):
            ctl.request(Ping(5), timeout=0.05)
        assert ctl.timeouts == 1
        wait_for(lambda: held, what="the host to receive the request")
        host.reply(held[0].id or 0, Pong(5, 0))
        # the late reply is not taken for the next request's answer
        assert ctl.request(Ping(6), timeout=10) == Pong(6, 0)
        assert ctl.late_replies == 1
    finally:
        ctl.close()
        host.close()


def test_a_handler_that_raises_is_answered_with_failed_naming_the_error(pair: Any) -> None:
    a, b = pair

    def broken(env: Envelope) -> None:
        raise KeyError("boom")

    host = AgentChannel(b, peer="control", on_request=broken).start()
    ctl = AgentChannel(a, peer="host").start()
    try:
        reply = ctl.request(Ping(1), timeout=10)
    finally:
        ctl.close()
        host.close()
    assert reply.KIND == "failed"
    assert reply.error == "KeyError"  # type: ignore[attr-defined]


def test_the_peer_closing_fails_a_waiting_request_with_peer_gone_and_reports_end_of_file(
    pair: Any,
) -> None:
    a, b = pair
    eofs: list[str] = []
    host = AgentChannel(b, peer="control", on_request=lambda env: host.close()).start()
    ctl = AgentChannel(a, peer="host", on_eof=eofs.append).start()
    try:
        with pytest.raises(PeerGone, match="host closed the channel before answering ping"):
            ctl.request(Ping(1), timeout=10)
        assert ctl.closed.wait(10)
        assert len(eofs) == 1
        with pytest.raises(PeerGone):
            ctl.request(Ping(2), timeout=10)
    finally:
        ctl.close()
        host.close()


def test_an_undecodable_frame_is_counted_and_the_reader_carries_on(pair: Any) -> None:
    a, b = pair
    bad: list[ChannelProtocolError] = []
    host = AgentChannel(
        b,
        peer="control",
        on_request=lambda env: host.reply(env.id or 0, Pong(7, 0)),
        on_bad_frame=bad.append,
    ).start()
    ctl = AgentChannel(a, peer="host").start()
    try:
        a.send_bytes(b"\xc1garbage")
        assert ctl.request(Ping(7), timeout=10) == Pong(7, 0)
    finally:
        ctl.close()
        host.close()
    assert host.bad_frames == 1 and len(bad) == 1


@given(
    source=st.text(max_size=12),
    cap=st.integers(min_value=0, max_value=10_000),
    total=st.booleans(),
    recipient=st.none() | st.text(max_size=12),
)
def test_a_typed_refusal_crosses_a_process_boundary_as_itself_with_its_fields(
    source: str, cap: int, total: bool, recipient: str | None
) -> None:
    import pickle

    from exarch_actors.runtime.errors import InboxFull, SpawnFailed

    full = InboxFull(source, cap, total=total, recipient=recipient)
    back = pickle.loads(pickle.dumps(full))
    assert type(back) is InboxFull and str(back) == str(full)
    assert (back.source, back.cap, back.total, back.recipient) == (source, cap, total, recipient)
    failed = pickle.loads(pickle.dumps(SpawnFailed("w1", full)))
    assert type(failed) is SpawnFailed and str(failed) == str(SpawnFailed("w1", full))
    assert isinstance(failed.cause, InboxFull) and failed.cause.cap == cap


def test_a_request_sent_without_waiting_calls_back_with_its_reply_and_one_cut_by_an_end_of_file_with_peer_gone(  # noqa: E501
    pair: Any,
) -> None:
    a, b = pair
    held: list[Envelope] = []

    def handle(env: Envelope) -> None:
        if isinstance(env.message, Ping) and env.message.seq == 1:
            host.reply(env.id or 0, Pong(1, 0))
        else:
            held.append(env)  # never answered: the host closes instead

    host = AgentChannel(b, peer="control", on_request=handle).start()
    ctl = AgentChannel(a, peer="host").start()
    got: list[tuple[ChannelMessage | None, BaseException | None]] = []
    try:
        ctl.begin(Ping(1), timeout=10, then=lambda r, e: got.append((r, e)))
        wait_for(lambda: got, HANG_GUARD, "the answered request's callback")
        assert got == [(Pong(1, 0), None)]
        ctl.begin(Ping(2), timeout=10, then=lambda r, e: got.append((r, e)))
        wait_for(lambda: held, HANG_GUARD, "the host to receive the second request")
        host.close()
        wait_for(lambda: len(got) == 2, HANG_GUARD, "the cut request's callback")
        reply, error = got[1]
        assert reply is None and isinstance(error, PeerGone)
    finally:
        ctl.close()
        host.close()
