"""The ``exarch-actors`` command: a click group whose subcommands load lazily.

Lazy loading keeps ``exarch-actors ral -c ...`` from importing the actor stack (pykka, the
providers), which the one-liner does not need.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

from exarch_actors.cli import HELP_SETTINGS, exit_guard

_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, attribute, one-line help)
    "ral": ("exarch_actors.cli.ral", "ral_command", "Run ral: a REPL, a one-liner (-c) or a file."),
    "run": (
        "exarch_actors.cli.run",
        "run_command",
        "Run a trunk on a scenario or a prompt; print its reply.",
    ),
    "fleet": (
        "exarch_actors.cli.fleet",
        "fleet_command",
        "Run a scenario or a prompt with a live spawn-tree view.",
    ),
    "drill": (
        "exarch_actors.cli.drill",
        "drill_command",
        "Break a fleet on purpose; check its invariants.",
    ),
    "check": (
        "exarch_actors.cli.check",
        "check_command",
        "Check a session directory's invariants.",
    ),
    "resume": (
        "exarch_actors.cli.resume",
        "resume_command",
        "Resume a run from its session directory.",
    ),
    "replay": (
        "exarch_actors.cli.replay",
        "replay_command",
        "Replay a recorded session offline; report where ral results diverge.",
    ),
    "chat": (
        "exarch_actors.cli.chat",
        "chat_command",
        "Talk to a conversing trunk in a terminal UI.",
    ),
    "trace": (
        "exarch_actors.cli.trace",
        "trace_command",
        "Write a session as a Chrome trace (Perfetto JSON), one track per agent.",
    ),
    "report": (
        "exarch_actors.cli.report",
        "report_command",
        "Write a session as one self-contained HTML report.",
    ),
    "sessions": (
        "exarch_actors.cli.sessions",
        "sessions_command",
        "List the sessions under .exarch/sessions; prune old ones (never a live one).",
    ),
}


class _LazyGroup(click.Group):
    def main(self, args: Any = None, *rest: Any, **kw: Any) -> Any:
        """The command, run as a process (``args`` None: ``sys.argv``) with the exit guard:
        once it is done the process ends promptly, whatever its threads still do
        (``cli/exit_guard.py``)."""
        if args is not None:  # a caller's list (a test runner): the process is not ours to end
            return super().main(args, *rest, **kw)
        exit_guard.install()
        try:
            return super().main(args, *rest, **kw)
        except SystemExit as e:
            exit_guard.exiting_with(e.code)
            raise

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
        cmd.short_help = cmd.short_help or _SUBCOMMANDS[cmd_name][2]  # the table's one line
        return cmd


@click.group(
    cls=_LazyGroup,
    invoke_without_command=True,
    context_settings=HELP_SETTINGS,  # every subcommand declares the same itself
)
@click.version_option(package_name="exarch-actors")
@click.pass_context
def main(ctx: click.Context, **_: Any) -> None:
    """exarch-actors: fleets of LLM agents, each with a persistent ral shell.

    With no command, `exarch-actors` opens the chat UI on a packaged scripted demo (no
    network, no key); without a terminal it prints this help and exits 2.
    `exarch-actors COMMAND -h` shows a command's options, what it prints and its exit codes.

    \b
    First steps:
      exarch-actors run examples/fanout.toml     a scripted fleet: prints 499500
      exarch-actors run fanout                   the same, from the installed examples
      exarch-actors                              the chat UI on the scripted demo
      exarch-actors run --provider openai --model M "a prompt"       a real model
      exarch-actors check .exarch/sessions/<id>  check what a run left behind
      exarch-actors sessions                     list the runs; --prune --keep N removes old ones

    \b
    Exit codes (each command's -h has its own list):
      0    success: the trunk replied or quiesced; all invariants held
      1    a failed or capped run, a run stopped by --budget, a ral error, a violated invariant
      2    bad input: a usage error, an unreadable file, a missing API key
      130  cancelled by Ctrl-C
    """
    name = ctx.invoked_subcommand
    if name in ("run", "fleet", "chat"):  # config.COMMANDS, without importing it for `ral`
        from exarch_actors.cli import config

        config.load_for_command(ctx, name, _LazyGroup().get_command(ctx, name))
    if name is None:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            # the chat UI on a pipe wrote escape codes into it and hung waiting for keys
            click.echo(ctx.get_help())
            click.echo("\nno terminal: the chat UI needs one; give a COMMAND (see above)", err=True)
            ctx.exit(2)
        if _LazyGroup._available("chat"):
            ctx.invoke(_LazyGroup().get_command(ctx, "chat") or click.Command("noop"))
        else:
            click.echo(ctx.get_help())
