"""One commit per call (runtime/state/durability.py's ``one_commit``): under ``machine`` the
records of a block are written at once and their fsyncs, one per file, run together at the
block's end; nothing in the block is acknowledged before that end."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import append_jsonl, read_jsonl
from tests.support.fsyncs import CountingFsync, GatedFsync
from tests.support.waiting import HANG_GUARD


@pytest.fixture
def bound() -> Iterator[list[durability.DurableFiles]]:
    held: list[durability.DurableFiles] = []
    yield held
    for files in held:
        durability.unbind(files)


def _bind(
    held: list[durability.DurableFiles], root: Path, policy: Durability, fsync: object
) -> durability.DurableFiles:
    files = durability.bind(root, policy, fsync=fsync)  # type: ignore[arg-type]
    held.append(files)
    return files


def test_a_block_fsyncs_each_file_it_appended_to_once_for_all_its_records(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    paths = [tmp_path / f"{name}.jsonl" for name in ("record", "events", "transcript")]
    with durability.one_commit():
        for i in range(5):
            for p in paths:
                append_jsonl(p, {"kind": "x", "i": i})
        assert fsync.calls == 0  # written, left to the block's end
    assert fsync.calls == 3
    assert sorted(fsync.sizes) == sorted(p.stat().st_size for p in paths)  # each covered whole
    assert all(len(read_jsonl(p).records) == 5 for p in paths)


def test_nothing_in_a_block_is_acknowledged_before_its_fsyncs_end(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = GatedFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    written = threading.Event()
    acknowledged = threading.Event()

    def call() -> None:
        with durability.one_commit():
            append_jsonl(tmp_path / "record.jsonl", {"kind": "Commit"})
            append_jsonl(tmp_path / "events.jsonl", {"kind": "tool_result"})
            written.set()
        acknowledged.set()

    t = threading.Thread(target=call, daemon=True)
    t.start()
    try:
        assert written.wait(HANG_GUARD)
        assert fsync.entered.wait(HANG_GUARD)  # the block's end is waiting on the disk
        assert b"Commit" in (tmp_path / "record.jsonl").read_bytes()
        assert not acknowledged.is_set() and t.is_alive()
    finally:
        fsync.release.set()
        t.join(HANG_GUARD)
    assert acknowledged.is_set() and fsync.calls == 2


def test_the_fsyncs_of_a_blocks_files_are_issued_together(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    both_inside = threading.Barrier(2, timeout=HANG_GUARD)

    def fsync(fd: int) -> None:  # passes only when two fsyncs are in progress at once
        both_inside.wait()
        os.fsync(fd)

    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    with durability.one_commit():
        append_jsonl(tmp_path / "record.jsonl", {"kind": "Commit"})
        append_jsonl(tmp_path / "events.jsonl", {"kind": "tool_result"})
    assert not both_inside.broken


def test_an_append_marked_each_acknowledged_inside_a_block_waits_for_its_own_fsync(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    journal = tmp_path / "spawn-journal.jsonl"
    with durability.one_commit():
        append_jsonl(tmp_path / "events.jsonl", {"kind": "before"})
        with durability.each_acknowledged():
            append_jsonl(journal, {"kind": "spawned"})
            assert fsync.calls == 1 and fsync.sizes == [journal.stat().st_size]
        append_jsonl(tmp_path / "events.jsonl", {"kind": "after"})
        assert fsync.calls == 1
    assert fsync.calls == 2  # events.jsonl's, once, at the block's end


def test_a_block_whose_body_raises_still_makes_its_records_durable(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    with pytest.raises(RuntimeError, match="the call failed"), durability.one_commit():
        append_jsonl(tmp_path / "record.jsonl", {"kind": "Commit"})
        raise RuntimeError("the call failed")
    assert fsync.calls == 1 and fsync.sizes == [(tmp_path / "record.jsonl").stat().st_size]


def test_a_block_under_process_calls_no_fsync(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.PROCESS, fsync)
    with durability.one_commit():
        append_jsonl(tmp_path / "record.jsonl", {"kind": "Commit"})
    assert (tmp_path / "record.jsonl").exists() and fsync.calls == 0
