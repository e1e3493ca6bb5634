"""A ral worker still running when its shell's process died is lost, and its agent is told so
once, as a completion, when it is rebuilt -- after a control-process kill (``resume``) and after
its own agent process is SIGKILLed (a restart).

Seen in random control kills of ``examples/memory.toml``: the trunk ended its turn to wait for
its worker, the run was killed, and the resumed trunk -- its worker gone with the dead shell
host, so nothing was coming -- quiesced at once without a model turn and without a reply.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import exarch_cli, run_story, spawn_run
from tests.support.waiting import eventually

WAITER = """
[fleet]
prompt = "sum in the background"

[[agents.trunk]]
ral = ["let h = spawn { sleep 600; 1 }"]

[[agents.trunk]]
text = "waiting for the worker"
stop = "end_turn"

[[agents.trunk]]
ral = ["reply 'woken'"]
"""


def _start(tmp_path: Path, scenario_text: str, agents: str) -> tuple[Path, subprocess.Popen[bytes]]:
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text)
    session = tmp_path / "session"
    return session, spawn_run(scenario, session, "--agents", agents)


def _trunk_waits(session: Path) -> bool:
    """The trunk ended its turn with the worker still running (its log has the end_turn)."""
    events = session / "agents" / "trunk" / "events.jsonl"
    if not events.exists():
        return False
    return "waiting for the worker" in events.read_text()


def _surfaced(session: Path) -> list[str]:
    records = read_jsonl(session / "agents" / "trunk" / "events.jsonl").records
    return [
        str(r.get("text"))
        for r in records
        if r.get("kind") == "user" and r.get("source") == "surface"
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_worker_running_at_a_control_kill_is_surfaced_lost_and_its_agent_replies_after_resume(
    tmp_path: Path, agents: str
) -> None:
    session, proc = _start(tmp_path, WAITER, agents)
    try:
        assert eventually(lambda: _trunk_waits(session), 60), "the trunk never waited"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    res = exarch_cli("resume", str(session))
    assert res.exit_code == 0, res.output
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "woken"), res.output
    surfaced = _surfaced(session)
    assert len(surfaced) == 1, surfaced
    assert "was lost: it ended with the process that ran its shell" in surfaced[0]
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)


def _trunk_pid(session: Path) -> int | None:
    transcript = session / "transcript.jsonl"
    if not transcript.exists():
        return None
    born = [
        r
        for r in read_jsonl(transcript).records
        if r.get("kind") == "Born" and r.get("agent") == "trunk"
    ]
    return int(born[-1]["pid"]) if born else None


def _tree(root: int) -> str:
    """The processes under ``root``: pid, parent, process group, command."""
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error as e:
        return f"(no tree: {e})"
    rows = []
    for p in procs:
        try:
            rows.append(f"{p.pid} ppid={p.ppid()} pgid={os.getpgid(p.pid)} {p.name()}")
        except (psutil.Error, OSError):
            continue
    return "tree: " + "; ".join(rows)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_lost_with_its_agent_process_is_surfaced_to_the_restarted_agent(
    tmp_path: Path,
) -> None:
    """The restarted trunk plays on from its third round (its provider's cursor moved past
    the rounds its log shows, as ``resume`` moves it): told its worker was lost, it replies.
    (Before, a restarted scripted agent played its script again from its first round.)"""
    session, proc = _start(tmp_path, WAITER, "process")
    try:
        assert eventually(lambda: _trunk_waits(session), 60), "the trunk never waited"
        pid = _trunk_pid(session)
        assert pid is not None and pid != proc.pid, "the trunk runs in a process of its own"
        tree = _tree(proc.pid)  # what was killed, beside the run's processes (for a failure)
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) == 0, f"killed {pid}; {tree}\n{run_story(session)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "woken"), run_story(session)
    surfaced = _surfaced(session)
    assert "was lost: it ended with the process that ran its shell" in surfaced[0], surfaced
    assert not any("was lost" in s for s in surfaced[1:]), "told once"
    report = check_session(SessionDir(session))  # no-leftover-processes among them
    assert report.ok, json.dumps(report.to_json(), indent=1)
