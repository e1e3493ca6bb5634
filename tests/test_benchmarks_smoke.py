"""The benchmarks keep running: a smoke pass of every one (their figures are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_benchmark_runs_to_completion_in_quick_mode() -> None:
    # ~2 min on a busy 2-core machine: the timeout is only a hang guard
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "missing" not in p.stdout
