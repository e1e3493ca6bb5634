"""Waiting on a condition: the one polling helper every test directory uses.

Tests synchronise on observable state (a file, a process, a registry entry), never on a bare
sleep; these poll every few milliseconds and fail with what they were waiting for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil

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
