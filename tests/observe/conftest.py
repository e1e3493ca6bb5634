"""What the observability tests share: the ``exarch-actors`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FANOUT = ROOT / "examples" / "fanout.toml"


def exarch(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``exarch-actors ARGS`` in a process of its own, from the repository's root."""
    return subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=None if env is None else dict(env),
    )
