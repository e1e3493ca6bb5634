"""Nothing outlives the control process: a real ``exarch-actors run`` whose tree is busy (a
shell spinning in C code that holds the GIL, a worker and a sub-agent each running a program)
is SIGKILLed, SIGTERMed or SIGINTed, and every process it started is gone afterwards.

The processes are found as the control process's descendants while the tree is busy (psutil
objects, so a reused pid is never mistaken for a survivor); once the control process dies its
orphans would be re-parented away from this test, so the suite's own leak check cannot see
them -- these tests look for each one by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

BUSY_TREE = """
[fleet]
prompt = "be busy"

[[agents.trunk]]
ral = ["let w = spawn { /bin/sleep 120 }", "agent busy 'run a long program'", "fault spin"]

[[agents.busy]]
ral = ["/bin/sleep 121"]
"""


class BusyRun:
    """A real ``exarch-actors run`` on :data:`BUSY_TREE` and the processes it started."""

    def __init__(self, tmp_path: Path) -> None:
        scenario = tmp_path / "busy.toml"
        scenario.write_text(textwrap.dedent(BUSY_TREE))
        self.session = tmp_path / "session"
        cmd = [
            sys.executable,
            "-c",
            "from exarch_actors.cli.main import main; main()",
            "run",
            str(scenario),
        ]
        cmd += ["--session-dir", str(self.session)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "EXARCH_FAULTS": "1"}
        # stderr to a file, not a pipe: an orphan holding the pipe would block reading it
        self._stderr = tmp_path / "stderr.txt"
        with self._stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        self.control = psutil.Process(self.proc.pid)
        self.tree: list[psutil.Process] = []

    def wait_busy(self) -> list[psutil.Process]:
        """Block until both programs run and a shell spins; returns every descendant."""
        wait_for(lambda: len(self._programs()) == 2, timeout=60, what="both programs running")
        wait_for(self._someone_spins, timeout=60, what="a shell spinning")
        self.tree = self.control.children(recursive=True)
        return self.tree

    def _programs(self) -> list[psutil.Process]:
        out = []
        for p in self.control.children(recursive=True):
            try:
                if p.name() == "sleep":
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def _someone_spins(self) -> bool:
        procs = self.control.children(recursive=True)
        before = {p.pid: _cpu(p) for p in procs}
        time.sleep(0.3)
        return any(_cpu(p) - before[p.pid] > 0.15 for p in procs)

    def survivors(self) -> list[psutil.Process]:
        return [p for p in self.tree if _alive(p)]

    def wait_exit(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def cleanup(self) -> None:
        """Kill whatever is left (only ever reached when a test already failed)."""
        for p in [self.control, *self.tree]:
            if _alive(p):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        self.proc.wait()

    def stderr(self) -> str:
        return self._stderr.read_text(errors="replace")

    def result(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.session / "result.json").read_text())
        return data


def _cpu(p: psutil.Process) -> float:
    try:
        return float(p.cpu_times().user)
    except psutil.Error:
        return 0.0


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _names(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


@pytest.fixture
def busy_run(tmp_path: Path) -> Iterator[BusyRun]:
    run = BusyRun(tmp_path)
    try:
        yield run
    finally:
        run.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_of_the_control_process_leaves_no_shell_worker_program_or_helper_behind(
    busy_run: BusyRun,
) -> None:
    tree = busy_run.wait_busy()
    assert len(tree) >= 7, _names(tree)  # tracker, fork server, 2 hosts, worker, 2 programs
    busy_run.control.send_signal(signal.SIGKILL)
    busy_run.wait_exit()
    assert wait_for(lambda: not busy_run.survivors(), timeout=30, what="every descendant gone"), (
        _names(busy_run.survivors())
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_cancelling_signal_to_run_cancels_the_busy_tree_settles_it_and_exits_with_its_code(
    busy_run: BusyRun, sig: signal.Signals, code: int
) -> None:
    busy_run.wait_busy()
    busy_run.control.send_signal(sig)
    assert busy_run.wait_exit() == code, busy_run.stderr()
    result = busy_run.result()
    assert result["outcome"] == "cancelled"
    fy = result["fleetYield"]
    assert isinstance(fy, dict) and fy["neverSettled"] == 0 and fy["cancelled"] == 1
    assert wait_for(lambda: not busy_run.survivors(), timeout=30, what="every descendant gone"), (
        _names(busy_run.survivors())
    )
