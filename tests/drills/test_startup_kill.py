"""A control process killed during start-up -- ``run.json`` written, nothing else yet -- leaves a
run that ``resume`` starts from its beginning, and ``check`` does not pass it before that.

The kill is real: the run is started with the pause point ``run-spec-written``
(``runtime/drills/fault_switch.py``), stops itself there, and is SIGKILLed while stopped.
Before, ``resume`` took the trunk that was never ``Born`` for one that had ended (``resumed:
trunk had ended, 0 children rebuilt``, outcome ``failed``) and a second resume said the run had
already ended.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from exarch_actors.runtime.drills.fault_switch import FAULTS_ENV, PAUSE_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl, write_json_document
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import exarch_cli, spawn_run
from tests.support.waiting import eventually

SCENARIO = """
[fleet]
prompt = "hello"

[[agents.trunk]]
ral = ["agent kid 'go'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"

[[agents.trunk]]
ral = ["reply 42"]

[[agents.kid]]
ral = ["reply 1"]
"""


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def kill_at_startup(tmp_path: Path, scenario_text: str = SCENARIO) -> Path:
    """A session whose control process was SIGKILLed right after it wrote ``run.json``."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text)
    session = tmp_path / "session"
    env = {**os.environ, FAULTS_ENV: "1", PAUSE_ENV: "run-spec-written"}
    proc = spawn_run(scenario, session, env=env)
    try:
        assert eventually(lambda: _stopped(proc.pid), 30), "the run never reached its pause point"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return session


@pytest.mark.timeout(120)
def test_a_run_killed_after_run_json_resumes_from_its_start_and_replies(tmp_path: Path) -> None:
    session = kill_at_startup(tmp_path)
    assert (session / "run.json").exists()
    assert not (session / "transcript.jsonl").exists(), "killed before anything else was written"
    before = check_session(SessionDir(session))
    assert before.get("settled").status == "violated", "an unstarted run is not a finished one"
    res = exarch_cli("resume", str(session))
    assert res.exit_code == 0, res.output
    assert "resumed: trunk started (the run was killed during start-up)" in res.output
    result = read_json_document(session / "result.json")[0]
    assert result["outcome"] == "replied" and result["reply"] == "42"
    died = [r for r in read_jsonl(session / "transcript.jsonl").records if r["kind"] == "Died"]
    assert {r["agent"]: r["outcome"] for r in died} == {"trunk": "replied", "kid": "replied"}
    after = check_session(SessionDir(session))
    assert after.ok, json.dumps(after.to_json(), indent=1)


SCRATCH_SCENARIO = """
[fleet]
prompt = "hello"

[[agents.trunk]]
ral = ["cd (env EXARCH_SCRATCH); write-text here.txt 'in scratch'"]

[[agents.trunk]]
ral = ["reply (concat (read-text here.txt) ' ' (pwd))"]
"""


@pytest.mark.timeout(120)
def test_a_trunk_started_by_resume_after_a_startup_kill_has_its_scratch_directory(
    tmp_path: Path,
) -> None:
    """Seen in random control kills of examples/memory.toml: the resumed trunk's
    ``env EXARCH_SCRATCH`` was unit (``cd: no such directory: unit``), and the run quiesced."""
    session = kill_at_startup(tmp_path, SCRATCH_SCENARIO)
    res = exarch_cli("resume", str(session))
    assert res.exit_code == 0, res.output
    result = read_json_document(session / "result.json")[0]
    scratch = os.path.realpath(session / "scratch" / "trunk")
    assert result["outcome"] == "replied", res.output
    assert result["reply"] == f"in scratch {scratch}"


def test_check_refuses_a_session_an_older_resume_ended_without_starting_it(
    tmp_path: Path,
) -> None:
    """What the audit's ``check`` passed: ``result.json`` written by a resume, no trunk ever."""
    session = kill_at_startup(tmp_path)
    fleet_yield = {"spawned": 0, "settled": 0, "neverSettled": 0}
    write_json_document(
        session / "result.json",
        {"outcome": "failed", "reply": None, "fleetYield": fleet_yield, "resumed": True},
    )
    settled = check_session(SessionDir(session)).get("settled")
    assert settled.status == "violated"
    assert any("the trunk was never Born" in d for d in settled.details), settled.details
