"""examples/regression.toml's header shows a record -> replay round trip as a shell session; this
runs every ``$`` line of it in a fresh directory and checks that each prints what the header
shows, so the example cannot drift from what the commands do."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.agent.conftest import exarch
from tests.support.terminal import ROOT

EXAMPLE = ROOT / "examples" / "regression.toml"


def _session() -> list[tuple[str, list[str]]]:
    """The header's ``$ command`` lines, each with the lines it shows after it."""
    header = re.findall(r"^#   (.*)$", EXAMPLE.read_text(), re.MULTILINE)
    steps: list[tuple[str, list[str]]] = []
    for line in header:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(line)
    return steps


@pytest.mark.slow
def test_the_documented_round_trip_prints_what_the_example_shows(tmp_path: Path) -> None:
    steps = _session()
    assert [cmd.split()[:2] for cmd, _ in steps] == [
        ["exarch-actors", "run"],
        ["exarch-actors", "run"],
        ["exarch-actors", "replay"],
        ["printf", "'1\\n2\\n'"],
        ["exarch-actors", "replay"],
    ]
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / EXAMPLE.name).write_bytes(EXAMPLE.read_bytes())
    codes = []
    for cmd, shown in steps:
        if cmd.startswith("printf "):
            (tmp_path / "numbers.txt").write_text("1\n2\n")
            continue
        p = exarch(shlex.split(cmd)[1:], cwd=tmp_path, timeout=120)
        assert p.stdout.splitlines() == shown, f"{cmd}\n{p.stderr}"
        codes.append(p.returncode)
    assert codes == [0, 0, 0, 1], "only the replay after the change diverges"
