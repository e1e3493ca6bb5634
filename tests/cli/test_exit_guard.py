"""A command exits once it is done, whatever its threads still do (``cli/exit_guard.py``).

Each test runs the real entry point in a subprocess that first leaves something behind that
Python would otherwise wait for at exit: a shell actor nobody stopped (with its host), or a
thread that never ends. A drill's process so waited on a futex for more than 5 minutes after
its report (issue 34); here the process would never end, and ``subprocess.run``'s timeout is
only a hang guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from tests.support.waiting import HANG_GUARD, wait_for

ROOT = Path(__file__).resolve().parents[2]

LEAKED_SHELL = """
import sys
from exarch_actors.actors.shell import ShellActor
from exarch_actors.cli import exit_guard
from exarch_actors.cli.main import main
from exarch_actors.runtime.state.session_dir import SessionDir

ref = ShellActor.start(name="leaked", session=SessionDir.at(sys.argv[1]))
print("host", ref.proxy().host_pid().get(), flush=True)
sys.argv = ["exarch-actors", "ral", "-c", "echo done"]
main()
"""

STUCK_THREAD = """
import sys, threading
from exarch_actors.cli import exit_guard
from exarch_actors.cli.main import main

exit_guard.EXIT_GRACE = 0.2
threading.Thread(target=threading.Event().wait, name="never-ends").start()
sys.argv = ["exarch-actors", "ral", "-c", "nosuchcommand_x"]
main()
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, cwd=ROOT, timeout=6 * HANG_GUARD,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_shell_actor_left_running_is_named_stopped_and_the_command_exits_with_its_status(
    tmp_path: Path,
) -> None:
    p = _run(LEAKED_SHELL, str(tmp_path / "session"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "done"
    assert "ShellActor" in p.stderr and "was still running at exit; stopping it" in p.stderr
    assert "thread(s) still running" not in p.stderr  # the stop closed it: nothing forced


def test_a_thread_that_never_ends_is_named_and_the_command_exits_with_its_own_status() -> None:
    p = _run(STUCK_THREAD)
    assert p.returncode == 1, p.stderr  # the ral error's status, not the guard's
    assert "unknown command nosuchcommand_x" in p.stderr
    assert "1 thread(s) still running 0.2 s after the command ended (never-ends)" in p.stderr


LEAKED_SHELL_IN_A_DRILL = """
import sys
from exarch_actors.actors.shell import ShellActor
from exarch_actors.cli.main import main
from exarch_actors.runtime.state.session_dir import SessionDir

ref = ShellActor.start(name="leaked", session=SessionDir.at(sys.argv[1]))
print("host", ref.proxy().host_pid().get(), flush=True)
sys.argv = ["exarch-actors", "drill", "examples/chain.toml", "--seed", "31337", "--duration",
            "1", "--faults", "cancel-storm", "--session-dir", sys.argv[2]]
main()
"""


def test_a_drill_whose_shell_host_is_left_blocked_reading_its_socket_reports_it_and_exits(
    tmp_path: Path,
) -> None:
    """The drill of issue 34 as seen: its report named a fork-server child still running
    (``no-stray-children``: a shell host blocked reading its socket) and the process then
    waited on a futex for the shell actor's thread. Here a shell nobody stops is planted
    before the drill: the report still names it, and the drill exits with its own status."""
    p = _run(LEAKED_SHELL_IN_A_DRILL, str(tmp_path / "leaked"), str(tmp_path / "drill"))
    host = int(p.stdout.splitlines()[0].split()[1])
    assert p.returncode == 1, p.stderr  # the violated invariant's status, not the guard's
    report = json.loads((tmp_path / "drill" / "drill-report.json").read_text())
    stray = next(i for i in report["drillChecks"] if i["name"] == "no-stray-children")
    assert stray["status"] == "violated" and f"pid {host} still running" in stray["details"]
    assert "ShellActor" in p.stderr and "was still running at exit; stopping it" in p.stderr
    assert "thread(s) still running" not in p.stderr  # stopping it closed its host
    wait_for(lambda: not _running(host), HANG_GUARD, "the leaked shell's host gone")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
