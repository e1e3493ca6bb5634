"""``resume`` after SIGKILL of the whole control process finishes the run, every child settled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exarch_actors.actors import resume as resume_module
from exarch_actors.actors.resume import plan_resume, resume_run
from exarch_actors.runtime.constants import SESSION_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.providers.scenario import load_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_read import NothingToResume
from tests.drills.conftest import CRASH_SCENARIO, kill_mid_run, settled_ids


@pytest.mark.slow
def test_resume_after_sigkill_of_the_control_process_finishes_with_every_child_settled(
    tmp_path: Path,
) -> None:
    # agents as threads: their calls in flight die with the control process, so resume is the
    # one to mark them (test_resume_process_agents.py covers --agents process)
    session = kill_mid_run(tmp_path, "--agents", "thread")
    plan = plan_resume(SessionDir(session))
    assert plan.rebuild_trunk and plan.rebuild == ["slow"]
    out = resume_run(SessionDir(session))
    assert out.outcome == "replied" and out.reply == "42"
    assert out.fleet_yield.never_settled == 0
    assert settled_ids(session) == {"quick", "slow"}
    result = json.loads((session / "result.json").read_text())
    assert result["resumed"] is True and result["fleetYield"]["neverSettled"] == 0
    slow = [r for r in read_jsonl(session / "agents" / "slow" / "events.jsonl").records]
    assert any("did not complete" in json.dumps(r) for r in slow), "in-flight call interrupted"
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)
    trunk_results = [
        r
        for r in read_jsonl(session / "agents" / "trunk" / "events.jsonl").records
        if r.get("source") == "agent_result"
    ]
    assert sorted(r["text"].split()[1] for r in trunk_results) == ["quick", "slow"]


@pytest.mark.slow
def test_resume_ends_a_process_of_the_dead_run_before_it_reads_a_file_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent process outlives its killed control process by a few ms and closes its shell,
    writing its snapshot; read then, a compaction's base and log came from two states and a
    completed call's binding was lost (1 in ~25 random kills of a 4-child fan-in). Here a
    process marked as the run's (``EXARCH_SESSION``) stands in for it: it is gone before the
    plan reads anything."""
    session = kill_mid_run(tmp_path, "--agents", "thread")
    stale = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, SESSION_ENV: str(session.resolve())},
    )
    alive_when_read: list[bool] = []

    def plan(s: SessionDir) -> resume_module.ResumePlan:
        alive_when_read.append(stale.poll() is None)
        return plan_resume(s)

    monkeypatch.setattr(resume_module, "plan_resume", plan)
    try:
        out = resume_run(SessionDir(session))
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()
    assert alive_when_read == [False]
    assert out.outcome == "replied"


def test_resume_refuses_a_run_that_already_ended(tmp_path: Path) -> None:
    session = kill_mid_run(tmp_path)
    resume_run(SessionDir(session))
    with pytest.raises(NothingToResume):
        resume_run(SessionDir(session))


def test_advance_moves_a_scripted_cursor_forward_only() -> None:
    src = Path(__file__).with_name("s.toml")
    try:
        src.write_text(CRASH_SCENARIO)
        pb = ScenarioPlayback(load_scenario(src))
    finally:
        src.unlink()
    assert pb.advance("slow", 2) == 2
    assert pb.advance("slow", 1) == 2
    _, msg = pb.take("slow")
    assert msg is not None and msg.ral == ("let s2 = 2; reply s",)
