"""``resume`` of a run whose agents ran as processes (``--agents process``) after SIGKILL of
its control process: the agents are rebuilt as processes again, and the run finishes with
every child settled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exarch_actors.actors.resume import resume_run
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import kill_mid_run, settled_ids


def _born(session: Path) -> list[dict[str, object]]:
    return [r for r in read_jsonl(session / "transcript.jsonl").records if r["kind"] == "Born"]


@pytest.mark.slow
def test_resume_after_sigkill_of_an_agents_process_run_rebuilds_its_agents_as_processes(
    tmp_path: Path,
) -> None:
    session = kill_mid_run(tmp_path, "--agents", "process")
    assert json.loads((session / "run.json").read_text())["agents"] == "process"
    before = {str(r["agent"]): r["pid"] for r in _born(session)}
    assert set(before) == {"trunk", "quick", "slow"}
    out = resume_run(SessionDir(session))
    assert out.outcome == "replied" and out.reply == "42"
    assert out.fleet_yield.never_settled == 0
    assert settled_ids(session) == {"quick", "slow"}
    rebuilt = _born(session)[len(before) :]
    assert sorted(str(r["agent"]) for r in rebuilt) == ["slow", "trunk"]
    for r in rebuilt:  # each in a process of its own, neither this one nor the dead run's
        assert r["pid"] not in (os.getpid(), before[str(r["agent"])])
    assert len({r["pid"] for r in rebuilt}) == 2
    # the call in flight at the kill is closed as an error (its agent process saw the control
    # side go and cancelled it, or resume marked it interrupted), never left pending
    slow = read_jsonl(session / "agents" / "slow" / "events.jsonl").records
    sleep = next(
        r["message"]["content"]
        for r in slow
        if r["kind"] == "tool_result" and r["message"]["tool_call_id"] == "call_slow_1_0"
    )
    assert "cancelled" in sleep or "did not complete" in sleep
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)


@pytest.mark.slow
def test_resume_with_agents_thread_rebuilds_a_process_run_in_this_process_and_says_so_in_run_json(
    tmp_path: Path,
) -> None:
    session = kill_mid_run(tmp_path, "--agents", "process")
    out = resume_run(SessionDir(session), agents="thread")
    assert out.outcome == "replied" and out.reply == "42"
    assert json.loads((session / "run.json").read_text())["agents"] == "thread"
    rebuilt = _born(session)[3:]
    assert rebuilt and all(r["pid"] == os.getpid() for r in rebuilt)
    assert check_session(SessionDir(session)).ok
