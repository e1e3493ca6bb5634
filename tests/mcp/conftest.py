"""MCP against real servers: the loopback server of ``loopback_server.py`` (the official SDK),
started by the fleet over stdio or by a test on 127.0.0.1 over streamable HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.runtime.mcp.config import McpServer
from tests.support.waiting import wait_for

SERVER = str(Path(__file__).with_name("loopback_server.py"))


def stdio_server(log: Path, name: str = "t") -> McpServer:
    """The loopback server as a stdio server the fleet starts; each call it sees goes to LOG."""
    return McpServer(name, command=sys.executable, args=(SERVER, str(log)), description="loopback")


def seen(log: Path) -> list[str]:
    """What the server noted, line by line."""
    return log.read_text().splitlines() if log.exists() else []


@dataclass
class McpRun:
    fleet: Any
    session: Path
    log: Path

    def reply(self, timeout: float = 30) -> Any:
        """The trunk's reply once the fleet has ended."""
        assert self.fleet.wait_empty(timeout), "the fleet did not end"
        assert self.fleet.trunk.replied, "the trunk did not reply"
        return self.fleet.trunk.reply_value


@pytest.fixture
def mcp_fleet(tmp_path: Path) -> Iterator[Callable[..., McpRun]]:
    """``mcp_fleet(toml, servers=None, agents="thread", **config)``: a headless scripted fleet
    in this process whose MCP servers are ``servers`` (default: the stdio loopback as ``t``)."""
    from exarch_actors.actors.fleet import Fleet, FleetConfig
    from exarch_actors.actors.mcp_site import McpSetup
    from exarch_actors.runtime.providers.scenario import parse_scenario
    from exarch_actors.runtime.providers.scripted import ScenarioPlayback
    from exarch_actors.runtime.state.session_dir import SessionDir

    runs: list[McpRun] = []

    def start(
        toml: str,
        *,
        servers: tuple[McpServer, ...] | None = None,
        agents: str = "thread",
        **config: Any,
    ) -> McpRun:
        log = tmp_path / "server.log"
        scenario = parse_scenario(textwrap.dedent(toml), source=str(tmp_path / "s.toml"))
        playback = ScenarioPlayback(scenario)
        session = SessionDir.at(tmp_path / f"session{len(runs)}")
        setup = McpSetup(servers if servers is not None else (stdio_server(log),))
        fleet = Fleet(
            session,
            lambda name: playback.provider(name),
            FleetConfig(mcp=setup, agents=agents, **config),  # type: ignore[arg-type]
        )
        run = McpRun(fleet, session.root, log)
        runs.append(run)
        fleet.start_trunk(scenario.prompt or "go")
        return run

    try:
        yield start
    finally:
        for run in runs:
            run.fleet.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The loopback server on 127.0.0.1 over streamable HTTP: (its URL, its log)."""
    log = tmp_path / "http.log"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, str(log), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    try:
        wait_for(listening, 30, "the HTTP MCP server to listen")
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.kill()
        proc.wait()
