"""``--sandbox`` end to end: a scripted run whose trunk tries to read a key outside its
workspace, through the real command, shell host and kernel; what ``run.json`` records; the
default of a scripted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exarch_actors.actors.landlock import abi
from tests.agent.conftest import exarch

SECRET = "SECRET-KEY-cli-41"


def _scenario(tmp_path: Path) -> tuple[Path, Path, Path]:
    key = tmp_path / "home" / ".ssh" / "id_rsa"
    key.parent.mkdir(parents=True)
    key.write_text(SECRET + "\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    toml = ws / "steal.toml"
    toml.write_text(
        '[fleet]\nprompt = "read the key"\n\n'
        f'[[agents.trunk]]\nral = ["cat {key}"]\n\n'
        '[[agents.trunk]]\nral = ["reply done"]\n'
    )
    return key, ws, toml


@pytest.mark.slow
@pytest.mark.skipif(abi() < 6, reason="needs Landlock ABI >= 6")
def test_a_workspace_write_run_is_refused_the_key_and_records_its_mode(tmp_path: Path) -> None:
    _key, ws, toml = _scenario(tmp_path)
    session = tmp_path / "session"
    p = exarch(
        ["run", str(toml), "--sandbox", "workspace-write", "--session-dir", str(session)], cwd=ws
    )
    assert p.returncode == 0, p.stderr
    assert json.loads((session / "run.json").read_text())["shellLimits"]["sandbox"] == (
        "workspace-write"
    )
    transcript = (session / "transcript.jsonl").read_text()
    assert "Permission denied" in transcript
    assert SECRET not in transcript
    for f in session.rglob("*"):
        assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f


@pytest.mark.slow
def test_a_scripted_run_without_sandbox_is_full_access_and_says_so_in_run_json(
    tmp_path: Path,
) -> None:
    _key, ws, toml = _scenario(tmp_path)
    session = tmp_path / "session"
    p = exarch(["run", str(toml), "--session-dir", str(session)], cwd=ws)
    assert p.returncode == 0, p.stderr
    assert json.loads((session / "run.json").read_text())["shellLimits"]["sandbox"] == (
        "full-access"
    )
    assert SECRET in (session / "transcript.jsonl").read_text()  # unconfined: the user's own
