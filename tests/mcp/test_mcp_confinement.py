"""A stdio MCP server runs confined like any program an agent starts: under ``--sandbox
workspace-write`` it writes the workspace and nothing else, and has no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.landlock import abi
from exarch_actors.runtime.ral.grants import GrantPolicy, Grants
from exarch_actors.runtime.shell.confinement import SandboxMode
from exarch_actors.runtime.shell.limits import ShellLimits
from tests.mcp.conftest import stdio_server

pytestmark = pytest.mark.skipif(abi() < 1, reason="this kernel has no Landlock")


def test_a_confined_server_writes_its_workspace_and_is_refused_outside_it(
    mcp_fleet: Any, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    inside, outside = work / "in.txt", tmp_path / "outside.txt"
    run = mcp_fleet(
        f"""
        [[agents.trunk]]
        ral = ['''
        let wrote = mcp t write [path: "{inside}", text: ok]
        try {{ mcp t write [path: "{outside}", text: no] }} catch e {{
          reply [wrote: $wrote, refused: (get $e message)]
        }}
        ''']
        """,
        servers=(stdio_server(work / "server.log"),),
        limits=ShellLimits(sandbox=SandboxMode.WORKSPACE_WRITE),
        grants=GrantPolicy(Grants.granting(roots=[str(work)])),
        cwd=str(work),
    )
    reply = run.reply()
    assert reply["wrote"] == {"result": str(inside)}
    assert inside.read_text() == "ok"
    assert reply["refused"].startswith("mcp t write: ")
    assert not outside.exists()


def test_an_unconfined_run_leaves_the_server_unconfined(mcp_fleet: Any, tmp_path: Path) -> None:
    outside = tmp_path / "anywhere.txt"
    run = mcp_fleet(
        f"""
        [[agents.trunk]]
        ral = ['reply (mcp t write [path: "{outside}", text: ok])']
        """,
        limits=ShellLimits(sandbox=SandboxMode.FULL_ACCESS),
    )
    assert run.reply() == {"result": str(outside)}
    assert outside.read_text() == "ok"
