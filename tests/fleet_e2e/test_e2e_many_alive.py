"""Many process agents alive at once (issue 33): a batch of ``agent`` verbs in one ral call boots
its children side by side (``Fleet.spawn(born_later=True)``), every child is alive together,
one cancel of the tree ends them all and leaves no process behind, and a child whose process
ends before it is born is reported to its parent's ``agent-wait`` as failed, its slot settled.

Real runs: a fleet in this process with real agent processes and shell hosts (``--agents
process``). No wall-clock bound here: the growth figures are ``benchmarks/thousand_agents.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_support import FleetRun, assert_check_holds, finish, fleet_factory

import exarch_actors.actors.agent_process as agent_process_module
from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import FleetConfig
from exarch_actors.runtime.events import Born, Died, Notice
from tests.support.fork_probe import exit_before_born
from tests.support.waiting import pid_alive, wait_for

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

CHILDREN = 120


def holding(children: int) -> str:
    """A trunk that forks ``children`` children in one call, each busy in a long ``sleep``,
    and then waits for them all."""
    return f"""
    [fleet]
    prompt = "fork and hold"

    [[agents.trunk]]
    ral = ['for i in (range {children}) {{ agent "c-$i" "hold" }}']

    [[agents.trunk]]
    ral = ["len (keys (agent-wait))"]

    [[agents.trunk]]
    text = "done"
    stop = "end_turn"

    [[agents."c-*"]]
    ral = ["sleep 600"]
    """


def collected(run: FleetRun) -> list[str]:
    """The children the trunk's ``agent-wait`` collected (its ``Collected`` notices)."""
    return [
        c
        for _, e in list(run.recorder.events)
        if isinstance(e, Notice) and e.notice == "Collected" and e.data.get("via") == "agent-wait"
        for c in e.data["children"]
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_batch_of_120_agent_verbs_has_every_child_alive_together_and_one_cancel_leaves_no_process(
    fleet_of: Callable[..., FleetRun],
) -> None:
    run = fleet_of(holding(CHILDREN), FleetConfig(agents="process"))
    fleet = run.fleet
    fleet.start_trunk(run.prompt, interactive=True)
    names = [f"c-{i}" for i in range(CHILDREN)]

    def births() -> list[float]:
        return [t for t, e in list(run.recorder.events) if isinstance(e, Born) and e.parent]

    wait_for(lambda: len(births()) == CHILDREN, 200, f"{CHILDREN} children born")
    last_born = max(births())
    died_before = [
        e for t, e in list(run.recorder.events) if isinstance(e, Died) and t <= last_born
    ]
    assert died_before == []  # when the last was born, every other one was alive
    kids = [fleet.hosted[n] for n in names]
    assert all(isinstance(a, ProcessAgent) for a in kids)
    pids = [a.pid for a in kids] + [a.shell_pid() for a in kids]
    assert all(p and pid_alive(p) for p in pids)
    assert len(set(fleet.registry.live_descendants("trunk"))) == CHILDREN

    fleet.registry.cancel_descendants("trunk", "the test's cascade")
    wait_for(lambda: all(a.done.is_set() for a in kids), 120, "every child settled")
    wait_for(lambda: not [p for p in pids if p and pid_alive(p)], 120, "every process gone")
    assert {a.outcome.value for a in kids if a.outcome is not None} == {"cancelled"}
    nodes = fleet.journal.state.nodes
    assert all(not nodes[n].open for n in names)  # every slot settled
    wait_for(  # the trunk's agent-wait collected every end, once
        lambda: len(collected(run)) == CHILDREN, 60, "every end collected by agent-wait"
    )
    assert sorted(collected(run)) == sorted(names)
    finish(run)
    assert_check_holds(run.session)


def test_a_child_whose_process_ends_before_it_is_born_is_reported_failed_to_agent_wait(
    fleet_of: Callable[..., FleetRun], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    wait_gate = f"sh -c 'until test -e {gate}; do sleep 0.02; done'"
    run = fleet_of(
        f"""
        [fleet]
        prompt = "one child"

        [[agents.trunk]]
        ral = ["{wait_gate}; agent c-1 'fails to start'; agent-wait"]

        [[agents.trunk]]
        text = "done"
        stop = "end_turn"
        """,
        FleetConfig(agents="process"),
    )
    fleet = run.fleet
    fleet.start_trunk(run.prompt, interactive=True)
    # the child's process: a real one that exits before its Born (and no warm one to take)
    assert fleet.host_pool is not None
    fleet.host_pool.close()
    fleet.host_pool = None
    monkeypatch.setattr(agent_process_module, "agent_process_main", exit_before_born)
    gate.touch()  # the trunk spawns c-1 only now
    wait_for(lambda: collected(run) == ["c-1"], 120, "c-1's end collected by agent-wait")
    answer = wait_for(
        lambda: [json.dumps(e) for e in run.events("trunk") if e["kind"] == "tool_result"],
        60,
        "the trunk's tool result",
    )[-1]
    assert 'outcome: \\"failed\\"' in answer and "spawn failed" in answer, answer
    node = fleet.journal.state.nodes["c-1"]
    assert not node.open
    assert fleet.registry.lookup("c-1") is None
    finish(run)
    assert_check_holds(run.session)
