"""The release sweep end to end through the real LocalProcessExecutor
(runtime/settlement/release_sweep.py).

Each case forces one branch with an executor subclass, but the process is real; every case must
reach a terminal record and leave no slot open.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from settlement_support import SLEEP, kill_hard, pid_gone

from exarch_actors.runtime.settlement.executor import (
    Backoff,
    CompletionGate,
    EnvironmentState,
    ExecutionSpec,
    Grace,
    InFlight,
    Receipt,
    RetryPreSpawnRefusals,
)
from exarch_actors.runtime.settlement.fleet_yield import fleet_yield, write_result
from exarch_actors.runtime.settlement.local_executor import LocalProcessExecutor
from exarch_actors.runtime.settlement.release_sweep import (
    RetainedChild,
    SweepPolicy,
    admit,
    cancel_child,
    release_sweep,
    retain_at_settlement,
    settle_child,
)
from exarch_actors.runtime.state.journal import SpawnJournal, replay
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import wait_for as wait_until

FAST = SweepPolicy(Backoff(attempts=3, base=0.01), grace=1.0)


class RefusesDestroy(LocalProcessExecutor):
    """destroy answers like the stopped sandbox's HTTP 409, and the box stays as it is."""

    def release_retained(self) -> list[Receipt]:
        ex = self.execution
        assert ex is not None
        return [
            Receipt(
                False,
                "destroy refused: 409 environment not running",
                self.environment_id,
                EnvironmentState.ALIVE_UNDELETABLE,
                ex.pid,
                ex.scratch,
            )
        ]


class NoReceipts(LocalProcessExecutor):
    def release_retained(self) -> list[Receipt]:
        return []


class ConfirmThrows(LocalProcessExecutor):
    def release_retained(self) -> list[Receipt]:
        return [LocalProcessExecutor.teardown(self, 1.0)]

    def teardown(self, grace: Grace) -> Receipt:
        raise RuntimeError("confirmTeardown: deadline exceeded")


class ReleaseSaysDestroyedTeardownDisagrees(LocalProcessExecutor):
    """An executor that violates the receipt contract (runtime/settlement/executor.py)."""

    def release_retained(self) -> list[Receipt]:
        return [LocalProcessExecutor.teardown(self, 1.0)]

    def teardown(self, grace: Grace) -> Receipt:
        return Receipt(False, "teardown: not destroyed", self.environment_id)


class ReleaseRaises(LocalProcessExecutor):
    def release_retained(self) -> list[Receipt]:
        raise ConnectionError("control plane unreachable")


def _retained(
    journal: SpawnJournal,
    reap: Any,
    scratch_root: Path,
    node: str,
    cls: type[LocalProcessExecutor] = LocalProcessExecutor,
    **kw: Any,
) -> Any:
    ex = reap(cls(scratch_root, **kw))
    admit(journal, node, ex, ExecutionSpec(node, argv=SLEEP))
    settle_child(journal, node, ex, status="down", observable=False, reason="event stream lost")
    assert node in journal.state.retained_pending
    return ex


def _kinds(journal: SpawnJournal, node: str) -> list[str]:
    return [r["kind"] for r in replay(journal.path).records if r["id"] == node]


def _closed(journal: SpawnJournal, node: str, retained: str) -> dict[str, Any]:
    t = journal.state.nodes[node].terminal
    assert t is not None and t["kind"] == "settled" and t["retainedExecution"] == retained
    assert journal.state.never_settled == []
    assert replay(journal.path).state.terminal_records() == journal.state.terminal_records()
    return t


def test_all_receipts_destroyed_closes_the_slot_released(journal, reap, scratch_root) -> None:
    ex = _retained(journal, reap, scratch_root, "c")
    pid = ex.execution.pid
    [out] = release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    t = _closed(journal, "c", "released")
    assert out.branch == "released" and t["sweep"]["branch"] == "released"
    assert t["status"] == "down" and pid_gone(pid)
    receipts = journal.state.nodes["c"].receipts
    assert receipts and all(r["destroyed"] for r in receipts) and receipts[-1]["confirmation"]
    assert "teardown-unconfirmed" not in _kinds(journal, "c")


