"""A control process killed between a child's settlement and its ``Died`` (issue 34, item 8):
``resume`` gives the child exactly one terminal story -- one settlement in the journal, one
``Died`` on the bus saying the outcome the journal recorded, its result in its parent's log --
and ``check`` holds.

The kill is forced at the window by a crash point (``runtime/drills/fault_switch.py``), not
timed: the control process SIGKILLs itself right after ``quick``'s settlement record, before its
result is delivered (``settled-before-delivery``), or after the delivery and before its
``Died`` (``delivered-before-died``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exarch_actors.actors.resume import resume_run
from exarch_actors.runtime.drills.fault_switch import CRASH_AT_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.run_processes import leftover_processes
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import logged_results
from tests.drills.conftest import CRASH_SCENARIO
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _killed_at(tmp_path: Path, point: str, agents: str) -> Path:
    scenario = tmp_path / "s.toml"
    scenario.write_text(CRASH_SCENARIO)
    session = tmp_path / "session"
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from exarch_actors.cli.main import main; main()",
            "run",
            str(scenario),
            "--session-dir",
            str(session),
            "--agents",
            agents,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EXARCH_FAULTS": "1", CRASH_AT_ENV: point, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr
    for proc in leftover_processes(SessionDir(session)):  # what dies with its fork server
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    wait_for(lambda: not leftover_processes(SessionDir(session)), 30, "the dead run's processes")
    return session


def _records(path: Path) -> list[dict[str, object]]:
    return read_jsonl(path).records


@pytest.mark.timeout(180)
@pytest.mark.parametrize("agents", ["thread", "process"])
@pytest.mark.parametrize("point", ["delivered-before-died", "settled-before-delivery"])
def test_a_child_settled_before_the_control_kill_dies_once_with_its_settled_outcome_on_resume(
    tmp_path: Path, point: str, agents: str
) -> None:
    session = _killed_at(tmp_path, point, agents)
    journal = [r for r in _records(session / "spawn-journal.jsonl") if r["id"] == "quick"]
    assert [r["kind"] for r in journal if r["kind"] in ("settled", "cancelled")] == ["settled"]
    died = lambda: [  # noqa: E731
        r
        for r in _records(session / "transcript.jsonl")
        if r["kind"] == "Died" and r["agent"] == "quick"
    ]
    assert died() == [], "the kill landed in the window: settled, no Died yet"

    out = resume_run(SessionDir(session))
    assert out.outcome == "replied" and out.reply == "42"
    assert out.fleet_yield.never_settled == 0
    journal = [r for r in _records(session / "spawn-journal.jsonl") if r["id"] == "quick"]
    assert [r["kind"] for r in journal if r["kind"] in ("settled", "cancelled")] == ["settled"]
    assert [r["outcome"] for r in died()] == ["replied"]
    trunk = _records(session / "agents" / "trunk" / "events.jsonl")
    assert "quick" in logged_results(trunk)
    assert sum(1 for r in trunk if "[agent quick finished" in str(r.get("text"))) == 1
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)
