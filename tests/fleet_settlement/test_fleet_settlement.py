"""Settlement through the real fleet: every child reaches exactly one terminal record.

These drive :class:`actors.fleet.Fleet` in-process with the scripted provider and real shell
processes, so a test can SIGKILL a child's shell at a chosen moment (the local analogue of the
field report's stopped sandbox) and then read the session directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from exarch_actors.actors.fleet import Fleet
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.journal import replay
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import wait_for as _wait_for

ROOT = Path(__file__).resolve().parents[2]


def _fleet(tmp_path: Path, toml: str) -> tuple[Fleet, str]:
    scenario = parse_scenario(textwrap.dedent(toml), source="inline.toml")
    playback = ScenarioPlayback(scenario)
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"),
        lambda name: make_provider("scripted", scenario=playback, agent_name=name),
    )
    assert scenario.prompt is not None
    return fleet, scenario.prompt


@pytest.fixture
def journal_of() -> Iterator[Any]:
    def read(session: Path) -> list[dict[str, Any]]:
        return read_jsonl(session / "spawn-journal.jsonl").records

    yield read


def test_a_child_killed_before_release_settles_release_unconfirmed_and_keeps_its_work(
    tmp_path: Path, journal_of: Any
) -> None:
    fleet, prompt = _fleet(
        tmp_path,
        """
        [fleet]
        prompt = "delegate"
        [[agents.trunk]]
        ral = ["agent victim 'work'"]
        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"
        [[agents.trunk]]
        ral = ["reply 'victim settled'"]
        [[agents.trunk]]
        ral = ["reply 'victim settled'"]
        [[agents.victim]]
        ral = ["let found = 42"]
        [[agents.victim]]
        text = "thinking for a while"
        stop = "end_turn"
        delay_ms = 1500
        """,
    )
    trunk = fleet.start_trunk(prompt)
    _wait_for(lambda: "victim" in fleet.agents and fleet.agents["victim"].stats.ral_calls >= 1)
    victim = fleet.agents["victim"]
    pid = victim.shell_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the sandbox stops while the model is thinking
    assert fleet.wait_empty(30)
    fy = fleet.close()
    fleet.write_result(trunk.outcome.value if trunk.outcome else "failed", None)

    session = tmp_path / "session"
    records = [r for r in journal_of(session) if r["id"] == "victim"]
    kinds = [r["kind"] for r in records]
    settled = [r for r in records if r["kind"] == "settled"]
    assert [s.get("retainedExecution") for s in settled] == ["pending", "release-unconfirmed"]
    assert "reconciled" in kinds
    unconfirmed = [r for r in records if r["kind"] == "teardown-unconfirmed"]
    assert unconfirmed and unconfirmed[-1]["pid"] == pid
    assert unconfirmed[-1]["scratch"].endswith("scratch/victim")
    results = [r for r in records if r["kind"] == "execution-result"]
    assert any(r.get("source") == "release-sweep" and r["events"] for r in results)
    kept = session / "retained" / "victim" / "snapshot.msgpack"
    assert kept.is_file() and kept.stat().st_size > 0
    assert fy.never_settled == 0 and fy.release_unconfirmed == 1
    state = replay(session / "spawn-journal.jsonl").state
    assert state.never_settled == []


@pytest.mark.slow
def test_a_fanout_of_50_children_with_random_crashes_ends_with_never_settled_zero(
    tmp_path: Path,
) -> None:
    crash = "python3 -c 'import os, random; random.random() < 0.4 and os.kill(os.getppid(), 9)'"
    fleet, prompt = _fleet(
        tmp_path,
        f"""
        [fleet]
        prompt = "fan out"
        [[agents.trunk]]
        ral = ["for i in (range 50) {{ agent \\"w-$i\\" 'work' }}"]
        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"
        repeat = 60
        [[agents."w-*"]]
        ral = ["let a = 1", "{crash}"]
        [[agents."w-*"]]
        ral = ["reply $a"]
        """,
    )
    trunk = fleet.start_trunk(prompt)
    assert fleet.wait_empty(120)
    fy = fleet.close()
    fleet.write_result(trunk.outcome.value if trunk.outcome else "failed", None)
    assert fy.spawned == 50
    assert fy.never_settled == 0
    assert fy.done + fy.down + fy.cancelled == 50
    rollbacks = read_jsonl(tmp_path / "session" / "record.jsonl").records
    assert any(r["kind"] == "Rollback" for r in rollbacks), "some shells really crashed"
    for name in (f"w-{i}" for i in range(50)):
        assert (tmp_path / "session" / "agents" / name / "snapshot.msgpack").is_file()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_the_chain_example_meets_the_fuel_limit_at_depth_three(tmp_path: Path) -> None:
    p = _cli(
        "fleet", str(ROOT / "examples" / "chain.toml"), "--session-dir", "s", "--json", cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["fleetYield"]["spawned"] == 3 and out["fleetYield"]["neverSettled"] == 0
    io = [r for r in read_jsonl(tmp_path / "s" / "transcript.jsonl").records if r["kind"] == "Born"]
    fuel = {r["agent"]: r["fuel"] for r in io}
    assert fuel == {"trunk": 3, "a": 2, "b": 1, "c": 0}
    replies = {
        r["id"]: r.get("reply")
        for r in read_jsonl(tmp_path / "s" / "spawn-journal.jsonl").records
        if r["kind"] == "execution-result"
    }
    assert "spawn fuel exhausted" in (replies["c"] or "")


def test_the_crashing_example_rolls_back_one_child_and_settles_one_down(tmp_path: Path) -> None:
    p = _cli(
        "fleet",
        str(ROOT / "examples" / "crashing.toml"),
        "--session-dir",
        "s",
        "--json",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    fy = json.loads(p.stdout)["fleetYield"]
    assert (fy["spawned"], fy["done"], fy["down"], fy["neverSettled"]) == (3, 2, 1, 0)
    records = read_jsonl(tmp_path / "s" / "record.jsonl").records
    assert [r["agent"] for r in records if r["kind"] == "Rollback"] == ["crashy"]
    replies = {
        r["id"]: r.get("reply")
        for r in read_jsonl(tmp_path / "s" / "spawn-journal.jsonl").records
        if r["kind"] == "execution-result"
    }
    assert replies["crashy"] == "42" and replies["steady"] == "42"


def test_no_process_of_a_finished_fleet_is_left_running(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    p = _cli("run", str(ROOT / "examples" / "fanout.toml"), "--session-dir", "s", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    pids = {
        r["pid"] for r in read_jsonl(tmp_path / "s" / "spawn-journal.jsonl").records if r.get("pid")
    }
    assert pids
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
