"""The fleet bus: durable transcript, fan-out, slow subscribers, rejected records."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exarch_actors.actors.bus import Bus, BusCore, BusHandle, Publish, start_bus
from exarch_actors.runtime.events import (
    Born,
    Died,
    InboxRejected,
    Io,
    Notice,
    Overflow,
    ProviderFailed,
    Resources,
    SystemNote,
)
from exarch_actors.runtime.fleet.inbox import AgentResult
from exarch_actors.runtime.state.durable import read_jsonl


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[BusHandle]:
    handle = start_bus(tmp_path / "transcript.jsonl")
    try:
        yield handle
    finally:
        handle.stop()


def test_every_event_kind_lands_in_the_transcript_with_kind_agent_and_at(
    bus: BusHandle, tmp_path: Path
) -> None:
    events = [
        Born("c", parent="trunk", returns=True, fuel=2),
        Died("c", outcome="replied"),
        Notice("c", notice="Reap", text="worker w1 reaped"),
        Io("c", call_id="t1", script="echo hi", stdout="hi\n"),
        Resources("c", rows=(("inbox user", 0),), card="..."),
        ProviderFailed("c", error="rate_limit", message="429"),
        SystemNote("c", text="disk above ceiling"),
    ]
    for event in events:
        bus.publish(event)
    bus.flush()
    records = read_jsonl(tmp_path / "transcript.jsonl").records
    assert [r["kind"] for r in records] == [
        "Born",
        "Died",
        "Notice",
        "Io",
        "Resources",
        "ProviderError",
        "SystemNote",
    ]
    assert all(r["agent"] == "c" and r["at"].endswith("Z") for r in records)
    assert records[2]["notice"] == "Reap" and records[0]["parent"] == "trunk"


def test_a_slow_subscriber_never_blocks_the_producer_and_gets_an_explicit_overflow_record(
    bus: BusHandle, tmp_path: Path
) -> None:
    slow = bus.subscribe(capacity=4, name="slow")
    fast = bus.subscribe(capacity=1000, name="fast")
    for i in range(100):  # a producer blocked on the full subscriber would hang here
        bus.publish(Notice("a", notice="Tick", text=str(i)))
    bus.flush()
    got_fast = fast.drain()
    assert [e.text for e in got_fast if isinstance(e, Notice)] == [str(i) for i in range(100)]
    got_slow = slow.drain()
    assert [e.text for e in got_slow if isinstance(e, Notice)] == ["0", "1", "2", "3"]
    assert isinstance(got_slow[-1], Overflow) and got_slow[-1].missed == 96
    assert slow.missed_total == 96
    assert len(read_jsonl(tmp_path / "transcript.jsonl").records) == 100  # nothing lost there


def test_the_overflow_record_sits_where_the_gap_was_once_the_subscriber_catches_up(
    bus: BusHandle,
) -> None:
    sub = bus.subscribe(capacity=2)
    for i in range(5):
        bus.publish(Notice("a", text=str(i)))
    bus.flush()
    assert [getattr(e, "text", None) for e in [sub.get(0), sub.get(0)]] == ["0", "1"]
    bus.publish(Notice("a", text="5"))
    bus.flush()
    tail = sub.drain()
    assert isinstance(tail[0], Overflow) and tail[0].missed == 3
    assert isinstance(tail[1], Notice) and tail[1].text == "5"


def test_record_rejected_writes_straight_to_the_transcript_and_not_to_subscribers(
    bus: BusHandle, tmp_path: Path
) -> None:
    sub = bus.subscribe()
    rejected = InboxRejected.of(
        "trunk", AgentResult("c9", "value"), reason="inbox full", cap=64, sender="c9"
    )
    bus.record_rejected(rejected)
    records = read_jsonl(tmp_path / "transcript.jsonl").records
    assert records[0]["kind"] == "InboxRejected" and records[0]["agent"] == "trunk"
    assert records[0]["message"]["child"] == "c9" and records[0]["cap"] == 64
    assert sub.get(0) is None


def test_a_stalled_bus_never_blocks_producers_and_loses_or_reorders_nothing(tmp_path: Path) -> None:
    gate, entered, left = threading.Event(), threading.Event(), threading.Event()

    class StalledCore(BusCore):
        def drain(self) -> int:
            if threading.current_thread().name.startswith("Bus-") and not gate.is_set():
                entered.set()
                gate.wait(30)  # the bus thread is stuck; producers must not be
                left.set()
            return super().drain()

    core = StalledCore(tmp_path / "transcript.jsonl")
    handle = BusHandle(Bus.start(core), core)
    try:
        handle.publish(Notice("a", text="first"))
        assert entered.wait(5)
        for i in range(300):  # 64 wait for the bus; then each producer writes the backlog
            handle.publish(Notice("a", text=str(i)))
        handle.ref.proxy().publish(Notice("a", text="via proxy")).get(timeout=5)
        assert not left.is_set(), "the producers waited for the stalled bus thread"
        gate.set()
    finally:
        gate.set()
        handle.stop()
    texts = [r["text"] for r in read_jsonl(tmp_path / "transcript.jsonl").records]
    assert texts == ["first", *map(str, range(300)), "via proxy"]


def test_concurrent_producers_each_keep_their_own_order(bus: BusHandle, tmp_path: Path) -> None:
    sub = bus.subscribe(capacity=10_000)

    def produce(agent: str) -> None:
        bus.publish(Born(agent))
        for i in range(50):
            bus.publish(Notice(agent, text=str(i)))
        bus.publish(Died(agent))

    threads = [threading.Thread(target=produce, args=(f"p{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bus.flush()
    records = read_jsonl(tmp_path / "transcript.jsonl").records
    seen = [(e.kind, e.agent) for e in sub.drain()]
    assert seen == [(r["kind"], r["agent"]) for r in records]  # one order for all readers
    for k in range(4):
        mine = [r for r in records if r["agent"] == f"p{k}"]
        assert mine[0]["kind"] == "Born" and mine[-1]["kind"] == "Died"
        assert [r["text"] for r in mine[1:-1]] == [str(i) for i in range(50)]


def test_publishes_queued_when_the_bus_stops_still_reach_the_transcript(tmp_path: Path) -> None:
    handle = start_bus(tmp_path / "t.jsonl")
    for i in range(50):
        handle.ref.tell(Publish(Notice("a", text=str(i))))
    handle.stop()
    assert len(read_jsonl(tmp_path / "t.jsonl").records) == 50
