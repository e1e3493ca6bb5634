"""The worker registry's retention sweep, idle and backstop bounds, figures and state."""

from __future__ import annotations

import msgpack
import pytest

from exarch_actors.runtime.constants import SETTLED_WORKER_RETENTION
from exarch_actors.runtime.shell.worker_retention import (
    WORKER_BACKSTOP_SECS,
    WORKER_IDLE_CALLS,
    ReapNotice,
    UnknownWorker,
    WorkerRegistry,
    WorkerStateInvalid,
)

T0 = 1_700_000_000.0


def sweep_through(reg: WorkerRegistry, first: int, last: int, now: float = T0) -> list[ReapNotice]:
    notices: list[ReapNotice] = []
    for epoch in range(first, last + 1):
        notices += reg.advance(epoch, now)
    return notices


def settled_at(epoch: int) -> WorkerRegistry:
    """A registry whose worker w1 was spawned and settled during the run at ``epoch``."""
    reg = WorkerRegistry(idle_calls=None, backstop_secs=None)
    reg.register("w1", epoch, T0)
    reg.settle("w1")
    assert reg.advance(epoch, T0) == []  # the sweep right after that run stamps it
    return reg


def test_retention_is_the_seed_constant_of_256_calls() -> None:
    assert WorkerRegistry().retention_calls == SETTLED_WORKER_RETENTION == 256


def test_an_unclaimed_settled_entry_is_still_held_255_calls_after_its_stamp() -> None:
    reg = settled_at(10)
    assert sweep_through(reg, 11, 10 + 255) == []
    assert reg.get("w1") is not None


def test_an_unclaimed_settled_entry_expires_exactly_256_calls_after_its_stamp() -> None:
    reg = settled_at(10)
    sweep_through(reg, 11, 10 + 255)
    notices = reg.advance(10 + 256, T0)
    assert [(n.worker, n.reason, n.epoch) for n in notices] == [("w1", "retention", 266)]
    assert reg.get("w1") is None


def test_the_stamp_is_the_sweep_that_first_observes_the_entry_settled() -> None:
    reg = WorkerRegistry(idle_calls=None, backstop_secs=None)
    reg.register("w1", 1, T0)
    sweep_through(reg, 1, 50)  # still running at every sweep
    reg.settle("w1")  # settles between runs
    assert reg.advance(51, T0) == []
    assert reg.get("w1").settled_stamp == 51  # type: ignore[union-attr]
    assert sweep_through(reg, 52, 51 + 255) == []
    assert [n.reason for n in reg.advance(51 + 256, T0)] == ["retention"]


def test_a_claimed_result_leaves_the_registry_and_never_produces_a_notice() -> None:
    reg = settled_at(1)
    reg.claim("w1")
    assert sweep_through(reg, 2, 1000) == []
    with pytest.raises(UnknownWorker):
        reg.claim("w1")


def test_a_running_worker_untouched_for_255_calls_is_kept_and_for_256_is_reaped_as_idle() -> None:
    reg = WorkerRegistry(backstop_secs=None)
    reg.register("w1", 5, T0)
    assert sweep_through(reg, 5, 5 + 255) == []
    notices = reg.advance(5 + 256, T0)
    assert [(n.worker, n.reason) for n in notices] == [("w1", "idle")]
    assert reg.running_ids() == []


def test_touching_a_running_worker_renews_its_idle_bound() -> None:
    reg = WorkerRegistry(backstop_secs=None)
    reg.register("w1", 1, T0)
    sweep_through(reg, 1, 200)
    reg.touch("w1", 200)  # await began
    assert sweep_through(reg, 201, 200 + 255) == []
    assert [n.reason for n in reg.advance(200 + 256, T0)] == ["idle"]


def test_a_running_worker_past_its_wall_backstop_is_reaped_even_when_touched() -> None:
    reg = WorkerRegistry(backstop_secs=60.0)
    reg.register("w1", 1, T0)
    reg.touch("w1", 2)
    assert reg.advance(2, T0 + 59.9) == []
    notices = reg.advance(3, T0 + 60.0)
    assert [(n.worker, n.reason) for n in notices] == [("w1", "backstop")]


def test_default_running_bounds_are_256_calls_idle_and_one_hour_backstop() -> None:
    reg = WorkerRegistry()
    assert (reg.idle_calls, reg.backstop_secs) == (WORKER_IDLE_CALLS, WORKER_BACKSTOP_SECS)
    assert (WORKER_IDLE_CALLS, WORKER_BACKSTOP_SECS) == (256, 3600.0)


def test_disabled_running_bounds_never_reap_a_running_worker() -> None:
    reg = WorkerRegistry(idle_calls=None, backstop_secs=None)
    reg.register("w1", 1, T0)
    assert sweep_through(reg, 1, 2000, now=T0 + 10**7) == []


def test_figures_count_running_and_settled_and_name_the_nearest_reap() -> None:
    reg = WorkerRegistry(backstop_secs=100.0)
    reg.register("run", 10, T0)
    reg.register("done", 10, T0)
    reg.settle("done")
    reg.advance(10, T0)
    f = reg.figures(20, T0 + 30)
    assert (f.running, f.settled) == (1, 1)
    assert f.nearest_reap_calls == 10 + 256 - 20
    assert f.nearest_backstop_secs == pytest.approx(70.0)


def test_figures_renew_nothing() -> None:
    reg = settled_at(1)
    for epoch in range(2, 257):
        reg.figures(epoch, T0)
        reg.advance(epoch, T0)
    assert [n.reason for n in reg.advance(257, T0)] == ["retention"]


def test_clear_empties_the_registry_and_returns_the_running_workers_to_cancel() -> None:
    reg = WorkerRegistry()
    reg.register("a", 1, T0)
    reg.register("b", 1, T0)
    reg.settle("b")
    assert reg.clear() == ["a"]
    assert len(reg) == 0


def test_state_round_trips_and_the_retention_clock_carries_on() -> None:
    reg = settled_at(10)
    reg.register("r", 12, T0)
    back = WorkerRegistry.from_state(msgpack.unpackb(msgpack.packb(reg.to_state())))
    assert back.to_state() == reg.to_state()
    back.touch("r", 200)
    assert [n.worker for n in sweep_through(back, 11, 266)] == ["w1"]


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.update(version=2),
        lambda s: s.pop("entries"),
        lambda s: s.update(entries=[["w", "exploded", 1, 0.0, 1, None]]),
        lambda s: s.update(retention_calls=0),
    ],
)
def test_a_malformed_state_is_refused_with_a_typed_error(damage: object) -> None:
    state = settled_at(1).to_state()
    damage(state)  # type: ignore[operator]
    with pytest.raises(WorkerStateInvalid):
        WorkerRegistry.from_state(state)


def test_ids_lists_running_and_settled_entries_and_forgets_claimed_ones() -> None:
    reg = WorkerRegistry(idle_calls=None, backstop_secs=None)
    for wid in ("w1", "w2", "w3"):
        reg.register(wid, 1, T0)
    reg.settle("w2")
    reg.claim("w3")
    assert reg.ids() == ["w1", "w2"]
    assert reg.running_ids() == ["w1"]
