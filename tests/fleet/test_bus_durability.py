"""The bus under ``machine`` durability: the group-commit fsync of ``transcript.jsonl`` is
waited for outside the bus lock, and subscribers see an event only once it is durable."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.bus import BusCore
from exarch_actors.runtime.events import Died, InboxRejected, Notice
from exarch_actors.runtime.fleet.inbox import AgentResult
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import read_jsonl
from tests.support.fsyncs import GatedFsync
from tests.support.waiting import HANG_GUARD, wait_for


def test_a_second_producer_publishes_while_the_first_waits_on_the_transcript_fsync(
    tmp_path: Path,
) -> None:
    fsync = GatedFsync()
    files = durability.bind(tmp_path, Durability.MACHINE, fsync=fsync)
    core = BusCore(tmp_path / "transcript.jsonl")
    sub = core.subscribe()
    try:
        first = threading.Thread(target=core.publish, args=(Notice("a", text="one"),))
        first.start()
        assert fsync.entered.wait(HANG_GUARD)  # the first publish waits on a blocked fsync
        second = threading.Thread(target=core.publish, args=(Notice("b", text="two"),))
        second.start()
        wait_for(
            lambda: len(read_jsonl(tmp_path / "transcript.jsonl").records) == 2,
            what="the second producer's record written while the first fsync is blocked",
        )
        assert sub.drain() == []  # neither is durable yet: no subscriber has seen one
        assert first.is_alive() and second.is_alive()
        fsync.release.set()
        first.join(HANG_GUARD)
        second.join(HANG_GUARD)
        assert not first.is_alive() and not second.is_alive()
        assert [e.text for e in sub.drain()] == ["one", "two"]  # type: ignore[attr-defined]
        assert fsync.calls == 2
    finally:
        fsync.release.set()
        core.close()
        durability.unbind(files)


def test_under_process_a_published_event_reaches_subscribers_with_no_fsync(
    tmp_path: Path,
) -> None:
    calls: list[int] = []
    files = durability.bind(tmp_path, Durability.PROCESS, fsync=calls.append)
    core = BusCore(tmp_path / "transcript.jsonl")
    sub = core.subscribe()
    try:
        for i in range(20):
            core.publish(Notice("a", text=str(i)))
        assert [e.text for e in sub.drain()] == [str(i) for i in range(20)]  # type: ignore[attr-defined]
        assert len(read_jsonl(tmp_path / "transcript.jsonl").records) == 20
        assert calls == []
    finally:
        core.close()
        durability.unbind(files)


def _stalled_bus(tmp_path: Path, policy: Durability) -> tuple[Any, Any, threading.Event]:
    """A bus whose actor thread is held in a handler until the returned event is set."""
    from exarch_actors.actors.bus import start_bus

    files = durability.bind(tmp_path, policy)
    bus = start_bus(tmp_path / "transcript.jsonl")
    gate = threading.Event()
    bus.ref.proxy().core.get()  # the actor is up
    bus.ref.tell(_Hold(gate))
    return bus, files, gate


class _Hold:
    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate


@contextlib.contextmanager
def _holding_bus() -> Iterator[threading.Event]:
    """While inside, a ``_Hold`` message parks the bus thread until its gate opens; the Event
    yielded is set once the thread is parked."""
    from exarch_actors.actors.bus import Bus

    held = threading.Event()
    inner = Bus.on_receive

    def on_receive(self: Any, message: Any) -> Any:
        if isinstance(message, _Hold):
            held.set()
            message.gate.wait(HANG_GUARD)
            return None
        return inner(self, message)

    Bus.on_receive = on_receive  # type: ignore[method-assign]
    try:
        yield held
    finally:
        Bus.on_receive = inner  # type: ignore[method-assign]


@contextlib.contextmanager
def _held_process_bus(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A bus under ``process`` whose thread is parked in a handler, and a subscriber: what
    is written meanwhile was written by the producer's own thread."""
    with _holding_bus() as held:
        bus, files, gate = _stalled_bus(tmp_path, Durability.PROCESS)
        sub = bus.subscribe()
        try:
            assert held.wait(HANG_GUARD)
            yield bus, sub
        finally:
            gate.set()
            bus.stop()
            durability.unbind(files)


