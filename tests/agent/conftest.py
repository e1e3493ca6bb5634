"""Fixtures for agent runs driven by scenarios.

- ``run_scenario``: the real ``exarch-actors run`` command on a scenario, in a subprocess; the
  finished :class:`Run` reads the session directory's files.
- ``live_fleet``: the same fleet in this process, for what a subprocess cannot show (steering,
  slash commands and interrupts pushed mid-run, a provider wrapped to record what it was sent).
  Every fleet it starts is closed and every shell reaped when the test ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def read_records(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path).records if path.exists() else []


@dataclass
class Run:
    """A finished run: exit code, output and the session directory's files."""

    code: int
    stdout: str
    stderr: str
    session: Path

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return read_records(self.session / name)

    def events(self, agent: str) -> list[dict[str, Any]]:
        return read_records(self.session / "agents" / agent / "events.jsonl")

    @property
    def result(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.session / "result.json").read_text())
        return data

    def kinds(self, name: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.jsonl(name) if r.get("kind") == kind]

    def commits(self) -> list[dict[str, Any]]:
        """Every agent's ``Commit`` records (each in its own ``commits.jsonl``)."""
        files = SessionDir(self.session).record_files()
        return [r for p in files for r in read_records(p) if r.get("kind") == "Commit"]

    def nudges(self, agent: str = "trunk") -> list[str]:
        return [e["nudge"] for e in self.events(agent) if e["kind"] == "nudge"]


def exarch(
    args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``exarch-actors ARGS`` in a subprocess (the installed entry point's code, this tree)."""
    cmd = [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env
    )


def scenario_run(
    directory: Path,
    toml: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> Run:
    """Write ``toml`` into ``directory`` and run ``exarch-actors run`` on it there, finished.

    Also for a module-scoped fixture: tests that only read one run's outputs share it."""
    scenario = directory / "scenario.toml"
    scenario.write_text(textwrap.dedent(toml))
    session = directory / "session"
    p = exarch(
        ["run", str(scenario), "--session-dir", str(session), *args],
        cwd=directory,
        env=env,
        timeout=timeout,
    )
    return Run(p.returncode, p.stdout, p.stderr, session)


@pytest.fixture
def run_scenario(tmp_path: Path) -> Callable[..., Run]:
    """Write a scenario and run ``exarch-actors run`` on it in a real subprocess."""

    def run(toml: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Run:
        return scenario_run(tmp_path, toml, *args, env=env, timeout=timeout)

    return run


@dataclass
class Live:
    """A fleet running in this process on a scripted scenario."""

    fleet: Any
    session: Path
    trunk: Any
    closed: bool = False
    yield_: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def events(self, agent: str = "trunk") -> list[dict[str, Any]]:
        return read_records(self.session / "agents" / agent / "events.jsonl")

    def transcript(self) -> list[dict[str, Any]]:
        self.fleet.bus.flush()
        return read_records(self.session / "transcript.jsonl")

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.transcript() if r.get("kind") == kind]

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.session / "record.jsonl")

    def steer(self, text: str, agent: str = "trunk") -> None:
        self.fleet.registry.steer(agent, text)

    def wait_events(
        self, pred: Callable[[list[dict[str, Any]]], Any], agent: str = "trunk", timeout: float = 10
    ) -> Any:
        return wait_for(lambda: pred(self.events(agent)), timeout, f"{agent}'s events")

    def wait_idle(self, handled: int, agent: str = "trunk", timeout: float = 10) -> None:
        """Wait until ``agent`` has handled ``handled`` inbox items (model turns and slash
        commands alike) and is parked again."""
        a = self.fleet.agents[agent]
        wait_for(
            lambda: a.stats.handled >= handled and a.stats.state == "idle" and not len(a.inbox),
            timeout,
            f"{agent} idle after {handled} inbox items",
        )

    def close(self) -> Any:
        if not self.closed:
            self.closed = True
            self.yield_ = self.fleet.close()
        return self.yield_


@pytest.fixture
def live_fleet(tmp_path: Path) -> Iterator[Callable[..., Live]]:
    """Start a fleet in-process: ``live_fleet(toml, interactive=True, wrap=None, grants=None,
    ...)``.

    ``wrap(provider) -> provider`` lets a test record or alter what each agent's provider does.
    An interactive trunk parks for its human between turns; drive it with :meth:`Live.steer`.
    """
    from exarch_actors.actors.fleet import Fleet, FleetConfig
    from exarch_actors.runtime.providers.scenario import parse_scenario
    from exarch_actors.runtime.providers.scripted import ScenarioPlayback
    from exarch_actors.runtime.state.session_dir import SessionDir

    started: list[Live] = []

    def start(
        toml: str,
        *,
        interactive: bool = True,
        wrap: Callable[[Any], Any] | None = None,
        disk_warn_bytes: int | None = None,
        prompt: str | None = None,
        chat: bool = False,
        grants: Any = None,
    ) -> Live:
        path = tmp_path / "scenario.toml"
        text = textwrap.dedent(toml)
        path.write_text(text)
        playback = ScenarioPlayback(parse_scenario(text, source=str(path)))

        def provider_for(name: str) -> Any:
            p = playback.provider(name)
            return wrap(p) if wrap is not None else p

        session = SessionDir.at(tmp_path / f"session{len(started)}")
        config = FleetConfig(disk_warn_bytes=disk_warn_bytes)
        if grants is not None:  # a runtime.ral.grants.GrantPolicy
            config = FleetConfig(disk_warn_bytes=disk_warn_bytes, grants=grants)
        fleet = Fleet(session, provider_for, config)
        live = Live(fleet, session.root, None, extra={"playback": playback})
        started.append(live)
        live.trunk = fleet.start_trunk(
            prompt if prompt is not None else playback.scenario.prompt,
            interactive=interactive,
            chat=chat,
            system=playback.scenario.system,
        )
        return live

    try:
        yield start
    finally:
        for live in started:
            live.close()


@pytest.fixture
def protocol_server() -> Iterator[Any]:
    """A real streaming HTTP server on 127.0.0.1 (tests/support/protocol_servers.py)."""
    from tests.support.protocol_servers import ProtocolServer

    s = ProtocolServer().start()
    try:
        yield s
    finally:
        s.stop()
