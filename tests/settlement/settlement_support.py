"""Helpers shared by the settlement tests (a uniquely named module: several test directories
have a conftest.py, so ``from conftest import`` would pick whichever was imported first)."""

from __future__ import annotations

import os
import signal
import sys

import psutil

SLEEP = ("sleep", "60")
IGNORE_TERM = (
    sys.executable,
    "-c",
    "import signal, time, pathlib\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path('ready').write_text('1')\n"
    "time.sleep(60)\n",
)


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def kill_hard(pid: int | None) -> None:
    """What a sweeper does with a teardown-unconfirmed pid (and the test's own reaping)."""
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
