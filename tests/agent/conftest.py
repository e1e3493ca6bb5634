"""Fixtures for end-to-end agent runs: a scenario file and a session directory per test."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime.durable import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """A finished run: exit code, output and the session directory's files."""

    code: int
    stdout: str
    stderr: str
    session: Path

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return read_jsonl(self.session / name).records

    def events(self, agent: str) -> list[dict[str, Any]]:
        return read_jsonl(self.session / "agents" / agent / "events.jsonl").records

    @property
    def result(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.session / "result.json").read_text())
        return data

    def kinds(self, name: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.jsonl(name) if r.get("kind") == kind]


@pytest.fixture
def run_scenario(tmp_path: Path) -> Callable[..., Run]:
    """Write a scenario and run ``exarch-actors run`` on it in a real subprocess."""

    def run(toml: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Run:
        scenario = tmp_path / "scenario.toml"
        scenario.write_text(textwrap.dedent(toml))
        session = tmp_path / "session"
        cmd = [
            sys.executable,
            "-c",
            "from cli.main import main; main()",
            "run",
            str(scenario),
            "--session-dir",
            str(session),
            *args,
        ]
        import os

        full_env = {**os.environ, **(env or {})}
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=full_env
        )
        return Run(p.returncode, p.stdout, p.stderr, session)

    return run
