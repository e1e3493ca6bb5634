"""The agent's pids cgroup: a fork bomb stops at the agent's cap, a host killed by someone else
leaves nothing behind, and ``check`` sees a process of the run whatever its environment says.

Real shell hosts, real programs, the real kernel's pids controller (``actors/pid_cgroup.py``).
Skipped where no pids cgroup is writable (an ordinary user without a delegated subtree).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from exarch_actors.actors.pid_cgroup import sweep
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.shell.confinement import Sandbox, SandboxMode
from exarch_actors.runtime.shell.pid_cgroup import hierarchy, session_group
from exarch_actors.runtime.state.run_processes import grouped_processes
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.agent.conftest import scenario_run
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(hierarchy() is None, reason="no writable pids cgroup here")

CAP = 24
PY = "/usr/bin/python3"

BOMB = (
    "import os, signal, sys, time\n"
    "kids = []\n"
    "refused = 0\n"
    "for _ in range(100):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except BlockingIOError:\n"
    "        refused += 1\n"
    "        continue\n"
    "    if pid == 0:\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "print(len(kids), refused)\n"
    "for k in kids:\n"
    "    os.kill(k, signal.SIGKILL)\n"
    "    os.waitpid(k, 0)\n"
)
"""Forks 100 sleepers (a bounded bomb: were the cap missing, it would not take the box down),
counts the forks the kernel refused, then kills what it made."""


@pytest.fixture
def group() -> Iterator[str]:
    name = f"exarch-test-{uuid.uuid4().hex[:12]}"
    yield f"{name}/trunk"
    base = hierarchy()
    assert base is not None
    sweep(base / name)


def _shell(tmp_path: Path, group: str) -> tuple[object, object]:
    sandbox = Sandbox(SandboxMode.FULL_ACCESS, processes=CAP, group=group)
    env = {"PATH": "/usr/bin:/bin"}
    ctx = DynamicContext(str(tmp_path), env, Grants.ALL, sandbox)
    ref = ShellActor.start(name="trunk", session=SessionDir(tmp_path / "session"), context=ctx)
    return ref, ref.proxy()


@pytest.mark.timeout(120)
def test_a_fork_bomb_stops_at_the_agents_process_cap_and_the_call_says_so(
    tmp_path: Path, group: str
) -> None:
    ref, shell = _shell(tmp_path, group)
    try:
        (tmp_path / "bomb.py").write_text(BOMB)
        r = shell.run(f"{PY} bomb.py").get()  # type: ignore[attr-defined]
        made, refused = (int(x) for x in str(r.value).split())
        assert made < CAP, "the kernel refused forks past the agent's cap"
        assert made + refused == 100
        assert f"may run at most {CAP} processes at once (--shell-procs)" in r.stderr
        peak = int((hierarchy() / group / "pids.peak").read_text())  # type: ignore[operator]
        assert peak <= CAP
        after = shell.run("echo still-here").get()  # type: ignore[attr-defined]
        assert after.error is None and "still-here" in after.stdout
        assert "[exarch]" not in after.stderr, "a call that hit no cap says nothing of it"
    finally:
        ref.stop(block=True, timeout=20)  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_a_program_left_by_a_host_killed_from_outside_dies_at_the_rollback(
    tmp_path: Path, group: str
) -> None:
    ref, shell = _shell(tmp_path, group)
    try:
        r = shell.run(  # type: ignore[attr-defined]
            "sh -c 'setsid sleep 4731 >/dev/null 2>&1 </dev/null & echo $PPID'"
        ).get()
        host = int(str(r.value).split()[0])
        sleepers = [
            p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "4731"]
        ]
        assert len(sleepers) == 1
        os.kill(host, signal.SIGKILL)  # someone else: the host runs no cleanup of its own
        wait_for(lambda: sleepers[0].ppid() != host, timeout=20)  # orphaned, still running
        assert sleepers[0].is_running()
        r = shell.run("echo after").get()  # type: ignore[attr-defined]
        assert r.rolled_back or "after" in r.stdout
        wait_for(lambda: not _alive(sleepers[0]), timeout=20)
    finally:
        ref.stop(block=True, timeout=20)  # type: ignore[attr-defined]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


SCENARIO = """
[fleet]
prompt = "Count."

[[agents.trunk]]
ral = ["sh -c 'cat /proc/self/cgroup'"]

[[agents.trunk]]
ral = ["reply done"]
"""


@pytest.mark.timeout(120)
def test_every_shell_of_a_run_is_in_its_sessions_group_and_the_group_is_gone_after_it(
    tmp_path: Path,
) -> None:
    run = scenario_run(tmp_path, SCENARIO, "--shell-procs", "40")
    assert run.code == 0, run.stderr
    marker = str(Path(run.session).resolve())
    io = [r for r in run.jsonl("transcript.jsonl") if r.get("kind") == "Io"]
    assert f"{session_group(marker)}/trunk/" in str(io[0]["value"])
    assert not (hierarchy() / session_group(marker)).exists()  # type: ignore[operator]
    run_json = (Path(run.session) / "run.json").read_text()
    assert '"maxProcesses": 40' in run_json


@pytest.mark.timeout(60)
def test_check_reports_a_process_in_the_sessions_group_that_lost_its_marker(tmp_path: Path) -> None:
    session = SessionDir(tmp_path / "s")
    session.root.mkdir(parents=True)
    session.transcript.write_text("")
    base = hierarchy()
    assert base is not None
    leaf = base / session_group(str(session.root.resolve())) / "trunk" / "1"
    leaf.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "4732"], env={"PATH": "/usr/bin:/bin"})
    try:
        (leaf / "cgroup.procs").write_text(str(proc.pid))
        assert [p.pid for p in grouped_processes(session)] == [proc.pid]
        report = check_session(session)
        procs = next(r for r in report.results if r.name == "no-leftover-processes")
        assert procs.status == "violated"
        assert any(f"pid {proc.pid} outlived its shell" in d for d in procs.details)
    finally:
        killed = sweep(leaf.parent.parent)
        proc.wait(10)
    assert killed == [proc.pid]
    assert not leaf.parent.parent.exists()
