"""The process backend: every agent of a fleet in an OS process of its own, supervised.

Real processes throughout: the agents' hosts and shells are forked from the control process's
one fork server; a SIGKILL is a real signal; the session directory is checked from its files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from actors.agent_process import ProcessAgent
from actors.fleet import Fleet, FleetConfig
from runtime.durable import read_jsonl
from runtime.providers.scenario import parse_scenario
from runtime.providers.scripted import ScenarioPlayback
from runtime.session_dir import SessionDir
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 19
VICTIM = "w07"


def _scenario() -> str:
    spawns = "; ".join(f"agent w{i:02d} 'work'" for i in range(WORKERS))
    lines = [
        "[fleet]",
        'prompt = "start the workers"',
        "[[agents.trunk]]",
        f'ral = ["{spawns}"]',
        "[[agents.trunk]]",
        'text = "all started"',
        'stop = "end_turn"',
    ]
    for i in range(WORKERS):
        name = f"w{i:02d}"
        busy = "sleep 3; " if name == VICTIM else ""
        lines += [f"[[agents.{name}]]", f'ral = ["{busy}let x = {i}; reply $x"]']
    return "\n".join(lines) + "\n"


@pytest.fixture
def process_fleet(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []

    def start(toml: str) -> Fleet:
        playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
        fleet = Fleet(
            SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
        )
        fleets.append(fleet)
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        return fleet

    yield start
    for fleet in fleets:
        fleet.close()


def _transcript(fleet: Fleet) -> list[dict[str, Any]]:
    fleet.bus.flush()
    return read_jsonl(fleet.session.transcript).records


def test_a_20_agent_fleet_runs_each_agent_in_its_own_process_and_survives_a_sigkill(
    process_fleet: Callable[..., Fleet],
) -> None:
    fleet = process_fleet(_scenario())
    victim = wait_for(lambda: fleet.hosted.get(VICTIM), 60, "the victim's process")
    assert isinstance(victim, ProcessAgent)
    first_pid = victim.pids[0]
    wait_for(  # mid-run: its ral call is in flight
        lambda: (
            any(
                r.get("kind") == "assistant"
                for r in read_jsonl(fleet.session.events(VICTIM)).records
            )
            if fleet.session.events(VICTIM).exists()
            else False
        ),
        60,
        "the victim's call in flight",
    )
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: not fleet.registry.live_descendants("trunk"), 120, "every worker settled")
    transcript = _transcript(fleet)
    born = {r["agent"]: r["pid"] for r in transcript if r["kind"] == "Born"}
    assert len(born) == WORKERS + 1
    assert len(set(born.values())) == WORKERS + 1, "one process per agent"
    assert os.getpid() not in born.values(), "no agent ran in the control process"

    restarted = [r for r in transcript if r.get("notice") == "Restarted"]
    down = [r for r in transcript if r.get("notice") == "Down"]
    assert [r["agent"] for r in restarted + down] == [VICTIM]
    if restarted:
        assert restarted[0]["data"]["pid"] not in (first_pid, None)
        assert victim.outcome is not None and victim.outcome.value == "replied"
    others = [fleet.hosted[f"w{i:02d}"] for i in range(WORKERS) if f"w{i:02d}" != VICTIM]
    assert all(a.outcome is not None and a.outcome.value == "replied" for a in others)

    pids = {p for a in fleet.hosted.values() if isinstance(a, ProcessAgent) for p in a.pids}
    fy = fleet.close()
    assert fy.spawned == WORKERS and fy.never_settled == 0
    assert not [p for p in pids if _alive(p)], "no process left behind"
    fleet.write_result("quiesced", None)
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cli.main import main; main()",
            "check",
            str(fleet.session.root),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
