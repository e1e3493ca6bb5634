"""``--durability process|machine``, shared by ``run``, ``fleet``, ``chat``, ``resume`` and
``drill`` (the policy and what each promises live in :mod:`runtime.state.durability`).

``@durability_option`` adds the flag and hands the command ``durability: Durability`` (or
``None`` with ``inherit=True``: ``resume`` keeps what ``run.json`` says unless told otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from exarch_actors.runtime.state.durability import DEFAULT, PROMISES, Durability

HELP = (
    "What an acknowledged record of the session's files survives. process: written "
    "before it is acknowledged, no fsync per record; survives a SIGKILL of any process, not a "
    "power loss. machine: fsync'd before it is acknowledged (group commit: one fsync covers "
    "every record that arrived meanwhile); survives a kernel crash or power loss too."
)


def durability_option(*, inherit: bool = False) -> Callable[[Callable[..., Any]], Any]:
    """The ``--durability`` click option; ``inherit``: no default (``resume``)."""
    return click.option(
        "--durability",
        type=click.Choice([d.value for d in Durability]),
        default=None if inherit else DEFAULT.value,
        show_default=not inherit,
        callback=_to_policy,
        help=HELP + (" Default: the run's own, from run.json." if inherit else ""),
    )


def _to_policy(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    return None if value is None else Durability(value)


def describe_durability(policy: Durability) -> str:
    """``durability: machine (...)`` -- one line for a report."""
    return f"durability: {policy.value} ({PROMISES[policy]})"
