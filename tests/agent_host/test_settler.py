"""Where the control side settles an agent process's end: an end in order on the fleet's one
settler thread (no hand-off to the pool), with the same records as before; the settler's
rules (order, a failure, close)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from actors.agent import AgentOutcome
from actors.fleet import Fleet, FleetConfig
from actors.settler import Settler
from runtime.providers.scenario import parse_scenario
from runtime.providers.scripted import ScenarioPlayback
from runtime.state.durable import read_jsonl
from runtime.state.session_dir import SessionDir
from tests.support.waiting import HANG_GUARD, wait_for

WORKERS = ("w0", "w1", "w2")

SCENARIO = (
    "\n".join(
        [
            "[fleet]",
            'prompt = "start the workers"',
            "[[agents.trunk]]",
            'ral = ["' + "; ".join(f"agent {w} 'work'" for w in WORKERS) + '"]',
            "[[agents.trunk]]",
            'text = "all started"',
            'stop = "end_turn"',
        ]
        + [line for w in WORKERS for line in (f"[[agents.{w}]]", 'ral = ["reply done"]')]
    )
    + "\n"
)


def test_an_end_in_order_is_settled_on_the_settler_thread_then_reported(tmp_path: Path) -> None:
    playback = ScenarioPlayback(parse_scenario(SCENARIO, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    settled_on: dict[str, str] = {}
    settle = fleet._agent_exited

    def recording(agent: Any, outcome: AgentOutcome) -> None:
        settled_on[agent.name] = threading.current_thread().name
        settle(agent, outcome)

    fleet._agent_exited = recording  # type: ignore[method-assign]
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        wait_for(
            lambda: all(w in fleet.hosted and fleet.hosted[w].done.is_set() for w in WORKERS),
            HANG_GUARD,
            "the workers' settlements",
        )
        assert {w: settled_on[w] for w in WORKERS} == {w: "settler" for w in WORKERS}
        terminal = fleet.journal.state.terminal_records()
        assert {w: terminal[w]["kind"] for w in WORKERS} == {w: "settled" for w in WORKERS}
        receipts = {w: fleet.journal.state.nodes[w].receipts for w in WORKERS}
        assert all(len(r) == 1 and r[0]["destroyed"] for r in receipts.values())
    finally:
        fleet.close()
    records = read_jsonl(fleet.session.transcript).records
    died = {r["agent"] for r in records if r["kind"] == "Died"}
    assert set(WORKERS) <= died


def test_the_settler_settles_in_submission_order_past_a_failure_and_drains_on_close() -> None:
    settler = Settler()
    done: list[int] = []
    gate = threading.Event()

    def settle(i: int) -> None:
        if i == 0:
            gate.wait(HANG_GUARD)  # the rest queue behind the first
        if i == 3:
            raise RuntimeError("a settlement's bug")
        done.append(i)

    for i in range(8):
        settler.submit(settle, i)
    gate.set()
    settler.close()
    assert done == [0, 1, 2, 4, 5, 6, 7]


def test_an_end_submitted_after_close_is_settled_in_the_callers_thread() -> None:
    settler = Settler()
    settler.close()
    ran_on: list[str] = []
    settler.submit(lambda: ran_on.append(threading.current_thread().name))
    assert ran_on == [threading.current_thread().name]
