"""Base plus binding log under crashes: a SIGKILL during a compaction, a rollback across one,
and a resume and a fork built from base plus log."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.runtime.state.binding_log import log_path, read_log
from exarch_actors.runtime.state.snapshot import MobileSnapshot
from tests.support.waiting import HANG_GUARD, wait_for

ROOT = Path(__file__).resolve().parents[2]

_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from exarch_actors.actors.frames import Frame
    from exarch_actors.actors.shell_snapshot import SnapshotKeeper
    from exarch_actors.runtime.shell.ledger import BindingLedger

    keeper = SnapshotKeeper("a", Path(sys.argv[1]), notify=print, compact_floor=0)
    keeper.reset({"big": bytes(3 << 20)}, {"cwd": "/"})  # a 3 MiB base: compactions take a while
    whole = {"bindings": {}, "context": {"cwd": "/"}, "ledger": BindingLedger().to_state()}
    keeper.apply(Frame("snapshot", whole))
    keeper.checkpoint(0, {})
    import exarch_actors.actors.shell_snapshot as keeping
    write = keeping.atomic_write_bytes

    def announced(path, data):
        print("compacting", flush=True)  # the new base is about to be written
        write(path, data)

    keeping.atomic_write_bytes = announced
    for i in range(1, 100000):
        value = bytes([i % 256]) * 300_000  # ~10 frames outgrow the base: then it compacts
        delta = {"clock": i, "pinned": []}
        frame = {"bindings": {f"k{i}": value}, "removed": [], "context": {"cwd": "/"},
                 "ledger_delta": delta}
        keeper.apply(Frame("snapshot", frame))
        keeper.checkpoint(i, {})
        print(f"committed {i}", flush=True)
    """
)


@pytest.mark.slow
def test_a_sigkill_during_compaction_leaves_base_and_log_readable_with_every_committed_binding(
    tmp_path: Path,
) -> None:
    rng = random.Random(14)
    for round_ in range(6):
        path = tmp_path / f"r{round_}" / "snapshot.msgpack"
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.stdout is not None
        committed = 0
        compactions = 0
        try:
            deadline = time.monotonic() + HANG_GUARD * 3
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                assert line, "the writer ended early"
                if line.startswith("committed"):
                    committed = int(line.split()[1])
                elif line.startswith("compacting"):
                    compactions += 1
                    if compactions == 2 + round_ % 3:  # mid-compaction, at varied points
                        time.sleep(rng.uniform(0, 0.06))
                        proc.send_signal(signal.SIGKILL)
                        break
            else:
                raise AssertionError("the writer never compacted")
            proc.wait(timeout=HANG_GUARD)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        snap = MobileSnapshot.load(path)
        for i in range(1, committed + 1):
            assert snap.bindings[f"k{i}"] == bytes([i % 256]) * 300_000, (round_, i)
        assert snap.bindings["big"] == bytes(3 << 20)
        assert snap.epoch >= committed


def _files(tmp_path: Path, name: str = "trunk") -> tuple[Path, Path]:
    path = tmp_path / "agents" / name / "snapshot.msgpack"
    return path, log_path(path)


def test_a_rollback_across_a_compaction_keeps_every_binding_committed_before_and_after_it(
    start_shell: Callable[..., Any], tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    path, log = _files(tmp_path)
    shell.run("let before = 'b'").get()
    base_ino = path.stat().st_ino
    shell.run("let big = seq 1 200000").get()  # over the log's 1 MiB bound: compacted
    assert path.stat().st_ino != base_ino, "a new base was renamed into place"
    shell.run("let after = 'a'").get()
    big_len = shell.run("len $big").get().value
    base = MobileSnapshot.load_base(path)
    assert base.base_id is not None
    assert read_log(log, base.base_id).records, "'after' is in the log, not the base"
    pid = shell.host_pid().get()
    root = shell.eval_root.get()
    future = shell.run("let lost = 1; sleep 10")
    wait_for(lambda: root.busy, HANG_GUARD, "the run on the host")
    os.kill(pid, signal.SIGKILL)
    result = future.get()
    assert result.rolled_back
    check = shell.run("echo $before $after; len $big").get()
    assert check.value == big_len and check.stdout == "b a\n"
    assert shell.run("echo $lost").get().error is not None  # the panicking call is gone
    assert {"before", "big", "after"} <= set(MobileSnapshot.load(path).bindings)
    assert "lost" not in MobileSnapshot.load(path).bindings


def test_a_resume_and_a_fork_from_base_plus_log_see_every_committed_binding(
    start_shell: Callable[..., Any], tmp_path: Path
) -> None:
    shell = start_shell(notice_sink=lambda n: None, idle_calls=3).proxy()
    path, log = _files(tmp_path)
    shell.run("let gone = 0").get()
    shell.run("let a = 1").get()
    shell.run("let big = seq 1 200000").get()  # compacted into a new base
    shell.run("let b = [2, 3]; cd /tmp").get()  # 'gone' idled 3 calls: pruned, logged removed
    shell.run("let a = 10").get()
    big_len = shell.run("len $big").get().value
    base = MobileSnapshot.load_base(path)
    assert base.base_id is not None and len(read_log(log, base.base_id).records) >= 2
    snap = MobileSnapshot.load(path)
    assert set(snap.bindings) == {"a", "b", "big"} and snap.context["cwd"] == "/tmp"
    resumed = start_shell(
        name="resumed", snapshot=snap, notice_sink=lambda n: None, idle_calls=3
    ).proxy()
    r = resumed.run("echo $a $b; len $big").get()
    assert (r.stdout, r.value, r.error) == ("10 [2, 3]\n", big_len, None)
    assert resumed.run("pwd").get().value == "/tmp"
    assert resumed.probe().get().live_bindings == 3  # the ledger came back from the log too
    child = start_shell(
        name="kid", snapshot=resumed.fork_snapshot().get(), notice_sink=lambda n: None
    ).proxy()
    assert child.run("echo $a $b").get().stdout == "10 [2, 3]\n"
    assert child.probe().get().baseline_bindings == 3
