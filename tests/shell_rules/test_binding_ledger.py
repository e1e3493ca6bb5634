"""Every binding-lease rule (runtime/shell/ledger.py) that lives in the pure ledger, one test
each."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from exarch_actors.runtime.constants import BINDING_IDLE_CALLS, LARGE_BINDING_BYTES
from exarch_actors.runtime.ral.values import Closure, Variant, WorkerHandle
from exarch_actors.runtime.shell.ledger import (
    BindingLedger,
    LargeBinding,
    LedgerAlreadyArmed,
    LedgerStateInvalid,
    PruneOutcome,
    PruneRefused,
    carry_renewals,
    reaches_running_worker,
    referenced_names,
)

NEVER = lambda name: False  # noqa: E731 - the "no running work" predicate


def armed(*baseline: str, idle: int = BINDING_IDLE_CALLS) -> BindingLedger:
    ledger = BindingLedger()
    ledger.arm(baseline, idle_calls=idle)
    return ledger


def boundary(ledger: BindingLedger, epoch: int, pins: Any = NEVER) -> PruneOutcome:
    return ledger.prune(epoch, sink_installed=True, mid_frame=False, pins_running_work=pins)


def run_until(ledger: BindingLedger, epoch: int) -> None:
    """Tick (as failed runs: nothing renewed) until the clock reads ``epoch``."""
    while ledger.clock < epoch:
        ledger.tick()


# -- arming -------------------------------------------------------------------------------------


def test_arming_defaults_to_the_seed_terms_of_256_calls_and_one_mebibyte() -> None:
    ledger = armed()
    assert ledger.fork_terms() == (256, 1 << 20) == (BINDING_IDLE_CALLS, LARGE_BINDING_BYTES)


def test_arming_a_second_time_is_refused_and_keeps_the_first_baseline() -> None:
    ledger = armed("lib")
    with pytest.raises(LedgerAlreadyArmed):
        ledger.arm(["other"])
    assert ledger.baseline() == {"lib"}


def test_an_unarmed_ledger_leases_nothing_notices_nothing_and_prunes_nothing() -> None:
    ledger = BindingLedger()
    epoch = ledger.tick()
    assert ledger.note_define("x", epoch, 10 * LARGE_BINDING_BYTES) is None
    assert ledger.names() == frozenset()
    assert boundary(ledger, epoch + 10_000) == PruneOutcome()


def test_a_baseline_name_never_becomes_a_lease_and_never_falls() -> None:
    ledger = armed("view-text-around")
    ledger.note_define("view-text-around", ledger.tick(), 10)
    run_until(ledger, 10_000)
    assert boundary(ledger, ledger.clock).fell == ()
    assert not ledger.is_leased("view-text-around")


def test_a_model_rebind_of_a_baseline_name_stays_baseline_but_still_gets_the_large_notice() -> None:
    ledger = armed("lib")
    notice = ledger.note_define("lib", ledger.tick(), LARGE_BINDING_BYTES + 1)
    assert notice == LargeBinding("lib", LARGE_BINDING_BYTES + 1, LARGE_BINDING_BYTES)
    assert not ledger.is_leased("lib")


# -- the chokepoint, the clock and use ---------------------------------------------------------


def test_a_name_last_used_at_e_survives_the_boundary_of_e_plus_255() -> None:
    ledger = armed()
    e = ledger.tick()
    ledger.note_define("x", e, 8)
    run_until(ledger, e + 255)
    assert boundary(ledger, e + 255).fell == ()
    assert ledger.is_leased("x")


def test_a_name_last_used_at_e_falls_at_the_boundary_of_e_plus_256() -> None:
    ledger = armed()
    e = ledger.tick()
    ledger.note_define("x", e, 8)
    run_until(ledger, e + 256)
    assert boundary(ledger, e + 256).fell == ("x",)
    assert not ledger.is_leased("x")


def test_a_rebind_restamps_the_lease() -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    ledger.note_define("x", 200, 8)
    assert boundary(ledger, 1 + 256).fell == ()
    assert boundary(ledger, 200 + 256).fell == ("x",)


def test_the_referenced_name_harvest_renews_a_lease() -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    ledger.renew({"x"}, 100)
    assert boundary(ledger, 256).fell == ()
    assert boundary(ledger, 356).fell == ("x",)


def test_harvested_names_the_ledger_does_not_hold_never_become_entries() -> None:
    ledger = armed()
    ledger.renew({"echo", "add", "some-local"}, 1)
    assert ledger.names() == frozenset()


def test_a_stale_renewal_never_shortens_a_lease() -> None:
    ledger = armed()
    ledger.note_define("x", 300, 8)
    ledger.renew({"x"}, 10)
    ledger.note_define("x", 20, 8)
    assert ledger.last_use("x") == 300


def test_failed_runs_tick_the_clock_but_renew_nothing() -> None:
    ledger = armed()
    ledger.note_define("x", ledger.tick(), 8)
    for _ in range(256):
        ledger.tick()  # refused at parse/elaboration: no harvest, so no renew call
    assert ledger.clock == 257
    assert boundary(ledger, ledger.clock).fell == ("x",)


def test_listing_and_probes_renew_nothing() -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    for epoch in range(2, 258):
        ledger.names()
        ledger.figures(epoch)
        ledger.to_state()
        ledger.is_leased("x")
    assert ledger.last_use("x") == 1
    assert boundary(ledger, 257).fell == ("x",)


def test_the_large_binding_notice_fires_only_above_the_limit() -> None:
    ledger = armed()
    assert ledger.note_define("a", 1, LARGE_BINDING_BYTES) is None
    assert ledger.note_define("b", 1, LARGE_BINDING_BYTES + 1) == LargeBinding(
        "b", LARGE_BINDING_BYTES + 1, LARGE_BINDING_BYTES
    )


def test_forget_drops_a_lease() -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    ledger.forget("x")
    assert boundary(ledger, 1000).fell == ()


# -- the ready boundary ------------------------------------------------------------------------


def test_without_a_surface_sink_the_boundary_leaves_everything_untouched_and_waits() -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    out = ledger.prune(500, sink_installed=False, mid_frame=False, pins_running_work=NEVER)
    assert out == PruneOutcome(waited=True)
    assert ledger.is_leased("x")
    assert boundary(ledger, 501).fell == ("x",)


def test_a_mid_frame_caller_is_refused_and_nothing_falls() -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    with pytest.raises(PruneRefused):
        ledger.prune(500, sink_installed=True, mid_frame=True, pins_running_work=NEVER)
    assert ledger.is_leased("x")


def test_an_idle_name_reaching_running_work_is_pinned_and_rechecked_next_boundary() -> None:
    ledger = armed()
    ledger.note_define("job", 1, 8)
    running = {"job"}
    out = boundary(ledger, 300, pins=lambda n: n in running)
    assert out == PruneOutcome(fell=(), pinned=("job",))
    assert ledger.figures(300).pinned == 1
    running.clear()  # the worker settled
    assert boundary(ledger, 301).fell == ("job",)


def test_a_pin_never_renews_the_lease() -> None:
    ledger = armed()
    ledger.note_define("job", 1, 8)
    boundary(ledger, 300, pins=lambda n: True)
    assert ledger.last_use("job") == 1


def test_only_idle_entries_are_examined_by_the_pin_predicate() -> None:
    ledger = armed()
    ledger.note_define("fresh", 250, 8)
    ledger.note_define("old", 1, 8)
    asked: list[str] = []

    def pins(name: str) -> bool:
        asked.append(name)
        return False

    boundary(ledger, 257, pins=pins)
    assert asked == ["old"]


def test_a_pruned_name_reads_exactly_like_a_never_bound_one() -> None:
    pruned, never = armed(), armed()
    pruned.note_define("x", 1, 8)
    boundary(pruned, 257)
    assert pruned.names() == never.names()
    assert pruned.figures(257) == never.figures(257)
    pruned.renew({"x"}, 258)  # a later harvest of the name is not a definition
    assert not pruned.is_leased("x")


def test_the_capture_scenario_f_renews_every_run_and_big_falls_256_calls_later() -> None:
    ledger = armed()
    e = ledger.tick()  # let big = <5 MB>
    ledger.note_define("big", e, 5 << 20)
    e = ledger.tick()  # let f = { ... $big ... }: the run that compiles f harvests big once
    ledger.note_define("f", e, 100)
    ledger.renew({"f", "big"}, e)
    defined_f = e
    while ledger.clock < defined_f + 256:
        e = ledger.tick()  # f  (every later call names only f)
        ledger.renew({"f"}, e)
        out = boundary(ledger, e)
        if e < defined_f + 256:
            assert out.fell == ()
    assert out.fell == ("big",)
    assert ledger.is_leased("f")


# -- probes, persistence, fork -----------------------------------------------------------------


def test_figures_report_live_baseline_pinned_nearest_expiry_and_bytes() -> None:
    ledger = armed("lib1", "lib2")
    ledger.note_define("a", 1, 100)
    ledger.note_define("b", 50, 20)
    f = ledger.figures(60)
    assert (f.live, f.baseline, f.pinned, f.bytes_held) == (2, 2, 0, 120)
    assert f.nearest_expiry_calls == 1 + 256 - 60


def test_state_round_trips_through_a_plain_dict() -> None:
    import msgpack

    ledger = armed("lib", idle=7)
    ledger.note_define("x", ledger.tick(), 3)
    boundary(ledger, 100, pins=lambda n: True)
    state = msgpack.unpackb(msgpack.packb(ledger.to_state()))
    back = BindingLedger.from_state(state)
    assert back.to_state() == state
    assert back.figures(100) == ledger.figures(100)


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.pop("clock"),
        lambda s: s.update(version=99),
        lambda s: s.update(last_use={"x": "soon"}),
        lambda s: s.update(sizes={}),
        lambda s: s.update(idle_calls=0),
    ],
)
def test_a_malformed_state_is_refused_with_a_typed_error(damage: Any) -> None:
    ledger = armed()
    ledger.note_define("x", 1, 8)
    state = ledger.to_state()
    damage(state)
    with pytest.raises(LedgerStateInvalid):
        BindingLedger.from_state(state)


def test_a_fork_seals_its_whole_inherited_scope_as_baseline_on_the_parents_terms() -> None:
    parent = armed("lib", idle=10)
    parent.note_define("scratch", parent.tick(), 8)
    child = BindingLedger.for_fork(parent.fork_terms(), ["lib", "scratch", "echo"])
    assert child.fork_terms() == parent.fork_terms()
    assert child.clock == 0
    assert child.baseline() == {"lib", "scratch", "echo"}
    child.note_define("scratch", child.tick(), 8)  # rewriting an inherited name: still sealed
    child.note_define("mine", child.clock, 8)
    assert boundary(child, 1000).fell == ("mine",)


def test_a_fork_of_an_unarmed_parent_is_unarmed() -> None:
    child = BindingLedger.for_fork(BindingLedger().fork_terms(), ["x"])
    assert not child.armed


# -- reaching running work ---------------------------------------------------------------------


def _closure(captured: dict[str, Any]) -> Closure:
    body: Any = SimpleNamespace(source="{ $h }", params=(), line=1, col=1)
    return Closure(body, captured)


RUNNING = WorkerHandle("w-run")
DONE = WorkerHandle("w-done")


def is_running(h: WorkerHandle) -> bool:
    return h == RUNNING


@pytest.mark.parametrize(
    "value",
    [
        RUNNING,
        [1, [2, [RUNNING]]],
        {"a": {"b": RUNNING}},
        Variant("ok", [Variant("some", RUNNING)]),
    ],
)
def test_a_running_handle_is_reached_through_lists_maps_and_variant_payloads(value: Any) -> None:
    assert reaches_running_worker(value, is_running)


@pytest.mark.parametrize("value", [DONE, [DONE, 1, "w-run"], {"w-run": DONE}, Variant("w-run", 3)])
def test_settled_handles_and_lookalike_text_reach_no_running_work(value: Any) -> None:
    assert not reaches_running_worker(value, is_running)


def test_a_closures_captured_environment_is_never_looked_inside() -> None:
    assert not reaches_running_worker(_closure({"h": RUNNING}), is_running)
    assert not reaches_running_worker([_closure({"h": [RUNNING]})], is_running)


def test_deep_and_shared_structure_is_walked_without_recursion_or_blowup() -> None:
    deep: Any = RUNNING
    for _ in range(100_000):
        deep = [deep]
    assert reaches_running_worker(deep, is_running)
    shared: Any = [DONE]
    for _ in range(200):
        shared = [shared, shared]  # 2**200 paths, 200 distinct lists
    assert not reaches_running_worker(shared, is_running)


# -- rollback keeps renewals ----------------------------------------------------------------------


def test_carried_renewals_keep_a_name_the_rolled_back_call_used_from_falling() -> None:
    ledger = armed("lib", idle=3)
    ledger.note_define("keep", 1, 8)
    ledger.note_define("idle", 1, 8)
    checkpoint = ledger.to_state()  # the last clean boundary (epoch 3)
    restored = BindingLedger.from_state(carry_renewals(checkpoint, ["keep", "lib", "nope"], 4))
    run_until(restored, 4)
    assert boundary(restored, 4).fell == ("idle",), "only the name the call did not use falls"
    assert restored.last_use("keep") == 4
    assert "nope" not in restored.names() and "lib" not in restored.names()


def test_carried_renewals_never_shorten_a_lease() -> None:
    ledger = armed(idle=3)
    ledger.note_define("fresh", 9, 8)
    state = carry_renewals(ledger.to_state(), ["fresh"], 4)
    assert BindingLedger.from_state(state).last_use("fresh") == 9


def test_referenced_names_are_the_harvest_of_the_script_text_and_nothing_if_it_cannot_parse() -> (
    None
):
    assert referenced_names("echo $a; let b = { f $c }; g") == {"echo", "a", "f", "c", "g"}
    assert referenced_names("echo $undefined_here") == {"echo", "undefined_here"}
    assert referenced_names("echo 'unterminated") == frozenset()