def test_destroyed_false_closes_release_unconfirmed_naming_the_live_process_to_delete(
    journal, reap, scratch_root
) -> None:
    ex = _retained(journal, reap, scratch_root, "c", RefusesDestroy)
    [out] = release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    t = _closed(journal, "c", "release-unconfirmed")
    assert out.branch == "destroy-refused" and out.attempts == 3
    assert t["sweep"]["releaseSurface"] == "bound" and t["sweep"]["receipts"] == 1
    [u] = journal.state.nodes["c"].unconfirmed
    assert (u["environmentId"], u["pid"], u["scratch"]) == (
        ex.environment_id,
        ex.execution.pid,
        ex.execution.scratch,
    )
    assert u["state"] == "alive-undeletable" and "409" in u["detail"]
    assert not pid_gone(u["pid"]) and Path(u["scratch"]).is_dir()  # exactly what is left
    kill_hard(u["pid"])  # the sweeper's job, from the record alone


def test_no_receipts_closes_release_unconfirmed_with_the_environment_from_the_journal(
    journal, reap, scratch_root
) -> None:
    ex = _retained(journal, reap, scratch_root, "c", NoReceipts)
    [out] = release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    t = _closed(journal, "c", "release-unconfirmed")
    assert out.branch == "no-receipts" and t["sweep"]["receipts"] == 0
    [u] = journal.state.nodes["c"].unconfirmed
    assert u["pid"] == ex.execution.pid and u["scratch"] == ex.execution.scratch
    assert u["environmentId"] == ex.environment_id and u["state"] == "unknown"
    kill_hard(u["pid"])


def test_a_confirmation_that_throws_closes_release_unconfirmed(journal, reap, scratch_root) -> None:
    ex = _retained(journal, reap, scratch_root, "c", ConfirmThrows)
    [out] = release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    t = _closed(journal, "c", "release-unconfirmed")
    assert out.branch == "confirm-raised" and "deadline exceeded" in t["sweep"]["error"]
    assert pid_gone(ex.execution.pid)


def test_release_destroyed_but_teardown_not_is_caught_and_closes_release_unconfirmed(
    journal, reap, scratch_root
) -> None:
    ex = _retained(journal, reap, scratch_root, "c", ReleaseSaysDestroyedTeardownDisagrees)
    [out] = release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    _closed(journal, "c", "release-unconfirmed")
    assert out.branch == "confirm-refused"


def test_a_release_surface_that_raises_or_is_absent_still_closes_the_slot(
    journal, reap, scratch_root
) -> None:
    raises = _retained(journal, reap, scratch_root, "r", ReleaseRaises)
    absent = _retained(journal, reap, scratch_root, "a")
    outs = release_sweep(
        journal, [RetainedChild("r", raises), RetainedChild("a", None)], policy=FAST
    )
    assert {o.node_id: o.branch for o in outs} == {"r": "release-raised", "a": "no-executor"}
    assert journal.state.never_settled == []
    assert fleet_yield(journal.state).release_unconfirmed == 2
    absent.teardown("brutal-kill")


def test_a_child_killed_before_release_settles_unconfirmed_with_its_turn_and_snapshot_kept(
    journal, reap, scratch_root
) -> None:
    events = [{"kind": "delta", "text": "counting"}, {"kind": "tool_call", "ral": "ls"}]
    holder: dict[str, LocalProcessExecutor] = {}

    def in_flight() -> InFlight:
        execution = holder["ex"].execution
        assert execution is not None
        scratch = Path(execution.scratch)
        return InFlight(3, tuple(events), str(scratch / "snapshot.msgpack"))

    ex = reap(LocalProcessExecutor(scratch_root, in_flight_source=in_flight))
    holder["ex"] = ex
    admit(journal, "c", ex, ExecutionSpec("c", argv=SLEEP))
    (Path(ex.execution.scratch) / "snapshot.msgpack").write_bytes(b"\x82\xa1k\x01")
    os.kill(ex.execution.pid, signal.SIGKILL)  # the sandbox stops under the child
    wait_until(lambda: ex.observe().state == "exited")
    settle_child(journal, "c", ex, status="down", observable=False, cause="unobservable")
    [out] = release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    _closed(journal, "c", "release-unconfirmed")
    assert out.branch == "destroy-refused"
    [u] = journal.state.nodes["c"].unconfirmed
    assert u["state"] == "gone" and "already gone" in u["detail"]
    [res] = journal.state.nodes["c"].results
    assert res["events"] == events and res["turn"] == 3 and res["source"] == "release-sweep"
    assert Path(res["snapshot"]).read_bytes() == b"\x82\xa1k\x01"
    assert journal.path.parent in Path(res["snapshot"]).parents  # out of the environment
    kinds = _kinds(journal, "c")
    assert kinds.index("execution-result") < kinds.index("environment-teardown")