def test_under_process_a_producer_writes_its_event_itself_while_the_bus_thread_is_busy(
    tmp_path: Path,
) -> None:
    with _held_process_bus(tmp_path) as (bus, sub):
        for i in range(3):
            bus.publish(Notice("a", text=str(i)))
        # written and handed out before publish returned, with the bus thread still held
        assert len(read_jsonl(tmp_path / "transcript.jsonl").records) == 3
        assert [e.text for e in sub.drain()] == ["0", "1", "2"]


def test_under_machine_the_bus_thread_writes_and_the_producer_does_not_wait(
    tmp_path: Path,
) -> None:
    with _holding_bus() as held:
        bus, files, gate = _stalled_bus(tmp_path, Durability.MACHINE)
        try:
            assert held.wait(HANG_GUARD)
            bus.publish(Notice("a", text="queued"))
            assert not (tmp_path / "transcript.jsonl").exists()  # waits for the bus thread
            gate.set()
            wait_for(lambda: (tmp_path / "transcript.jsonl").exists(), what="the bus wrote it")
        finally:
            gate.set()
            bus.stop()
            durability.unbind(files)


def test_a_queued_batch_waits_for_the_bus_thread_and_is_written_before_what_follows_it(
    tmp_path: Path,
) -> None:
    with _held_process_bus(tmp_path) as (bus, sub):
        bus.publish_queued([Notice("w1", text=str(i)) for i in range(3)])
        # queued, not written on the producer's thread (a channel reader's)
        assert read_jsonl(tmp_path / "transcript.jsonl").records == []
        # an inline write after it -- the agent's Died, a rejection -- drains it first
        bus.record_rejected(
            InboxRejected.of(
                "trunk", AgentResult("w1", "v"), reason="inbox full", cap=64, sender="w1"
            )
        )
        bus.publish(Died("w1"))
        records = read_jsonl(tmp_path / "transcript.jsonl").records
        kinds = [r.get("text", r["kind"]) for r in records]
        assert kinds == ["0", "1", "2", "InboxRejected", "Died"]
        assert [getattr(e, "text", e.kind) for e in sub.drain()] == ["0", "1", "2", "Died"]


def test_queueing_never_waits_behind_a_write_in_progress(tmp_path: Path) -> None:
    files = durability.bind(tmp_path, Durability.PROCESS)
    core = BusCore(tmp_path / "transcript.jsonl")
    try:
        with core._lock:  # a writer holds the bus (its write(2) between two GIL turns)
            queued = threading.Thread(target=core.submit, args=(Notice("a", text="q"),))
            queued.start()
            queued.join(HANG_GUARD)
            assert not queued.is_alive(), "queueing waited for the write in progress"
        assert core.drain() == 1
        assert [r["text"] for r in read_jsonl(tmp_path / "transcript.jsonl").records] == ["q"]
    finally:
        core.close()
        durability.unbind(files)


def test_a_drain_whose_write_fails_loses_nothing_and_the_next_writes_it_all_in_order(
    tmp_path: Path,
) -> None:
    """A real failed write: the transcript pointed at ``/dev/full`` (every write ENOSPC)."""
    transcript = tmp_path / "transcript.jsonl"
    core = BusCore(transcript)
    sub = core.subscribe()
    try:
        for i in range(3):
            assert core.submit(Notice("a", text=str(i)))
        core.transcript = Path("/dev/full")
        with pytest.raises(OSError):
            core.publish(Notice("a", text="3"))
        assert core.published == 0 and sub.drain() == []
        core.transcript = transcript
        core.publish(Notice("a", text="4"))
        texts = [r["text"] for r in read_jsonl(transcript).records]
        assert texts == ["0", "1", "2", "4"]  # the failed publish raised to its producer
        assert [e.text for e in sub.drain()] == texts  # type: ignore[attr-defined]
    finally:
        core.transcript = transcript
        core.close()
