"""Fan-in: ``agent-wait`` collects many children in one ral call, ``agent-result`` reads one
(a reply a full inbox refused included), and nothing reaches the parent twice or not at all.

Real runs: the ``exarch-actors run`` command in a subprocess, or a fleet in this process (for
what must be done mid-run: an interrupt of the waiting call, a gate opened once the inbox holds
a result), with real agent processes (``--agents process``) and real shell hosts. Each session
must satisfy ``check`` (``runtime/drills/invariant_check.py``), whose ``rejections`` invariant
accounts for a result that reached its parent through the wait or a read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_support import FleetRun, assert_check_holds, finish, fleet_factory

from exarch_actors.actors.fleet import FleetConfig
from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
from tests.agent.conftest import Run, scenario_run
from tests.support.waiting import wait_for

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

BACKENDS = ("thread", "process")

CHILD = (
    "let parts = split (env EXARCH_SCRATCH) '/'; let me = $parts[-1]; "
    "let bits = split $me '-'; reply (int $bits[1])"
)
"""A child ``c-N`` replies N (its name is its scratch directory's)."""

SUM = "let total = fold { |a, n| add $a $ends[$n][reply] } 0 (keys $ends)"


def fan_in(children: int) -> str:
    """A trunk that forks ``children`` children in one call, collects them with one
    ``agent-wait`` and replies with the sum of their replies (then once more, verified)."""
    return f"""
    [fleet]
    prompt = "Fork {children} children and reply with the sum of their replies."

    [[agents.trunk]]
    ral = ['for i in (range {children}) {{ agent "c-$i" "Reply with your number." }}']

    [[agents.trunk]]
    ral = ["let ends = agent-wait; {SUM}; reply $total"]

    [[agents.trunk]]
    ral = ["reply $total"]

    [[agents."c-*"]]
    ral = ["{CHILD}"]
    """


def run_cli(tmp_path: Path, toml: str, backend: str, timeout: float = 60) -> Run:
    return scenario_run(tmp_path, toml, "--agents", backend, timeout=timeout)


def transcript_of(session: Path, kind: str) -> list[dict[str, Any]]:
    from exarch_actors.runtime.state.durable import read_jsonl

    return [r for r in read_jsonl(session / "transcript.jsonl").records if r.get("kind") == kind]


def collected(session: Path, via: str) -> list[str]:
    return [
        c
        for r in transcript_of(session, "Notice")
        if r.get("notice") == "Collected" and r["data"]["via"] == via
        for c in r["data"]["children"]
    ]


def result_turns(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in events if e["kind"] == "user" and e["source"] == "agent_result"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_wait_returns_every_childs_reply_in_one_call_and_none_arrives_again_as_a_turn(
    tmp_path: Path, backend: str
) -> None:
    run = run_cli(tmp_path, fan_in(20), backend)
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == str(sum(range(20)))
    trunk = run.events("trunk")
    assert result_turns(trunk) == []  # every reply came through the wait, none as a turn
    assert sorted(collected(run.session, "agent-wait")) == sorted(f"c-{i}" for i in range(20))
    spawn_and_after = [e for e in trunk if e["kind"] == "assistant"]
    assert len(spawn_and_after) == 3  # spawn, wait and reply, the verified reply
    assert_check_holds(run.session)


FAILING = f"""
[fleet]
prompt = "Two helpers."

[[agents.trunk]]
ral = ["agent c-1 'fine'; agent broken 'fails'; let ends = agent-wait; reply $ends"]

[[agents.trunk]]
ral = ["reply $ends"]

[[agents.c-1]]
ral = ["{CHILD}"]

[[agents.broken]]
error = "rejected"
error_message = "the endpoint refused the request"
"""


@pytest.mark.slow
def test_a_child_that_fails_is_reported_by_agent_wait_with_its_outcome_and_reason(
    tmp_path: Path,
) -> None:
    run = run_cli(tmp_path, FAILING, "thread")
    assert run.code == 0, run.stderr
    out = run.stdout
    assert 'c-1: [outcome: "replied", reply: 1]' in out, out
    m = re.search(r'broken: \[outcome: "failed", reason: "([^"]*)"\]', out)
    assert m is not None, out
    assert "provider rejected" in m.group(1) and "refused the request" in m.group(1), m.group(1)
    assert_check_holds(run.session)


def gated_call(gate: Path) -> str:
    """A program that waits for ``gate`` to exist."""
    return f"sh -c 'until test -e {gate}; do sleep 0.02; done'"


def gated(gate: Path, value: int) -> str:
    """A child's script: wait for ``gate`` to exist, then reply ``value``."""
    return f"{gated_call(gate)}; reply {value}"


def live_config(backend: str) -> FleetConfig:
    return FleetConfig(agents="process") if backend == "process" else FleetConfig()


def inbox_depth(run: FleetRun, agent: str, source: str) -> int:
    return int(run.fleet.hosted[agent].inbox.depths().get(source, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelling_the_waiting_call_leaves_the_child_running_and_its_reply_arrives_as_a_turn(
    fleet_of: Callable[..., FleetRun], tmp_path: Path, backend: str
) -> None:
    gate = tmp_path / "gate"
    run = fleet_of(
        f"""
        [fleet]
        prompt = "wait for slow"
        [[agents.trunk]]
        ral = ["agent c-1 'slow'; agent-wait c-1"]
        [[agents.trunk]]
        text = "got it"
        stop = "end_turn"
        [[agents.c-1]]
        ral = ["{gated(gate, 7)}"]
        """,
        live_config(backend),
    )
    fleet = run.fleet
    fleet.start_trunk(run.prompt, interactive=True)
    wait_for(lambda: fleet.fanin.state._waits, 30, "the trunk waiting on c-1")
    fleet.registry.interrupt("trunk")  # Esc: the call stops, the tree does not
    io = run.recorder.wait_for("Io", "trunk", timeout=30)
    assert io.error is not None and "cancel" in (io.error + io.value).lower(), io
    assert not fleet.fanin.state._waits  # withdrawn
    assert fleet.registry.is_live("c-1")  # still running
    gate.touch()
    died = run.recorder.wait_for("Died", "c-1", timeout=30)
    assert died.outcome == "replied"
    wait_for(lambda: result_turns(run.events("trunk")), 30, "c-1's reply as a turn")
    assert result_turns(run.events("trunk")) == ["[agent c-1 finished: replied]\n7"]
    assert collected(run.session, "agent-wait") == []
    finish(run)
    assert_check_holds(run.session)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reply_queued_before_the_wait_began_is_returned_by_it_and_taken_out_of_the_inbox(
    fleet_of: Callable[..., FleetRun], tmp_path: Path, backend: str
) -> None:
    gate = tmp_path / "gate"
    run = fleet_of(
        f"""
        [fleet]
        prompt = "collect"
        [[agents.trunk]]
        ral = ["agent c-5 'quick'"]
        [[agents.trunk]]
        ral = ["{gated_call(gate)}; let ends = agent-wait; reply $ends"]
        [[agents.trunk]]
        ral = ["reply $ends"]
        [[agents.c-5]]
        ral = ["{CHILD}"]
        """,
        live_config(backend),
    )
    fleet = run.fleet
    fleet.start_trunk(run.prompt)
    wait_for(lambda: inbox_depth(run, "trunk", "agent_result") == 1, 30, "c-5's result queued")
    gate.touch()
    died = run.recorder.wait_for("Died", "trunk", timeout=30)
    assert died.reply == '[c-5: [outcome: "replied", reply: 5]]'
    finish(run)
    assert result_turns(run.events("trunk")) == []  # returned by the wait, never a turn
    assert collected(run.session, "agent-wait") == ["c-5"]
    assert_check_holds(run.session)


HELD = 300


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_hundred_children_all_reach_the_trunk_through_one_agent_wait(
    tmp_path: Path,
) -> None:
    """``--agents thread``: 300 agent processes do not fit a CI box's two cores in time."""
    run = run_cli(tmp_path, fan_in(HELD), "thread", timeout=540)
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == str(sum(range(HELD)))
    assert result_turns(run.events("trunk")) == []
    assert sorted(collected(run.session, "agent-wait")) == sorted(f"c-{i}" for i in range(HELD))
    assert_check_holds(run.session)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_hundred_replies_refused_by_a_full_inbox_are_all_read_back_with_agent_result(
    fleet_of: Callable[..., FleetRun], tmp_path: Path
) -> None:
    """The trunk is busy (gated) while 300 children reply: its inbox queues the first 64
    results and refuses the rest (recorded, the quota untouched); then it reads every one with
    ``agent-result`` and replies with their sum. ``--agents thread``, for CI's two cores."""
    gate = tmp_path / "gate"
    read_all = (
        f'let total = fold {{ |a, i| add $a (get (agent-result "c-$i") reply) }} 0 (range {HELD})'
    )
    run = fleet_of(
        f"""
        [fleet]
        prompt = "fork and read back"
        [[agents.trunk]]
        ral = ['for i in (range {HELD}) {{ agent "c-$i" "Reply with your number." }}']
        [[agents.trunk]]
        ral = ['''{gated_call(gate)}; {read_all}; reply $total''']
        [[agents.trunk]]
        ral = ["reply $total"]
        [[agents."c-*"]]
        ral = ["{CHILD}"]
        """
    )
    fleet = run.fleet
    fleet.start_trunk(run.prompt)
    refused = HELD - INBOX_SOURCE_CAP
    wait_for(lambda: len(fleet.fanin.state.held_names("trunk")) == refused, 300, "refusals held")
    assert inbox_depth(run, "trunk", "agent_result") == INBOX_SOURCE_CAP  # the quota held
    gate.touch()
    died = run.recorder.wait_for("Died", "trunk", timeout=300)
    assert died.reply == str(sum(range(HELD)))
    finish(run)
    rejected = [
        r["message"]["child"]
        for r in transcript_of(run.session, "InboxRejected")
        if r["reason"] == "inbox full"
    ]
    assert len(rejected) == refused
    read = collected(run.session, "agent-result")
    assert sorted(read) == sorted(f"c-{i}" for i in range(HELD))
    assert result_turns(run.events("trunk")) == []  # the 64 queued were taken by the reads
    assert_check_holds(run.session)


@pytest.mark.slow
def test_a_parent_is_told_of_held_replies_once_in_one_notice_with_its_next_turn(
    fleet_of: Callable[..., FleetRun], tmp_path: Path
) -> None:
    """70 children reply while the (conversing) trunk is busy: 64 results are queued, 6 held.
    Its next turn, the first queued result, carries the one notice (not 64 turns later), and
    its ``agent-wait`` there takes the other 63 queued and the 6 held."""
    gate = tmp_path / "gate"
    n = INBOX_SOURCE_CAP + 6
    run = fleet_of(
        f"""
        [fleet]
        prompt = "fork"
        [[agents.trunk]]
        ral = ['for i in (range {n}) {{ agent "c-$i" "Reply with your number." }}']
        [[agents.trunk]]
        ral = ["{gated_call(gate)}"]
        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"
        [[agents.trunk]]
        ral = ["let ends = agent-wait; len $ends"]
        [[agents.trunk]]
        text = "done"
        stop = "end_turn"
        [[agents."c-*"]]
        ral = ["{CHILD}"]
        """
    )
    fleet = run.fleet
    fleet.start_trunk(run.prompt, interactive=True)
    wait_for(lambda: len(fleet.fanin.state.held_names("trunk")) == 6, 120, "6 refusals held")
    gate.touch()
    io = run.recorder.wait_for("Io", "trunk", timeout=120, where=lambda e: "agent-wait" in e.script)
    assert io.error is None and io.value == f"[value]\n{n - 1}", io  # all but the turn's own
    wait_for(lambda: fleet.hosted["trunk"].stats.state == "idle", 30, "trunk parked")
    finish(run)
    events = run.events("trunk")
    notices = [e["text"] for e in events if e["kind"] == "user" and e["source"] == "held_replies"]
    assert len(notices) == 1, notices
    assert notices[0].startswith("[held replies]\n6 replies from your children were held back")
    users = [e["source"] for e in events if e["kind"] == "user"]
    assert users[1:] == ["agent_result", "held_replies"]  # told with the first result turn
    assert_check_holds(run.session)
