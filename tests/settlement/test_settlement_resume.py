"""Resume healing: a real control process dies mid-run; its journal rebuilds the identical
settlement, inconsistent journals are refused with typed errors, and the resume sweep closes
every open slot of the dead run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from settlement_support import SLEEP, pid_gone

from exarch_actors.runtime.settlement.executor import Backoff, ExecutionSpec
from exarch_actors.runtime.settlement.fleet_yield import fleet_yield
from exarch_actors.runtime.settlement.local_executor import LocalProcessExecutor
from exarch_actors.runtime.settlement.release_sweep import (
    SweepPolicy,
    admit,
    resume_sweep,
    settle_child,
)
from exarch_actors.runtime.state.journal import (
    DuplicateSeq,
    InconsistentRecord,
    MismatchedEnvironment,
    SpawnJournal,
    StaleReceipt,
    replay,
)
from tests.support.records import record_of, sealed

FAST = SweepPolicy(Backoff(attempts=2, base=0.01), grace=1.0)
ROOT = Path(__file__).resolve().parents[2]

CONTROLLER = """
import json, os, signal, sys
from exarch_actors.runtime.settlement.executor import ExecutionSpec
from exarch_actors.runtime.settlement.local_executor import LocalProcessExecutor
from exarch_actors.runtime.state.journal import SpawnJournal
from exarch_actors.runtime.settlement.release_sweep import admit, settle_child
d = sys.argv[1]
j = SpawnJournal(d + "/spawn-journal.jsonl")
j.spawned("trunk")
exs = {}
for n in "abcd":
    j.spawned(n, parent="trunk")
    exs[n] = LocalProcessExecutor(d + "/scratch")
    admit(j, n, exs[n], ExecutionSpec(n, argv=("sleep", "60")))
settle_child(j, "a", exs["a"], status="done")
settle_child(j, "b", exs["b"], status="down", observable=False)
j.spawned("e", parent="trunk")
j.admitted("e", "intent")
state = {"terminal": j.state.terminal_records(),
         "pids": {n: e.execution.pid for n, e in exs.items()}}
open(d + "/state.json", "w").write(json.dumps(state))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _kill_orphans(pids: dict[str, int]) -> None:
    for pid in pids.values():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_dead_control_process_journal_rebuilds_identical_terminal_records_and_resume_closes_all(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CONTROLLER, str(tmp_path)], env=env, timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = json.loads((tmp_path / "state.json").read_text())
    pids: dict[str, int] = before["pids"]
    try:
        rep = replay(tmp_path / "spawn-journal.jsonl")
        assert rep.state.terminal_records() == before["terminal"]
        assert sorted(rep.state.never_settled) == ["b", "c", "d", "e", "trunk"]
        assert all(not pid_gone(pids[n]) for n in "bcd")  # orphans outlived their controller
        report = resume_sweep(tmp_path / "spawn-journal.jsonl", policy=FAST)
        assert report.never_settled == []
        assert report.recovered == {"b": True, "c": True, "d": True}
        assert sorted(report.closed_without_environment) == ["e", "trunk"]
        assert {o.node_id: o.retained for o in report.outcomes} == dict.fromkeys("bcd", "released")
        assert all(pid_gone(pids[n]) for n in "bcd")
        after = replay(tmp_path / "spawn-journal.jsonl").state
        assert fleet_yield(after).never_settled == 0
        for n, t in before["terminal"].items():  # healing never rewrote a terminal record
            assert after.terminal_records()[n] == t
        again = resume_sweep(tmp_path / "spawn-journal.jsonl", policy=FAST)
        assert again.outcomes == [] and replay(tmp_path / "spawn-journal.jsonl").state == after
    finally:
        _kill_orphans(pids)


def _journal_with_retained(tmp_path: Path, reap: Any) -> tuple[SpawnJournal, LocalProcessExecutor]:
    j = SpawnJournal(tmp_path / "spawn-journal.jsonl")
    ex = reap(LocalProcessExecutor(tmp_path / "scratch"))
    admit(j, "c", ex, ExecutionSpec("c", argv=SLEEP))
    settle_child(j, "c", ex, status="down", observable=False)
    return j, ex


