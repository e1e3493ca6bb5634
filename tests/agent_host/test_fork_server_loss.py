"""The control process's fork server killed mid-run: every agent process and shell host it
forked dies with it, the next start launches a new one, and the run goes on.

Seen in CI (1 full suite in 2 at the time): a test's trunk died with exit code 255 (the fork
server gone, ``popen_forkserver``'s code for a status pipe at end of file), was restarted on a
pooled agent process, and failed: the pool had told that process the dead server's address,
so its shell host could not start (``ConnectionRefusedError``) and its shell actor never
booted. The pool now asks for the address at each start.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import run_story, spawn_run
from tests.support.waiting import eventually, held_at


def _scenario(held: Path, gate: Path) -> str:
    hold = held_at(gate, held)
    return f"""
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["{hold}"]

[[agents.trunk]]
ral = ["agent b 'add'"]

[[agents.trunk]]
ral = ["let ends = agent-wait; reply $ends[b][reply]"]

[[agents.trunk]]
ral = ["let ends = agent-wait [b]; reply $ends[b][reply]"]

[[agents.b]]
ral = ["let x = 20; reply (add $x 1)"]
"""


def _fork_server(control: int) -> psutil.Process | None:
    for p in psutil.Process(control).children():
        try:
            if "forkserver" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_run_whose_fork_server_is_killed_restarts_its_agents_on_a_new_one_and_replies(
    tmp_path: Path,
) -> None:
    held, gate = tmp_path / "held", tmp_path / "gate"
    scenario = tmp_path / "s.toml"
    scenario.write_text(_scenario(held, gate))
    session = tmp_path / "session"
    proc = spawn_run(scenario, session, "--agents", "process")
    try:
        assert eventually(held.exists, 60), "the trunk never held"
        server = _fork_server(proc.pid)
        assert server is not None, "the run has a fork server"
        server.kill()  # its children (the trunk, its shell, the pool's hosts) die with it
        assert eventually(
            lambda: any(
                r.get("notice") == "Restarted"
                for r in read_jsonl(session / "transcript.jsonl").records
            ),
            60,
        ), run_story(session)
        gate.touch()
        assert proc.wait(timeout=120) == 0, run_story(session)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "21"), run_story(session)
    report = check_session(SessionDir(session))
    assert report.ok, run_story(session)
