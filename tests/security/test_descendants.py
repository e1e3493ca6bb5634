"""Nothing a program starts outlives its run, however it detached; ``check`` sees one that did.

Real runs of the command (agents as processes, whose hosts end SIGKILLed by their agent
process, and as threads, whose hosts end on a ``shutdown`` frame): a scripted agent starts a
``setsid`` program in the background, one with ``setsid -f`` and a double-forked one, each in a
new session of its own, and shows they were adopted by its shell host (a child subreaper).
After the run no process on this machine carries the run's ``EXARCH_SESSION``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from exarch_actors.runtime.constants import SESSION_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.run_processes import marked_processes
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.agent.conftest import scenario_run
from tests.support.waiting import wait_for

DETACH = [
    "sh -c 'setsid sleep 4711 >/dev/null 2>&1 </dev/null &'",
    "sh -c 'setsid -f sleep 4712 >/dev/null 2>&1 </dev/null'",
    "sh -c '(sleep 4713 >/dev/null 2>&1 </dev/null &) &'",
]
"""A ``setsid`` in the background, ``setsid -f`` (it forks and its parent exits), and a double
fork whose middle process exits at once: the three ways a program leaves its caller."""

SCENARIO = f"""
[fleet]
prompt = "Leave something running."

[[agents.trunk]]
ral = {json.dumps([*DETACH, "sh -c 'ps -o args= --ppid $PPID'"])}

[[agents.trunk]]
ral = ["reply done"]
"""


def _sleepers(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip().startswith("sleep 471")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("agents", ["process", "thread"])
def test_setsid_and_double_forked_programs_die_with_their_run(tmp_path: Path, agents: str) -> None:
    run = scenario_run(tmp_path, SCENARIO, "--agents", agents)
    assert run.code == 0, run.stderr
    io = [r for r in run.jsonl("transcript.jsonl") if r.get("kind") == "Io"]
    adopted = _sleepers(str(io[len(DETACH)]["value"]))
    assert adopted == {"sleep 4711", "sleep 4712", "sleep 4713"}, "the host adopted all three"

    session = SessionDir(run.session)
    assert marked_processes(session) == []
    report = check_session(session)
    (procs,) = [r for r in report.results if r.name == "no-leftover-processes"]
    assert procs.status == "held", procs


def test_check_flags_a_program_that_outlived_its_run_and_resume_would_find_it(
    tmp_path: Path,
) -> None:
    run = scenario_run(tmp_path, SCENARIO, "--agents", "thread")
    assert run.code == 0, run.stderr
    session = SessionDir(run.session)
    env = {**os.environ, SESSION_ENV: str(run.session.resolve())}
    left = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        wait_for(lambda: any(p.pid == left.pid for p in marked_processes(session)), 10, "mark")
        report = check_session(session)
        (procs,) = [r for r in report.results if r.name == "no-leftover-processes"]
        assert procs.status == "violated"
        assert procs.details == (
            f"sleep (marked): pid {left.pid} outlived its shell ({SESSION_ENV})",
        )
    finally:
        left.kill()
        left.wait()
    report = check_session(session)
    (procs,) = [r for r in report.results if r.name == "no-leftover-processes"]
    assert procs.status == "held"