def _append_raw(path: Path, rec: dict[str, Any]) -> None:
    with path.open("ab") as f:
        f.write(sealed(rec))


def test_resume_refuses_a_receipt_for_a_mismatched_environment_and_writes_nothing(
    tmp_path: Path, reap: Any
) -> None:
    j, ex = _journal_with_retained(tmp_path, reap)
    _append_raw(
        j.path,
        {
            "kind": "environment-teardown",
            "seq": 99,
            "id": "c",
            "environmentId": "local-someone-else",
            "destroyed": True,
            "detail": "x",
        },
    )
    size = j.path.stat().st_size
    with pytest.raises(MismatchedEnvironment, match="local-someone-else"):
        resume_sweep(j.path, policy=FAST)
    assert j.path.stat().st_size == size and ex.observe().state == "running"
    ex.teardown("brutal-kill")


def test_resume_refuses_a_stale_receipt_after_the_terminal_record(tmp_path: Path, reap) -> None:
    j = SpawnJournal(tmp_path / "spawn-journal.jsonl")
    ex = reap(LocalProcessExecutor(tmp_path / "scratch"))
    admit(j, "c", ex, ExecutionSpec("c", argv=SLEEP))
    settle_child(j, "c", ex, status="done")
    _append_raw(
        j.path,
        {
            "kind": "environment-teardown",
            "seq": 99,
            "id": "c",
            "environmentId": ex.environment_id,
            "destroyed": True,
            "detail": "late",
        },
    )
    with pytest.raises(StaleReceipt):
        resume_sweep(j.path, policy=FAST)


def test_resume_refuses_a_reused_seq(tmp_path: Path, reap: Any) -> None:
    j, ex = _journal_with_retained(tmp_path, reap)
    _append_raw(j.path, {"kind": "spawned", "seq": 2, "id": "intruder"})
    with pytest.raises(DuplicateSeq):
        resume_sweep(j.path, policy=FAST)
    ex.teardown("brutal-kill")


def test_resume_refuses_a_released_record_no_destroyed_receipt_backs(tmp_path: Path, reap) -> None:
    j, ex = _journal_with_retained(tmp_path, reap)
    _append_raw(
        j.path,
        {
            "kind": "settled",
            "seq": 99,
            "id": "c",
            "status": "down",
            "retainedExecution": "released",
        },
    )
    with pytest.raises(InconsistentRecord, match="destroyed environment-teardown"):
        resume_sweep(j.path, policy=FAST)
    ex.teardown("brutal-kill")


def test_resume_never_kills_a_process_that_reused_the_recorded_pid(tmp_path: Path, reap) -> None:
    j = SpawnJournal(tmp_path / "spawn-journal.jsonl")
    ex = reap(LocalProcessExecutor(tmp_path / "scratch"))
    e = admit(j, "c", ex, ExecutionSpec("c", argv=SLEEP))
    assert e is not None
    # rewrite the journal as if the recorded process had started long before this one
    lines = [record_of(x) for x in j.path.read_text().splitlines()]
    for r in lines:
        if r.get("phase") == "environment":
            assert e.pid_started_at is not None
            r["pidStartedAt"] = e.pid_started_at - 1000
    j.path.write_bytes(b"".join(sealed(r) for r in lines))
    report = resume_sweep(j.path, policy=FAST)
    [out] = report.outcomes
    assert out.retained == "release-unconfirmed" and report.recovered == {"c": False}
    assert ex.observe().state == "running"  # the pid's current owner was left alone
    [u] = replay(j.path).state.nodes["c"].unconfirmed
    assert u["state"] == "gone"
    assert ex.teardown("brutal-kill").destroyed


def test_lenient_replay_skips_and_reports_inconsistent_records(tmp_path: Path, reap) -> None:
    j, ex = _journal_with_retained(tmp_path, reap)
    _append_raw(
        j.path,
        {
            "kind": "environment-teardown",
            "seq": 99,
            "id": "c",
            "environmentId": "nope",
            "destroyed": True,
            "detail": "x",
        },
    )
    rep = replay(j.path, strict=False)
    assert [type(e) for e in rep.refused] == [MismatchedEnvironment]
    assert rep.state.terminal_records() == j.state.terminal_records()
    ex.teardown("brutal-kill")
