"""A control process killed between a child's logged ``reply`` and its settlement: ``resume``
settles the child ``replied`` with the reply its event log holds, and its parent gets it.

The kill is real, at the pause point ``ended-before-settlement``
(``runtime/drills/fault_switch.py``): the child's drive ended after its ``reply`` call, whose
result (and, since issue 34, the reply's value) is in its ``events.jsonl``; the settlement record,
which carried the value, was never written. Before, the rebuilt child was told to go on, a
scripted child had no rounds left and quiesced, and the run ended ``quiesced`` with no reply --
the same gap as a full disk refusing that settlement (``tests/durability/test_disk_full.py``).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from exarch_actors.runtime.drills.fault_switch import CRASH_AT_ENV, FAULTS_ENV, PAUSE_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.journal import replay
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import exarch_cli, spawn_run
from tests.drills.test_startup_kill import _stopped
from tests.support.waiting import eventually

DELEGATE = """
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["agent kid 'answer'"]

[[agents.trunk]]
ral = ["let ends = agent-wait; reply $ends[kid][reply]"]

[[agents.trunk]]
ral = ["let ends = agent-wait; reply $ends[kid][reply]"]

[[agents.kid]]
ral = ["reply 'forty-two'"]
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_child_killed_with_its_reply_logged_and_unsettled_resumes_replied_with_it(
    tmp_path: Path, agents: str
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(DELEGATE)
    session = tmp_path / "session"
    env = {**os.environ, FAULTS_ENV: "1", PAUSE_ENV: "ended-before-settlement"}
    proc = spawn_run(scenario, session, "--agents", agents, env=env)
    try:
        assert eventually(lambda: _stopped(proc.pid), 60), "the child's end never paused"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    kid_log = read_jsonl(session / "agents" / "kid" / "events.jsonl").records
    assert [r.get("reply") for r in kid_log if r["kind"] == "tool_result"] == ["forty-two"]
    assert not replay(session / "spawn-journal.jsonl").state.nodes["kid"].results, "unsettled"

    res = exarch_cli("resume", str(session))
    assert res.exit_code == 0, res.output
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "forty-two"), res.output
    kid = replay(session / "spawn-journal.jsonl").state.nodes["kid"]
    assert (kid.results[-1]["outcome"], kid.results[-1]["reply"]) == ("replied", "forty-two")
    kid_log = read_jsonl(session / "agents" / "kid" / "events.jsonl").records
    assert len([r for r in kid_log if r["kind"] == "assistant"]) == 1, "no model turn after it"
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)


VERIFIED = """
[fleet]
prompt = "answer"

[[agents.trunk]]
ral = ["reply 'forty-two'"]

[[agents.trunk]]
ral = ["reply 'forty-two'"]
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_run_killed_after_its_trunks_verified_reply_and_before_its_died_resumes_replied(
    tmp_path: Path, agents: str
) -> None:
    """Seen in 1 of 25 random control kills of examples/chain.toml: the trunk had replied,
    been turned back by its self-verify nudge and replied again (both in its log), every
    child settled, and the kill came before its ``Died`` and ``result.json``. The rebuilt
    trunk was told the run resumed, its script had no rounds left, and the run ended
    ``quiesced`` with no reply."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(VERIFIED)
    session = tmp_path / "session"
    env = {**os.environ, FAULTS_ENV: "1", PAUSE_ENV: "trunk-ended-before-died"}
    proc = spawn_run(scenario, session, "--agents", agents, env=env)
    try:
        assert eventually(lambda: _stopped(proc.pid), 60), "the trunk's end never paused"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (session / "result.json").exists()
    log = read_jsonl(session / "agents" / "trunk" / "events.jsonl").records
    assert [r.get("reply") for r in log if r["kind"] == "tool_result"] == ["forty-two"] * 2
    assert [r.get("nudge") for r in log if r["kind"] == "nudge"] == ["self_verify"]

    res = exarch_cli("resume", str(session))
    assert res.exit_code == 0, res.output
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "forty-two"), res.output
    log = read_jsonl(session / "agents" / "trunk" / "events.jsonl").records
    assert len([r for r in log if r["kind"] == "assistant"]) == 2, "no model turn after it"
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)


NUMBER = """
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["agent kid 'answer'"]

[[agents.trunk]]
ral = ["let ends = agent-wait; reply (add $ends[kid][reply] 1)"]

[[agents.trunk]]
ral = ["agent-wait; let r = agent-result kid; reply (add $r[reply] 1)"]

[[agents.trunk]]
ral = ["agent-wait; let r = agent-result kid; reply (add $r[reply] 1)"]

[[agents.kid]]
ral = ["reply 16"]
"""
"""The trunk's third round is the resumed one: ``agent-wait`` collects a rebuilt kid's end; one
settled before the kill was delivered to the resumed trunk's inbox (its wake), so the wait
returns without it and ``agent-result`` reads it from the spawn journal."""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "fault",
    [(PAUSE_ENV, "ended-before-settlement"), (CRASH_AT_ENV, "settled-before-delivery")],
    ids=["reply-logged-unsettled", "settled-undelivered"],
)
def test_a_childs_number_reply_reaches_its_parent_as_a_number_after_resume(
    tmp_path: Path, fault: tuple[str, str]
) -> None:
    """Seen in random control kills of examples/fanin-small.toml: a child rebuilt with its
    reply logged, or settled before the kill, came back to its parent as text ("16"), and the
    parent's sum failed (``add: expected a number, got string "16"``). Both ways a reply is
    read back -- the child's event log and the spawn journal -- keep its type."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(NUMBER)
    session = tmp_path / "session"
    env = {**os.environ, FAULTS_ENV: "1", fault[0]: fault[1]}
    proc = spawn_run(scenario, session, "--agents", "process", env=env)
    try:
        assert eventually(lambda: proc.poll() is not None or _stopped(proc.pid), 60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (session / "result.json").exists(), "killed before the trunk's reply"
    settled = bool(replay(session / "spawn-journal.jsonl").state.nodes["kid"].results)
    assert settled == (fault[1] == "settled-before-delivery")

    res = exarch_cli("resume", str(session))
    assert res.exit_code == 0, res.output
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "17"), res.output
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)
