"""A control process killed after an agent ``message`` was sent and before its recipient logged
it: ``resume`` delivers it, once, and ``check`` holds (issue 34).

The interleaving is forced, not timed. The recipient (``kid``) is held in its first call by a
gate file that stays shut, so whatever reaches its inbox waits there, unlogged; the trunk sends
its message once ``kid`` is held, and the control process SIGKILLs itself at the crash point
``message-sent-before-logged`` (``runtime/drills/fault_switch.py``): the message taken by
``kid``'s inbox and recorded (``MessageSent`` in ``transcript.jsonl``), ``kid``'s log without it.
Before, the message lived only in that inbox (in the control process, or in ``kid``'s process,
which dies with its control process): ``resume`` rebuilt ``kid`` from its log and the message was
gone, neither logged nor recorded undelivered.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.resume import resume_run
from exarch_actors.runtime.drills.fault_switch import CRASH_AT_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.run_processes import leftover_processes
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import held_at, wait_for, waits_for

ROOT = Path(__file__).resolve().parents[2]
TEXT = "hello from the trunk"


def _scenario(held: Path, gate: Path) -> str:
    hold = held_at(gate, held)
    wait_held = waits_for(held)
    return f"""
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["agent kid 'go'"]

[[agents.trunk]]
ral = ["{wait_held}; message kid '{TEXT}'"]

[[agents.trunk]]
ral = ["let ends = agent-wait; reply $ends[kid][reply]"]

[[agents.kid]]
ral = ["{hold}"]

[[agents.kid]]
ral = ["reply 'kid heard'"]
"""


def _killed_after_message(tmp_path: Path, agents: str) -> Path:
    scenario = tmp_path / "s.toml"
    scenario.write_text(_scenario(tmp_path / "held", tmp_path / "gate"))
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
        env={
            **os.environ,
            "EXARCH_FAULTS": "1",
            CRASH_AT_ENV: "message-sent-before-logged",
            "PYTHONPATH": str(ROOT),
        },
    )
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr
    for proc in leftover_processes(SessionDir(session)):  # kid's process and its held shell
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    wait_for(lambda: not leftover_processes(SessionDir(session)), 30, "the dead run's processes")
    return session


def _records(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path).records if path.exists() else []


def _messages_logged(session: Path, agent: str) -> list[tuple[str, str]]:
    events = _records(session / "agents" / agent / "events.jsonl")
    return [
        (str(r.get("messageId")), str(r["text"]))
        for r in events
        if r.get("kind") == "user" and r.get("source") == "agent_message"
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_message_sent_before_the_control_kill_and_never_logged_reaches_its_recipient_on_resume(
    tmp_path: Path, agents: str
) -> None:
    session = _killed_after_message(tmp_path, agents)
    sent = [r for r in _records(session / "transcript.jsonl") if r["kind"] == "MessageSent"]
    assert [(r["agent"], r["sender"], r["text"]) for r in sent] == [("kid", "trunk", TEXT)]
    assert _messages_logged(session, "kid") == [], "the kill landed in the window: not logged"
    report = check_session(SessionDir(session))  # the dead run: check names the lost message
    rejections = next(r for r in report.to_json()["invariants"] if r["name"] == "rejections")
    assert rejections["status"] == "violated"
    assert any(sent[0]["id"] in d for d in rejections["details"]), rejections

    out = resume_run(SessionDir(session))
    assert (out.outcome, out.reply) == ("replied", "kid heard")
    assert _messages_logged(session, "kid") == [
        (sent[0]["id"], f"[message from agent trunk]\n{TEXT}")
    ]
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_message_never_logged_whose_recipient_is_not_rebuilt_is_recorded_undelivered(
    tmp_path: Path,
) -> None:
    """The same kill; this time the recipient's files are gone, so ``resume`` cannot rebuild it
    (an orphaned slot, healed ``failed``): its message is recorded ``InboxRejected``,
    ``recipient ended``, the message and its id in the record, and ``check`` holds."""
    session = _killed_after_message(tmp_path, "thread")
    sent = next(r for r in _records(session / "transcript.jsonl") if r["kind"] == "MessageSent")
    shutil.rmtree(session / "agents" / "kid")

    out = resume_run(SessionDir(session))
    assert out.plan.to_json()["lostMessages"] == [["kid", sent["id"]]]
    rejected = [
        r
        for r in _records(session / "transcript.jsonl")
        if r["kind"] == "InboxRejected" and r["agent"] == "kid"
    ]
    assert [
        (r["reason"], r["sender"], r["message"]["id"], r["message"]["text"]) for r in rejected
    ] == [("recipient ended", "trunk", sent["id"], TEXT)]
    report = check_session(SessionDir(session))
    rejections = next(r for r in report.to_json()["invariants"] if r["name"] == "rejections")
    assert rejections["status"] == "held", rejections
