"""The live views of ``run`` and ``fleet`` show agents that run in processes of their own
(``--agents process``) with their figures as their processes read them, mid-run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.cli.fleet import render_tree
from exarch_actors.cli.run_report import RunReporter, agent_lines, live_agents
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import wait_for

SCENARIO = """
[fleet]
prompt = "start a helper"

[[agents.trunk]]
ral = ["agent helper 'work'"]

[[agents.trunk]]
text = "started"
stop = "end_turn"

[[agents.helper]]
ral = ["let a = 1"]

[[agents.helper]]
ral = ["sleep 30"]
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    playback = ScenarioPlayback(parse_scenario(SCENARIO, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        yield fleet
    finally:
        fleet.close()


def _text(renderable: object) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


def test_the_fleet_tree_and_run_lines_show_a_busy_agent_process_with_its_live_figures(
    fleet: Fleet,
) -> None:
    helper = wait_for(lambda: fleet.hosted.get("helper"), 60, "the helper's process")
    assert isinstance(helper, ProcessAgent) and "helper" not in fleet.agents
    wait_for(lambda: live_agents(fleet)["helper"].stats.ral_calls == 2, 60, "the helper's sleep")
    report = RunReporter(quiet=True, live=False)
    report.attach(fleet)
    try:
        tree = _text(render_tree(report))
        lines = _text(agent_lines(report))
    finally:
        report.detach()
    assert "helper working · turn 1 · 2 calls" in tree
    assert "trunk" in tree and tree.index("trunk") < tree.index("helper")
    assert "helper working · turn 1 · 2 calls" in lines
