"""The two durability policies of an appended record (runtime/state/durability.py): what each
acknowledgement means, group commit under ``machine``, no lock across an fsync, open files."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import AppendFile, Durability, DurabilityConflict
from exarch_actors.runtime.state.durable import append_jsonl, atomic_write_bytes, read_jsonl
from exarch_actors.runtime.state.eventlog import AgentLog
from exarch_actors.runtime.state.journal import SpawnJournal
from tests.support.fsyncs import CountingFsync, GatedFsync
from tests.support.waiting import HANG_GUARD, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[list[durability.DurableFiles]]:
    """Bind directories in a test and unbind every one after it (files closed)."""
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


def _thread(target: object, *args: object) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
    t.start()
    return t


# --------------------------------------------------------------------------- process


def test_under_process_no_record_append_or_whole_file_write_calls_fsync(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.PROCESS, fsync)
    for i in range(50):
        append_jsonl(tmp_path / "a.jsonl", {"kind": "x", "i": i})
    atomic_write_bytes(tmp_path / "result.json", b"{}")
    assert fsync.calls == 0
    assert [r["i"] for r in read_jsonl(tmp_path / "a.jsonl").records] == list(range(50))


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from exarch_actors.runtime.state import durability
    from exarch_actors.runtime.state.durable import append_jsonl

    def no_fsync(fd):
        raise SystemExit("an fsync under process")

    root = Path(sys.argv[1])
    durability.bind(root, durability.Durability.PROCESS, fsync=no_fsync)
    i = 0
    while True:
        append_jsonl(root / "events.jsonl", {"kind": "x", "i": i, "pad": "p" * (i % 300)})
        sys.stdout.write(f"{i}\\n")  # acknowledged: the append returned
        sys.stdout.flush()
        i += 1
    """
)


