"""The bus under ``machine`` durability: the group-commit fsync of ``transcript.jsonl`` is
waited for outside the bus lock, and subscribers see an event only once it is durable."""

from __future__ import annotations

import threading
from pathlib import Path

from actors.bus import BusCore
from runtime import durability
from runtime.durability import Durability
from runtime.durable import read_jsonl
from runtime.events import Notice
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
