"""Everything the distribution ships lives under ``exarch_actors``: a user's own top-level
``cli``, ``runtime`` or ``actors`` package imports beside it, in either order, in one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SHORT = ("runtime", "actors", "cli")

_PROBE = """
import json, sys
import cli, runtime, actors  # the user's own, imported first
import exarch_actors
from exarch_actors.cli.main import main
import exarch_actors.runtime.ral
import exarch_actors.actors.fleet
print(json.dumps({
    "reply": exarch_actors.run("fanout", session_dir=sys.argv[1]).reply,
    "mine": [cli.NAME, runtime.NAME, actors.NAME],
    "short": sorted(
        m for m in sys.modules
        if m.split(".")[0] in ("runtime", "actors", "cli") and m not in ("runtime", "actors", "cli")
    ),
}))
"""


def _user_packages(where: Path) -> None:
    for name in _SHORT:
        (where / name).mkdir()
        (where / name / "__init__.py").write_text(f"NAME = 'mine:{name}'\n")


@pytest.mark.timeout(120)
def test_a_users_own_cli_runtime_and_actors_packages_import_beside_exarch_actors(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _user_packages(work)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "session")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["reply"] == "499500"
    assert said["mine"] == ["mine:cli", "mine:runtime", "mine:actors"]
    assert said["short"] == []  # nothing of exarch_actors was loaded under a short name


@pytest.mark.timeout(60)
def test_the_command_and_the_api_load_no_module_under_a_short_top_level_name() -> None:
    probe = (
        "import sys, exarch_actors, exarch_actors.api\n"
        "from exarch_actors.cli.main import _SUBCOMMANDS\n"
        "import importlib\n"
        "for module, _attr, _help in _SUBCOMMANDS.values():\n"
        "    importlib.import_module(module)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_SHORT!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