def test_a_record_acknowledged_under_process_survives_a_sigkill_of_the_writing_process(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    acked = -1
    try:
        while acked < 2000:  # mid-stream: the writer is still appending when it is killed
            line = proc.stdout.readline()
            assert line, "the writer ended before it was killed"
            acked = int(line)
        proc.send_signal(signal.SIGKILL)
        acked = max([acked, *(int(x) for x in proc.stdout.read().split())])
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    read = read_jsonl(tmp_path / "events.jsonl")
    assert read.inner_damage == []
    seen = [r["i"] for r in read.records]
    assert seen[: acked + 1] == list(range(acked + 1))  # every acknowledged record, in order


# --------------------------------------------------------------------------- machine


def test_under_machine_an_acknowledged_record_lies_within_a_completed_fsync(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    path = tmp_path / "t.jsonl"
    for i in range(20):
        append_jsonl(path, {"kind": "x", "id": f"rec-{i}"})
        synced = path.read_bytes()[: max(fsync.sizes)]
        assert f'"rec-{i}"'.encode() in synced  # acknowledged only once an fsync covered it


def test_group_commit_covers_every_record_that_arrived_during_an_fsync_with_one_more_fsync(
    tmp_path: Path,
) -> None:
    fsync = GatedFsync()
    f = AppendFile(tmp_path / "t.jsonl", Durability.MACHINE, fsync=fsync)
    try:
        leader = _thread(f.append, b'{"kind": "first"}\n')
        assert fsync.entered.wait(HANG_GUARD)
        writers = [_thread(f.append, f'{{"kind": "w", "n": {n}}}\n'.encode()) for n in range(8)]
        wait_for(lambda: f.records == 9, what="every writer's record written during the fsync")
        assert fsync.calls == 0 and all(w.is_alive() for w in writers)  # none acknowledged yet
        fsync.release.set()
        for t in [leader, *writers]:
            t.join(HANG_GUARD)
            assert not t.is_alive()
        assert f.records == 9
        assert fsync.calls == 2  # the leader's, and one that covered all eight others
        assert fsync.sizes[-1] == (tmp_path / "t.jsonl").stat().st_size
    finally:
        fsync.release.set()
        f.close()


def test_concurrent_writers_under_machine_cost_fewer_fsyncs_than_records(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    files = _bind(bound, tmp_path, Durability.MACHINE, fsync)
    path = tmp_path / "transcript.jsonl"
    started = threading.Barrier(8)

    def writer(w: int) -> None:
        started.wait(HANG_GUARD)
        for i in range(40):
            append_jsonl(path, {"kind": "x", "w": w, "i": i})

    threads = [_thread(writer, w) for w in range(8)]
    for t in threads:
        t.join(HANG_GUARD * 3)
        assert not t.is_alive()
    records = read_jsonl(path).records
    assert len(records) == files.records == 320
    for w in range(8):  # each writer's records in its own order
        assert [r["i"] for r in records if r["w"] == w] == list(range(40))
    assert 0 < fsync.calls < 320


def test_a_second_writer_appends_while_a_slow_fsync_is_in_progress(tmp_path: Path) -> None:
    fsync = GatedFsync()
    f = AppendFile(tmp_path / "t.jsonl", Durability.MACHINE, fsync=fsync)
    try:
        first = _thread(f.append, b'{"kind": "first"}\n')
        assert fsync.entered.wait(HANG_GUARD)  # the first fsync is in progress, blocked
        second = _thread(f.append, b'{"kind": "second"}\n')
        wait_for(
            lambda: b"second" in (tmp_path / "t.jsonl").read_bytes(),
            what="the second writer's write(2) while the first fsync is blocked",
        )
        assert second.is_alive()  # written, not acknowledged: no fsync has covered it yet
        fsync.release.set()
        first.join(HANG_GUARD)
        second.join(HANG_GUARD)
        assert not first.is_alive() and not second.is_alive()
        assert fsync.calls == 2
    finally:
        fsync.release.set()
        f.close()


def test_under_machine_a_whole_file_write_fsyncs_the_file_and_its_directory(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = CountingFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    atomic_write_bytes(tmp_path / "result.json", b'{"outcome": "replied"}')
    assert fsync.calls == 2
    assert json.loads((tmp_path / "result.json").read_bytes()) == {"outcome": "replied"}


# --------------------------------------------------------------------------- open files


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("policy", list(Durability))
def test_a_bound_directory_keeps_each_file_open_so_the_fd_count_stays_stable(
    tmp_path: Path, policy: Durability
) -> None:
    before = _fds()
    files = durability.bind(tmp_path, policy)
    try:
        names = [tmp_path / "transcript.jsonl", tmp_path / "agents" / "a" / "events.jsonl"]
        for path in names:
            append_jsonl(path, {"kind": "x"})
        opened = _fds()
        assert opened == before + len(names)  # one fd per file, opened on its first append
        for i in range(300):
            append_jsonl(names[i % 2], {"kind": "x", "i": i})
            assert _fds() == opened
    finally:
        durability.unbind(files)
    assert _fds() == before  # unbinding closes them
    assert len(read_jsonl(names[0]).records) == 151


def test_an_unbound_path_is_opened_and_closed_per_append(tmp_path: Path) -> None:
    before = _fds()
    append_jsonl(tmp_path / "loose.jsonl", {"kind": "x"})
    assert _fds() == before
    assert durability.policy_for(tmp_path / "loose.jsonl") is durability.DEFAULT


@pytest.mark.parametrize("policy", list(Durability))
def test_a_clear_archives_the_open_file_and_the_next_record_starts_the_fresh_one(
    tmp_path: Path, policy: Durability
) -> None:
    files = durability.bind(tmp_path, policy)
    try:
        log = AgentLog(tmp_path / "agents" / "a" / "events.jsonl")
        log.append_user("before")
        archive = log.restart()
        log.append_user("after")
    finally:
        durability.unbind(files)
    assert archive is not None
    assert [r.get("text") for r in read_jsonl(archive).records] == ["before"]
    kinds = [(r["kind"], r.get("text")) for r in read_jsonl(log.path).records]
    assert kinds == [("cleared", None), ("user", "after")]


def test_a_torn_tail_in_a_file_held_open_is_set_aside_before_the_next_append(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    _bind(bound, tmp_path, Durability.MACHINE, CountingFsync())
    path = tmp_path / "j.jsonl"
    append_jsonl(path, {"kind": "a"})
    with path.open("ab") as other:  # another process dies mid-append on the same file
        other.write(b'{"kind": "to')
    append_jsonl(path, {"kind": "b"})
    read = read_jsonl(path)
    assert read.damage == []
    assert [r["kind"] for r in read.records] == ["a", "b"]
    assert len(read_jsonl(durability.torn_path(path)).records) == 1


def test_binding_a_bound_directory_under_the_other_policy_is_refused(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    _bind(bound, tmp_path, Durability.PROCESS, os.fsync)
    with pytest.raises(DurabilityConflict, match="already written under durability process"):
        durability.bind(tmp_path, Durability.MACHINE)
    again = _bind(bound, tmp_path, Durability.PROCESS, os.fsync)
    assert again is bound[0]


def test_a_second_journal_append_is_written_while_the_first_waits_on_its_fsync(
    tmp_path: Path, bound: list[durability.DurableFiles]
) -> None:
    fsync = GatedFsync()
    _bind(bound, tmp_path, Durability.MACHINE, fsync)
    journal = SpawnJournal(tmp_path / "spawn-journal.jsonl")
    try:
        first = _thread(journal.spawned, "a")
        assert fsync.entered.wait(HANG_GUARD)  # "a" is written; its fsync is blocked
        second = _thread(journal.spawned, "b")
        wait_for(
            lambda: len(read_jsonl(journal.path).records) == 2,
            what="the second journal record written while the first fsync is blocked",
        )
        assert first.is_alive() and second.is_alive()  # neither acknowledged yet
        fsync.release.set()
        first.join(HANG_GUARD)
        second.join(HANG_GUARD)
        assert not first.is_alive() and not second.is_alive()
    finally:
        fsync.release.set()
    assert [(r["id"], r["seq"]) for r in read_jsonl(journal.path).records] == [("a", 0), ("b", 1)]
    assert fsync.calls == 2


def test_a_line_another_process_is_still_writing_is_not_taken_for_a_torn_tail(
    tmp_path: Path,
) -> None:
    """Every agent process's shell appends its forensic records (Rollback, Reap, Prune) to the
    session's one ``record.jsonl``. A
    write in flight (preempted between two pages: the size has grown, the newline is not in
    yet) must not look like a crash's torn tail to another writer, which would cut it: the
    check and the write happen under the file's lock, which a crashed writer no longer holds."""
    path = tmp_path / "record.jsonl"
    path.write_bytes(b'{"i": 0}\n')
    other = os.open(path, os.O_WRONLY | os.O_APPEND)  # another writer: its own open file
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        os.write(other, b'{"i": 1, "pad": "')  # its write, half done
        writer = AppendFile(path, Durability.PROCESS)
        appended = threading.Event()

        def append() -> None:
            writer.append(b'{"i": 2}\n')
            appended.set()

        t = threading.Thread(target=append)
        t.start()
        assert not appended.wait(0.2), "the append waits for the write in flight"
        os.write(other, b'xx"}\n')
        fcntl.flock(other, fcntl.LOCK_UN)
        assert appended.wait(HANG_GUARD)
        t.join(HANG_GUARD)
        writer.close()
    finally:
        os.close(other)
    assert [r["i"] for r in read_jsonl(path).records] == [0, 1, 2]
    assert not durability.torn_path(path).exists()