def test_a_worker_behind_both_wrappers_is_released(journal, reap, scratch_root) -> None:
    inner = reap(LocalProcessExecutor(scratch_root))
    ex = RetryPreSpawnRefusals(CompletionGate(inner, lambda _r, _e: None))
    admit(journal, "w", ex, ExecutionSpec("w", argv=SLEEP))
    settle_child(journal, "w", ex, status="down", observable=False)
    [out] = release_sweep(journal, [RetainedChild("w", ex)], policy=FAST)
    assert out.retained == "released" and pid_gone(inner.execution.pid)


def test_keep_leaves_retained_slots_open_for_a_resumer(journal, reap, scratch_root) -> None:
    assert retain_at_settlement(resumable=True) == "keep"
    assert retain_at_settlement(resumable=False) == "release"
    ex = _retained(journal, reap, scratch_root, "c")
    [out] = release_sweep(journal, [RetainedChild("c", ex)], retain="keep", policy=FAST)
    assert out.retained == "kept" and journal.state.never_settled == ["c"]
    assert ex.observe().state == "running"
    release_sweep(journal, [RetainedChild("c", ex)], policy=FAST)
    assert journal.state.never_settled == []


@pytest.mark.parametrize("seed", [3, 1247])
def test_a_fan_out_of_50_children_with_random_crashes_ends_with_never_settled_0(
    seed: int, tmp_path, reap, scratch_root
) -> None:
    rng = random.Random(seed)
    journal = SpawnJournal(tmp_path / "spawn-journal.jsonl")
    journal.spawned("trunk")
    fates = ["clean", "crash", "hang", "unobservable", "crash-unobservable", "cancel", "refuses"]
    plan: dict[str, tuple[str, LocalProcessExecutor]] = {}
    for i in range(50):
        fate = rng.choice(fates)
        cls = RefusesDestroy if fate == "refuses" else LocalProcessExecutor
        ex = reap(cls(scratch_root))
        argv = ("true",) if fate == "clean" else SLEEP
        node = f"worker-{i}"
        journal.spawned(node, parent="trunk")
        admit(journal, node, ex, ExecutionSpec(node, argv=argv))
        if rng.random() < 0.7:
            ex.charge(rng.randrange(100), rng.randrange(100))
        plan[node] = (fate, ex)
    for fate, ex in plan.values():
        if "crash" in fate:
            assert ex.execution is not None
            os.kill(ex.execution.pid, signal.SIGKILL)
    retained = []
    for node, (fate, ex) in plan.items():
        if fate == "cancel":
            cancel_child(journal, node, ex)
            continue
        res = ex.result(5.0 if fate in ("clean", "crash") else 0.0)
        observable = fate not in ("unobservable", "crash-unobservable", "refuses")
        status = res.status if res is not None else "down"
        settle_child(journal, node, ex, status=status, observable=observable, grace=1.0)
        if not observable:
            retained.append(RetainedChild(node, ex))
    release_sweep(journal, retained, policy=FAST)
    journal.settled("trunk", "done")
    fy = fleet_yield(replay(journal.path).state)
    assert fy.never_settled == 0 and fy.spawned == 51
    assert fy.done + fy.down + fy.cancelled == 51
    counts = Counter(f for f, _ in plan.values())
    assert fy.cancelled == counts["cancel"]
    assert fy.release_unconfirmed >= counts["refuses"] + counts["crash-unobservable"]
    path = write_result(SessionDir(tmp_path), "replied", "done", fy)
    doc = json.loads(path.read_text())
    assert doc["fleetYield"]["neverSettled"] == 0 and doc["fleetYield"]["spawned"] == 51
    for u in (u for n in journal.state.nodes.values() for u in n.unconfirmed):
        if not pid_gone(u["pid"]):
            kill_hard(u["pid"])
