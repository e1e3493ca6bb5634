"""Where the control side settles an agent process's end: an end in order on its own channel's
reader (no hand-off to the fleet's pool), with the same records as before."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from actors.agent import AgentOutcome
from actors.fleet import Fleet, FleetConfig
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


def test_an_end_in_order_is_settled_on_its_channels_reader_then_reported(tmp_path: Path) -> None:
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
        assert {w: settled_on[w] for w in WORKERS} == {
            w: f"channel-agent process {w}" for w in WORKERS
        }
        terminal = fleet.journal.state.terminal_records()
        assert {w: terminal[w]["kind"] for w in WORKERS} == {w: "settled" for w in WORKERS}
        receipts = {w: fleet.journal.state.nodes[w].receipts for w in WORKERS}
        assert all(len(r) == 1 and r[0]["destroyed"] for r in receipts.values())
    finally:
        fleet.close()
    records = read_jsonl(fleet.session.transcript).records
    died = {r["agent"] for r in records if r["kind"] == "Died"}
    assert set(WORKERS) <= died
