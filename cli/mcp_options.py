"""``--mcp NAME=COMMAND…`` and ``--grant-mcp NAME`` for ``run``, ``fleet`` and ``chat``
(docs/mcp.md).

A run's MCP servers are, by name and later over earlier: the user's config file's
``[mcp.NAME]`` tables, the project's, the scenario's, then ``--mcp`` flags
(:func:`runtime.mcp.config.merged`). ``--grant-mcp`` narrows every agent to the named servers
(repeatable; none given: every configured server), as ``--grant-exec`` narrows programs; a
scenario's ``[grants.PATTERN] mcp = [...]`` narrows further per agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from exarch_actors.cli import config
from exarch_actors.runtime.mcp.config import McpConfigInvalid, McpServer, merged, server_from_flag
from exarch_actors.runtime.providers.scenario import Scenario

F = TypeVar("F", bound=Callable[..., Any])


def _servers(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    try:
        return tuple(server_from_flag(v) for v in value)
    except McpConfigInvalid as e:
        raise click.BadParameter(str(e), ctx, param) from None


def mcp_options(f: F) -> F:
    """Add ``--mcp`` and ``--grant-mcp`` to a running command."""
    f = click.option(
        "--grant-mcp",
        multiple=True,
        metavar="NAME",
        help="Allow only the MCP server NAME (repeatable; none given: every configured one). "
        "A child never gains a server its parent lacks.",
    )(f)
    f = click.option(
        "--mcp",
        "mcp",
        multiple=True,
        metavar="NAME=COMMAND",
        callback=_servers,
        help="An MCP server for the fleet (repeatable): NAME=COMMAND [ARG...] starts a stdio "
        "server at its first use (confined like a shell, one per fleet); NAME=URL connects to a "
        "streamable-HTTP one. Agents call its tools with `mcp NAME TOOL [ARGS]` (docs/mcp.md). "
        "Over [mcp.NAME] tables of the scenario and config files.",
    )(f)
    return f


def run_servers(flags: tuple[McpServer, ...], scenario: Scenario | None) -> tuple[McpServer, ...]:
    """The run's servers: config files', then the scenario's, then the flags'."""
    configured = config.current().get("mcp") or ()
    return merged(configured, scenario.mcp if scenario is not None else (), flags)


def check_grants(grant_mcp: tuple[str, ...], servers: tuple[McpServer, ...]) -> None:
    """A ``--grant-mcp`` naming no configured server is a usage error (a typo would otherwise
    silently deny the server it meant)."""
    known = {s.name for s in servers}
    for name in grant_mcp:
        if name not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise click.UsageError(f"--grant-mcp {name}: no such MCP server (configured: {listed})")


__all__ = ["check_grants", "mcp_options", "run_servers"]
