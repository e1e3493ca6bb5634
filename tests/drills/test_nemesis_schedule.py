"""The nemesis: a seed fixes the whole fault sequence; the generated scenario carries it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.drills.nemesis import (
    FAULT_KINDS,
    SCRIPTED,
    BadFaults,
    fault_schedule,
    parse_faults,
    place_scripted,
    synthetic_scenario,
)
from exarch_actors.runtime.providers.scenario import parse_scenario


def test_a_fixed_seed_produces_the_same_fault_sequence_twice() -> None:
    a = fault_schedule(1234, 4.0, FAULT_KINDS, 30.0)
    b = fault_schedule(1234, 4.0, FAULT_KINDS, 30.0)
    assert a == b and len(a) > 50
    assert fault_schedule(1235, 4.0, FAULT_KINDS, 30.0) != a


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    rate=st.floats(0.1, 20),
    kinds=st.sets(st.sampled_from(FAULT_KINDS), min_size=1),
)
def test_every_schedule_is_ordered_within_the_duration_and_uses_only_chosen_kinds(
    seed: int, rate: float, kinds: set[str]
) -> None:
    sched = fault_schedule(seed, rate, sorted(kinds), 5.0)
    assert [f.at for f in sched] == sorted(f.at for f in sched)
    assert all(0 < f.at < 5.0 and f.kind in kinds for f in sched)
    assert [f.seq for f in sched] == list(range(len(sched)))
    assert sched == fault_schedule(seed, rate, sorted(kinds), 5.0)


def test_unknown_fault_kinds_and_a_zero_rate_are_refused() -> None:
    with pytest.raises(BadFaults, match="bogus"):
        parse_faults("panic,bogus")
    with pytest.raises(BadFaults):
        fault_schedule(1, 0.0, ["panic"], 1.0)
    assert parse_faults("all") == FAULT_KINDS


def test_the_synthetic_scenario_parses_and_embeds_each_placed_scripted_fault() -> None:
    sched = fault_schedule(7, 10.0, SCRIPTED, 3.0)
    placed = place_scripted(sched, 4, 3)
    toml = synthetic_scenario(4, 3, placed=placed)
    scenario = parse_scenario(toml, source="gen.toml")
    assert set(scenario.agents) == {"trunk", "worker-0", "worker-1", "worker-2", "worker-3"}
    per = {i: len(scenario.script_for(f"worker-{i}")) for i in range(4)}
    for i in range(4):
        extra = sum(
            1 + (p.fault.param % 3 if p.fault.kind == "rate-limit" else 0)
            for p in placed
            if p.child == i
        )
        assert per[i] == 3 + 1 + extra
    assert toml == synthetic_scenario(4, 3, placed=place_scripted(sched, 4, 3))
