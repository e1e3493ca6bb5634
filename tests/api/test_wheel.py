"""The built wheel, installed in a fresh venv: one top-level package, and the fanout example
run through the console script (by its packaged name) and through the API, beside a user's own
``cli``, ``runtime`` and ``actors`` packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sh(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_installs_only_exarch_actors_and_runs_fanout_by_script_and_by_api(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    _sh(sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "-q", "-w", wheels, cwd=tmp_path)
    (wheel,) = wheels.glob("exarch_actors-*.whl")
    venv = tmp_path / "venv"
    _sh(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _sh(venv / "bin" / "pip", "install", "-q", wheel, cwd=tmp_path)
    (record,) = venv.glob("lib/python*/site-packages/exarch_actors-*.dist-info/RECORD")
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    assert tops == {"exarch_actors", record.parent.name, ".."}  # ..: bin/exarch-actors
    scripts = {line.split(",")[0] for line in record.read_text().splitlines()}
    assert any(s.endswith("/bin/exarch-actors") for s in scripts)
    work = tmp_path / "work"  # no examples/ here: the packaged copy is what runs
    work.mkdir()
    by_script = _sh(venv / "bin" / "exarch-actors", "run", "fanout", "-q", cwd=work)
    assert by_script.stdout.strip() == "499500"
    for mine in ("cli", "runtime", "actors"):  # a user's own packages of these names
        (work / mine).mkdir()
        (work / mine / "__init__.py").write_text(f"NAME = {mine!r}\n")
    by_api = _sh(
        venv / "bin" / "python",
        "-c",
        "import cli, runtime, actors, exarch_actors; "
        "print(exarch_actors.run('fanout').reply, cli.NAME, runtime.NAME, actors.NAME)",
        cwd=work,
    )
    assert by_api.stdout.strip() == "499500 cli runtime actors"
