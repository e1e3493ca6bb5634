"""The grant flags ``ral``, ``run`` and ``chat`` share, and the fleet policy they build.

``--grant-exec PROG`` and ``--grant-root DIR`` (both repeatable) are resolved once, here, in the
control process: a program on this process's PATH (or a path), a root made a real directory. A
grant that cannot be made exits 2 with the reason; nothing is started.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from exarch_actors.runtime.errors import GrantUnresolvable, ScenarioError
from exarch_actors.runtime.providers.scenario import Scenario
from exarch_actors.runtime.ral.grants import GrantPolicy, Grants

F = TypeVar("F", bound=Callable[..., Any])


def grant_options(f: F) -> F:
    """Add ``--grant-exec`` and ``--grant-root`` to a click command."""
    f = click.option(
        "--grant-root",
        multiple=True,
        metavar="DIR",
        help="Confine file builtins to DIR (repeatable; links are resolved, outside is refused).",
    )(f)
    f = click.option(
        "--grant-exec",
        multiple=True,
        metavar="PROG",
        help="Allow only PROG (repeatable; resolved on PATH now, so a PATH set in ral never "
        "changes what runs).",
    )(f)
    return f


def grants_from_flags(
    grant_exec: Sequence[str], grant_root: Sequence[str], grant_mcp: Sequence[str] = ()
) -> Grants:
    """The grants the flags describe (no flag: unrestricted); a bad grant is a usage error."""
    try:
        return Grants.granting(
            exec=list(grant_exec) if grant_exec else None,
            roots=list(grant_root) if grant_root else None,
            mcp=list(grant_mcp) if grant_mcp else None,
        )
    except GrantUnresolvable as e:
        flag = "--grant-exec" if e.what.startswith("exec ") else "--grant-root"
        raise click.UsageError(f"{flag}: {e}") from None


def fleet_policy(
    grant_exec: Sequence[str],
    grant_root: Sequence[str],
    scenario: Scenario | None,
    grant_mcp: Sequence[str] = (),
) -> GrantPolicy:
    """The fleet's grants: the flags for every agent, narrowed per agent by the scenario's
    ``[grants.PATTERN]`` tables (resolved against this process's PATH and cwd)."""
    base = grants_from_flags(grant_exec, grant_root, grant_mcp)
    if scenario is None or not scenario.grants:
        return GrantPolicy(base)
    try:
        tables = scenario.resolve_grants(cwd=os.getcwd())
    except ScenarioError as e:
        raise click.UsageError(str(e)) from None
    return GrantPolicy(base, tables)
