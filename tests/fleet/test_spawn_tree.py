"""The spawn tree's pure rules: names, parent links, fuel, generations, idle-lease math."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.constants import SPAWN_FUEL, TRUNK_NAME
from exarch_actors.runtime.errors import FuelExhausted, NameTaken, UnknownAgent
from exarch_actors.runtime.fleet.spawn_tree import (
    AgentEnded,
    LeaseExpired,
    LeaseRemaining,
    SpawnTree,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_live_name_cannot_be_registered_twice_but_is_free_again_once_it_ends() -> None:
    tree = SpawnTree()
    tree.register(TRUNK_NAME, returns=False, interactive=True)
    with pytest.raises(NameTaken):
        tree.register(TRUNK_NAME, returns=True)
    tree.deregister(TRUNK_NAME)
    tree.register(TRUNK_NAME, returns=True)


def test_a_reused_name_does_not_inherit_the_previous_holders_children() -> None:
    tree = SpawnTree()
    tree.register("a", returns=True)
    tree.register("a-child", "a", returns=True)
    tree.deregister("a")
    tree.register("a", returns=True)
    assert tree.live_descendants("a") == []


def test_unknown_and_ended_names_are_distinct_typed_errors() -> None:
    tree = SpawnTree()
    with pytest.raises(UnknownAgent) as never:
        tree.get("ghost")
    assert not isinstance(never.value, AgentEnded)
    tree.register("gone", returns=True)
    tree.deregister("gone")
    with pytest.raises(AgentEnded, match="agent ended"):
        tree.get("gone")


def test_fuel_is_three_at_the_trunk_one_less_per_generation_and_refused_at_depth_three() -> None:
    tree = SpawnTree()
    tree.register(TRUNK_NAME, returns=True)
    tree.register("d1", TRUNK_NAME, returns=True)
    tree.register("d2", "d1", returns=True)
    d3 = tree.register("d3", "d2", returns=True)
    assert [tree.get(n).fuel for n in (TRUNK_NAME, "d1", "d2", "d3")] == [SPAWN_FUEL, 2, 1, 0]
    assert tree.depth("d3") == 3 and not d3.can_spawn
    with pytest.raises(FuelExhausted, match="spawn fuel exhausted") as exc:
        tree.register("d4", "d3", returns=True)
    assert exc.value.agent == "d3"
    assert not tree.is_live("d4")


def test_fan_out_never_debits_the_parents_fuel() -> None:
    tree = SpawnTree()
    tree.register(TRUNK_NAME, returns=True)
    for i in range(20):
        assert tree.register(f"c{i}", TRUNK_NAME, returns=True).fuel == SPAWN_FUEL - 1
    assert tree.get(TRUNK_NAME).fuel == SPAWN_FUEL


def test_subtree_walks_parents_before_children_and_skips_ended_nodes() -> None:
    tree = SpawnTree()
    tree.register("r", returns=True)
    tree.register("a", "r", returns=True)
    tree.register("a1", "a", returns=True)
    tree.register("b", "r", returns=True)
    tree.register("b1", "b", returns=True)
    names = [n.name for n in tree.subtree("r")]
    assert names[0] == "r" and set(names) == {"r", "a", "a1", "b", "b1"}
    assert names.index("a") < names.index("a1") and names.index("b") < names.index("b1")
    tree.deregister("b1")
    assert tree.live_descendants("r") == ["a", "a1", "b"]


def test_clear_subtree_makes_older_stamps_stale_for_that_subtree_only() -> None:
    tree = SpawnTree()
    tree.register("r", returns=True)
    tree.register("a", "r", returns=True)
    tree.register("other", returns=True)
    generation, nodes = tree.clear_subtree("r")
    assert generation == 1 and {n.name for n in nodes} == {"r", "a"}
    assert tree.is_stale("r", 0) and tree.is_stale("a", 0)
    assert not tree.is_stale("r", 1)
    assert not tree.is_stale("other", 0)


def test_the_idle_lease_is_armed_at_birth_for_returning_sub_agents_only() -> None:
    tree = SpawnTree(clock=FakeClock(), lease_bound=60)
    tree.register(TRUNK_NAME, returns=False, interactive=True)
    assert tree.register("fork", TRUNK_NAME, returns=True).lease is not None
    assert tree.register("branch", TRUNK_NAME, returns=False, interactive=True).lease is None
    assert tree.register("headless-root", returns=True).lease is None
    assert tree.lease_fire(TRUNK_NAME) is None


def test_the_lease_fires_the_remaining_margin_then_expires_measured_from_birth() -> None:
    clock = FakeClock()
    tree = SpawnTree(clock=clock, lease_bound=60)
    tree.register("p", returns=True)
    tree.register("c", "p", returns=True)
    clock.now += 45
    assert tree.lease_fire("c") == LeaseRemaining(15)
    clock.now += 15
    assert tree.lease_fire("c") == LeaseExpired(60)


def test_only_a_recorded_human_exchange_renews_the_lease_and_marks_engaged() -> None:
    clock = FakeClock()
    tree = SpawnTree(clock=clock, lease_bound=60)
    tree.register("p", returns=True)
    tree.register("c", "p", returns=True)
    clock.now += 50
    node = tree.record_exchange("c")
    assert node.engaged
    clock.now += 50
    assert tree.lease_fire("c") == LeaseRemaining(10)


def test_a_child_registered_under_a_cancelled_parent_inherits_the_cause() -> None:
    tree = SpawnTree()
    tree.register("p", returns=True)
    tree.mark_cancelled(tree.subtree("p"), "agent-cancel")
    assert tree.register("late", "p", returns=True).cancel_cause == "agent-cancel"


@pytest.mark.parametrize("name", ["", "bad/name", "..", ".hidden", "-flag", "x" * 65, "a b", "é"])
def test_a_name_that_cannot_identify_an_agent_is_refused_with_a_typed_error(name: str) -> None:
    from exarch_actors.runtime.fleet.spawn_tree import BadAgentName

    tree = SpawnTree()
    with pytest.raises(BadAgentName):
        tree.register(name, returns=False)
    assert tree.is_empty()


@pytest.mark.parametrize("name", ["trunk", "w-1", "lo", "a.b", "_x", "x" * 64, "worker-12"])
def test_ordinary_agent_names_register(name: str) -> None:
    tree = SpawnTree()
    assert tree.register(name, returns=False).name == name


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(st.data())
def test_has_live_descendants_answers_as_the_walk_of_live_descendants_does(
    data: st.DataObject,
) -> None:
    """Random trees, random ends (a parent may end before its children, a name may return):
    the one-level read agrees with the walk for every live node after every step."""
    tree = SpawnTree()
    tree.register(TRUNK_NAME, returns=False, interactive=True)
    names = [f"n{i}" for i in range(8)]
    for _ in range(data.draw(st.integers(1, 30))):
        live = tree.names()
        name = data.draw(st.sampled_from(names))
        if tree.is_live(name):
            tree.deregister(name)
        elif live:
            parent = data.draw(st.sampled_from(live))
            with contextlib.suppress(FuelExhausted):
                tree.register(name, parent, returns=True)
        for node in tree.names():
            assert tree.has_live_descendants(node) == bool(tree.live_descendants(node))
