"""Where a run's servers come from on the command line: ``--mcp``, the config files'
``[mcp.NAME]`` tables, ``--grant-mcp``, and the refusals (exit 2) of what cannot be a server."""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

from tests.agent.conftest import exarch
from tests.mcp.conftest import SERVER

ADD = """
[fleet]
prompt = "add"

[[agents.trunk]]
ral = ['reply (get (mcp t add [a: 1, b: 2]) sum)']
"""


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(ADD))
    return path


def test_the_mcp_flag_gives_the_fleet_a_stdio_server(tmp_path: Path) -> None:
    command = shlex.join([sys.executable, SERVER, str(tmp_path / "log")])
    p = exarch(
        ["run", str(_scenario(tmp_path)), "--mcp", f"t={command}", "--session-dir", "s"],
        cwd=tmp_path,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "3"
    assert (tmp_path / "s" / "mcp" / "t.stderr").exists()  # the server's stderr is kept


def test_a_project_config_file_names_a_server_every_run_gets(tmp_path: Path) -> None:
    (tmp_path / ".exarch").mkdir()
    (tmp_path / ".exarch" / "config.toml").write_text(
        textwrap.dedent(
            f"""
            [mcp.t]
            command = "{{python}}"
            args = [{SERVER!r}, "{{here}}/log"]
            """
        )
    )
    p = exarch(["run", str(_scenario(tmp_path)), "--session-dir", "s"], cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "3"
    assert (tmp_path / ".exarch" / "log").read_text() == "done add\n"


def test_a_grant_of_a_server_that_is_not_configured_is_a_usage_error(tmp_path: Path) -> None:
    p = exarch(
        ["run", str(_scenario(tmp_path)), "--grant-mcp", "tt", "--session-dir", "s"],
        cwd=tmp_path,
    )
    assert p.returncode == 2
    assert "--grant-mcp tt: no such MCP server (configured: none)" in p.stderr
    assert not (tmp_path / "s").exists()


def test_a_scenario_table_with_no_transport_is_refused_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(ADD) + '\n[mcp.t]\ncomand = "x"\n')
    p = exarch(["run", str(path), "--session-dir", "s"], cwd=tmp_path)
    assert p.returncode == 2
    assert f"{path}:8: mcp.t: unknown key comand" in p.stderr
