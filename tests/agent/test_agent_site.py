"""The agent reaches the fleet only through its site (actors/agent_site.py).

The agent's modules (the node, its desk, its slash commands, its executor, the site interface)
must not import the fleet, by any import: module level, type-checking or function-local. The
verb and command tables are explicit, so what runs for a name can be followed by grep.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from exarch_actors.actors.desk import _VERBS, DEFERRED_VERBS
from exarch_actors.actors.slash_commands import _COMMANDS, COMMANDS
from exarch_actors.runtime.mcp.values import VERBS as MCP_VERBS
from exarch_actors.runtime.prompt import advertised_verbs

ROOT = Path(__file__).resolve().parents[2]

AGENT_SIDE = (
    "exarch_actors.actors.agent",
    "exarch_actors.actors.agent_site",
    "exarch_actors.actors.desk",
    "exarch_actors.actors.slash_commands",
    "exarch_actors.actors.agent_executor",
    "exarch_actors.actors.agent_shell",
    "exarch_actors.actors.agent_process_host",  # an agent process runs the agent without the fleet
)


def _module_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, wherever the import statement stands."""
    tree = ast.parse(_module_path(module).read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if _module_path(m).exists()}


def _reachable(start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or not module.startswith("exarch_actors."):
            continue
        seen.add(module)
        todo.extend(_imports(module))
    return seen


@pytest.mark.slow
def test_no_agent_module_reaches_the_fleet_or_the_cli_by_any_import() -> None:
    for module in AGENT_SIDE:
        reached = _reachable(module)
        assert "exarch_actors.actors.fleet" not in reached, module
        assert not {m for m in reached if m.startswith("exarch_actors.cli.")}, module


def test_the_import_scan_sees_type_checking_and_function_local_imports() -> None:
    # the fleet imports the agent at module level; resume imports the fleet inside a function
    assert "exarch_actors.actors.agent" in _imports("exarch_actors.actors.fleet")
    assert "exarch_actors.actors.fleet" in _imports("exarch_actors.actors.resume")
    assert "exarch_actors.actors.agent_site" in _imports(
        "exarch_actors.actors.agent"
    )  # the Protocol, type-checking too


def test_every_verb_a_desk_can_advertise_has_an_explicit_handler() -> None:
    every = advertised_verbs(returns=True) | advertised_verbs(returns=False) | MCP_VERBS
    # ``agent`` also takes the fork scope; a deferred verb is answered through ``begin``
    assert every - {"agent"} == set(_VERBS) | DEFERRED_VERBS
    assert not DEFERRED_VERBS & set(_VERBS)


def test_the_unknown_command_refusal_lists_exactly_the_commands_that_run() -> None:
    assert set(COMMANDS) == set(_COMMANDS)
    assert all(name.startswith("/") for name in COMMANDS)
