"""The process backend: every agent of a fleet in an OS process of its own, supervised.

Real processes throughout: the agents' hosts and shells are forked from the control process's
one fork server; a SIGKILL is a real signal; the session directory is checked from its files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.busy import busy_in_its_call
from tests.support.waiting import pid_alive, wait_for

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
        if name == VICTIM:  # its restart plays on after the killed call: the call again
            lines.append("repeat = 2")
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


@pytest.mark.slow
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
    assert not [p for p in pids if pid_alive(p)], "no process left behind"
    fleet.write_result("quiesced", None)
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from exarch_actors.cli.main import main; main()",
            "check",
            str(fleet.session.root),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _sleepers(n: int, seconds: int) -> str:
    spawns = "; ".join(f"agent s{i} 'sleep'" for i in range(n))
    lines = [
        "[fleet]",
        'prompt = "start"',
        "[[agents.trunk]]",
        f'ral = ["{spawns}"]',
        "[[agents.trunk]]",
        'text = "started"',
        'stop = "end_turn"',
        "repeat = 20",
        '[[agents."s*"]]',
        f'ral = ["sleep {seconds}; reply 1"]',
        "repeat = 5",  # a restart plays on after the killed call: the call again, killed again
    ]
    return "\n".join(lines) + "\n"


def test_a_full_inbox_in_an_agent_process_rejects_the_65th_message_to_its_producer(
    process_fleet: Callable[..., Fleet],
) -> None:
    from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
    from exarch_actors.runtime.errors import InboxFull

    fleet = process_fleet(_sleepers(1, 30))
    wait_for(lambda: busy_in_its_call(fleet, "s0"), 60, "s0 busy in its sleep")
    accepted, rejected = 0, []
    for i in range(INBOX_SOURCE_CAP + 5):
        try:
            fleet.registry.message("producer", "s0", f"m{i}")
            accepted += 1
        except InboxFull as e:
            rejected.append(e)
    assert accepted == INBOX_SOURCE_CAP
    assert len(rejected) == 5 and all(e.cap == INBOX_SOURCE_CAP for e in rejected)


def test_cancelling_the_trunk_stops_every_busy_agent_process_and_settles_each_cancelled(
    process_fleet: Callable[..., Fleet],
) -> None:
    fleet = process_fleet(_sleepers(5, 60))
    names = [f"s{i}" for i in range(5)]
    wait_for(lambda: all(busy_in_its_call(fleet, n) for n in names), 60, "every sleeper busy")
    fleet.cancel_all("test")
    wait_for(lambda: fleet.wait_empty(0), 30, "the fleet empty")
    assert all(fleet.hosted[n].outcome is not None for n in names)
    assert {fleet.hosted[n].outcome.value for n in names} == {"cancelled"}  # type: ignore[union-attr]
    fy = fleet.close()
    assert fy.cancelled == 5 and fy.never_settled == 0


def test_an_agent_process_killed_four_times_in_a_minute_settles_down_and_its_parent_is_told(
    process_fleet: Callable[..., Fleet],
) -> None:
    fleet = process_fleet(_sleepers(1, 30))
    victim = wait_for(lambda: fleet.hosted.get("s0"), 60, "s0's process")
    assert isinstance(victim, ProcessAgent)
    for kill in range(4):
        wait_for(lambda k=kill: len(victim.pids) == k + 1, 60, f"start {kill + 1}")  # type: ignore[misc]
        os.kill(victim.pids[-1], signal.SIGKILL)
    assert victim.wait(60)
    assert victim.outcome is not None and victim.outcome.value == "failed"
    assert victim.restarts == 3
    transcript = _transcript(fleet)
    down = [r for r in transcript if r.get("notice") == "Down"]
    assert len(down) == 1 and "signal 9" in down[0]["text"]
    died = [r for r in transcript if r["kind"] == "Died" and r["agent"] == "s0"]
    assert len(died) == 1 and "down" in (died[0]["cause"] or "")
    told = wait_for(
        lambda: [
            e
            for e in read_jsonl(fleet.session.events("trunk")).records
            if e["kind"] == "user" and "agent s0 finished: failed" in json.dumps(e)
        ],
        30,
        "the trunk told",
    )
    assert told
    fy = fleet.close()
    assert fy.down == 1 and fy.never_settled == 0


def _exarch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
def test_run_with_agents_process_prints_the_fanout_reply_from_three_agent_processes(
    tmp_path: Path,
) -> None:
    session = tmp_path / "s"
    p = _exarch(
        "run",
        str(ROOT / "examples" / "fanout.toml"),
        "--agents",
        "process",
        "--session-dir",
        str(session),
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "499500"
    born = [r for r in read_jsonl(session / "transcript.jsonl").records if r["kind"] == "Born"]
    assert sorted(r["agent"] for r in born) == ["hi", "lo", "trunk"]
    assert all(r["node"] == "local" for r in born)  # the local backend is the default
    assert len({r["pid"] for r in born}) == 3


@pytest.mark.slow
def test_run_records_with_agents_process_and_the_recording_plays_back_to_the_same_reply(
    tmp_path: Path,
) -> None:
    recording = tmp_path / "r.toml"
    p = _exarch(
        "run",
        str(ROOT / "examples" / "fanout.toml"),
        "--agents",
        "process",
        "--record",
        str(recording),
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    text = recording.read_text()
    assert "lo, reply 1 (spawned by trunk)" in text and "hi, reply 1 (spawned by trunk)" in text
    again = _exarch("run", str(recording), "--agents", "process", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == p.stdout.strip() == "499500"
