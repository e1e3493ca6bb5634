"""Waiting on a condition: the one polling helper every test directory uses.

Tests synchronise on observable state (a file, a process, a registry entry), never on a bare
sleep; these poll every few milliseconds and fail with what they were waiting for.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from exarch_actors.actors.process_identity import exited, stat_fields

HANG_GUARD = 10.0
"""Seconds a test waits for something that should be prompt (a cancel, a kill, a wake) before
calling it hung. Only a guard against hangs, never a latency claim: the suite must pass on a
loaded machine, so the figures (the 100 ms cancellation bound and others) are measured in
``benchmarks/`` (``cancel_latency.py``) and reported in ``docs/benchmarks.md``. A test that
bounds an operation with it also asserts what only a cut-short operation yields (a ``cancelled``
result, a dead program, a wait that a 30 s timeout would otherwise have ended)."""


def wait_for(
    cond: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.005,
) -> Any:
    """Poll ``cond`` until it is truthy and return its value; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def eventually(cond: Callable[[], Any], timeout: float = 10.0) -> bool:
    """Whether ``cond`` becomes truthy within ``timeout`` (for asserting it with a message)."""
    try:
        wait_for(cond, timeout)
    except AssertionError:
        return bool(cond())
    return True


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` names a running process: a zombie (exited, not yet reaped) is not."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def ended(p: psutil.Process) -> bool:
    """Whether the process ``p`` names has ended: gone (its pid not reused: psutil checks the
    start time), a zombie, or gone between the two reads (reaped meanwhile: a wait's condition
    raised ``NoSuchProcess`` once in CI)."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def killed_or_gone(pid: int) -> bool:
    """Whether ``pid`` can run no instruction of its own again: gone, a zombie, exiting
    (``PF_EXITING`` in its ``/proc`` flags), or with a SIGKILL delivered and not yet acted on
    (pending for its main thread or its whole group). Linux only."""
    fields = stat_fields(pid)
    if exited(pid) or fields is None or int(fields[6]) & 0x4:  # PF_EXITING
        return True
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return True
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(pending & (1 << (signal.SIGKILL - 1)))


def held_at(gate: Path, held: Path | None = None) -> str:
    """A ral line that touches ``held`` (if given) and then waits until ``gate`` exists: a
    scenario's call held in flight for as long as a test needs, told apart from one not yet
    started. Its counterpart, :func:`waits_for`, waits in ral for ``held``."""
    touch = f"touch {held}; " if held is not None else ""
    return f"sh -c '{touch}while [ ! -e {gate} ]; do sleep 0.02; done'"


def waits_for(path: Path) -> str:
    """A ral line that waits until ``path`` exists (another agent's call is held)."""
    return f"sh -c 'while [ ! -e {path} ]; do sleep 0.02; done'"
