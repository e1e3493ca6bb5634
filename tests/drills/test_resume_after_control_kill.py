"""``resume`` after SIGKILL of the whole control process finishes the run, every child settled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from actors.resume import NothingToResume, plan_resume, resume_run
from runtime.durable import read_jsonl
from runtime.invariants import check_session
from runtime.providers.scenario import load_scenario
from runtime.providers.scripted import ScenarioPlayback
from tests.support.waiting import eventually

SCENARIO = """
[fleet]
prompt = "two helpers"

[[agents.trunk]]
ral = ["let base = 40", "agent quick 'fast'", "agent slow 'slow'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = 2

[[agents.trunk]]
ral = ["reply (add $base 2)"]

[[agents.quick]]
ral = ["let q = 1; reply q"]

[[agents.slow]]
ral = ["let s1 = 1"]

[[agents.slow]]
ral = ["sleep 30; let never = 1"]

[[agents.slow]]
ral = ["let s2 = 2; reply s"]
"""


def _settled_ids(session: Path) -> set[str]:
    return {
        r["id"]
        for r in read_jsonl(session / "spawn-journal.jsonl").records
        if r["kind"] == "cancelled"
        or (r["kind"] == "settled" and r.get("retainedExecution") != "pending")
    }


def _kill_mid_run(tmp_path: Path) -> Path:
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO)
    session = tmp_path / "session"
    env = {**os.environ, "EXARCH_FAULTS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from cli.main import main; main()",
            "run",
            str(scenario),
            "--session-dir",
            str(session),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        events = session / "agents" / "slow" / "events.jsonl"
        assert eventually(
            lambda: (
                "quick" in _settled_ids(session)
                and "sleep 30" in (events.read_text() if events.exists() else "")
            ),
            20,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (session / "result.json").exists()
    return session


def test_resume_after_sigkill_of_the_control_process_finishes_with_every_child_settled(
    tmp_path: Path,
) -> None:
    session = _kill_mid_run(tmp_path)
    plan = plan_resume(session)
    assert plan.rebuild_trunk and plan.rebuild == ["slow"]
    out = resume_run(session)
    assert out.outcome == "replied" and out.reply == "42"
    assert out.fleet_yield.never_settled == 0
    assert _settled_ids(session) == {"quick", "slow"}
    result = json.loads((session / "result.json").read_text())
    assert result["resumed"] is True and result["fleetYield"]["neverSettled"] == 0
    slow = [r for r in read_jsonl(session / "agents" / "slow" / "events.jsonl").records]
    assert any("did not complete" in json.dumps(r) for r in slow), "in-flight call interrupted"
    report = check_session(session)
    assert report.ok, json.dumps(report.to_json(), indent=1)
    trunk_results = [
        r
        for r in read_jsonl(session / "agents" / "trunk" / "events.jsonl").records
        if r.get("source") == "agent_result"
    ]
    assert sorted(r["text"].split()[1] for r in trunk_results) == ["quick", "slow"]


def test_resume_refuses_a_run_that_already_ended(tmp_path: Path) -> None:
    session = _kill_mid_run(tmp_path)
    resume_run(session)
    with pytest.raises(NothingToResume):
        resume_run(session)


def test_advance_moves_a_scripted_cursor_forward_only() -> None:
    src = Path(__file__).with_name("s.toml")
    try:
        src.write_text(SCENARIO)
        pb = ScenarioPlayback(load_scenario(src))
    finally:
        src.unlink()
    assert pb.advance("slow", 2) == 2
    assert pb.advance("slow", 1) == 2
    _, msg = pb.take("slow")
    assert msg is not None and msg.ral == ("let s2 = 2; reply s",)
