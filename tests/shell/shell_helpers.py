"""Helpers shared by the shell tests (imported by module name: pytest puts this directory on
sys.path for test modules without a package)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, interval: float = 0.005) -> Any:
    """Poll ``cond`` until truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
