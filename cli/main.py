"""The ``exarch-actors`` command: a click group whose subcommands load lazily.

Lazy loading keeps ``exarch-actors ral -c ...`` from importing the actor stack (pykka, the
providers), which the one-liner does not need.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import click

_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, attribute, one-line help)
    "ral": ("cli.ral", "ral_command", "Run ral: a REPL, a one-liner (-c) or a file."),
    "run": ("cli.run", "run_command", "Run a headless trunk on a scenario or a prompt."),
    "fleet": (
        "cli.fleet",
        "fleet_command",
        "Run a scenario with a live spawn-tree view.",
    ),
    "drill": ("cli.drill", "drill_command", "Break a live fleet on purpose and check invariants."),
    "check": ("cli.check", "check_command", "Check a session directory's invariants."),
    "resume": ("cli.resume", "resume_command", "Resume a run from its session directory."),
    "chat": ("cli.chat", "chat_command", "Talk to a conversing trunk in a terminal UI."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in _SUBCOMMANDS if self._available(n))

    @staticmethod
    def _available(name: str) -> bool:
        module, _, _ = _SUBCOMMANDS[name]
        return importlib.util.find_spec(module) is not None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _SUBCOMMANDS.get(cmd_name)
        if entry is None or not self._available(cmd_name):
            return None
        module, attr, _ = entry
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command)
        return cmd


@click.group(cls=_LazyGroup, invoke_without_command=True)
@click.version_option(package_name="exarch-actors")
@click.pass_context
def main(ctx: click.Context, **_: Any) -> None:
    """exarch-actors: fleets of LLM agents, each with a persistent ral shell."""
    if ctx.invoked_subcommand is None:
        if _LazyGroup._available("chat"):
            ctx.invoke(_LazyGroup().get_command(ctx, "chat") or click.Command("noop"))
        else:
            click.echo(ctx.get_help())
