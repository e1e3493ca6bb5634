"""The per-shell limit flags shared by ``run``, ``fleet`` and ``chat`` (the rules and defaults
live in :mod:`runtime.shell.limits`)::

    --shell-memory SIZE       RLIMIT_DATA of every shell host and worker (default 2GiB)
    --shell-procs N           processes at once per agent, in its pids cgroup (default 512)
    --max-workers N           running spawn workers per shell (default 64)
    --max-binding-bytes SIZE  largest binding a shell keeps (default 256MiB)
    --sandbox MODE            read-only | workspace-write | full-access (default: workspace-write
                              for a network model, full-access for a scripted run)

``@limit_options`` adds the flags and hands the command one ``limits: ShellLimits``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from exarch_actors.runtime.shell.confinement import (
    MODES,
    SandboxMode,
    SandboxUnavailable,
    check_mode,
)
from exarch_actors.runtime.shell.limits import (
    DEFAULT_MAX_BINDING_BYTES,
    DEFAULT_MAX_PROCESSES,
    DEFAULT_MAX_WORKERS,
    DEFAULT_SHELL_MEMORY,
    MIN_PROCESSES,
    BadLimit,
    ShellLimits,
    format_size,
    parse_size,
)

UNLIMITED = "unlimited"


def sandboxed(limits: ShellLimits, provider: str) -> ShellLimits:
    """``limits`` with the sandbox mode decided for ``provider``, refused (exit 2, said once)
    when the kernel cannot enforce it."""
    from exarch_actors.actors.landlock import abi

    limits = limits.resolved(provider)
    try:
        check_mode(limits.sandbox or SandboxMode.FULL_ACCESS, abi())
    except SandboxUnavailable as e:
        raise click.UsageError(str(e)) from None
    return limits


class Size(click.ParamType):
    """A byte size: ``65536``, ``512M``, ``2GiB`` (binary units); ``unlimited`` when allowed."""

    name = "size"

    def __init__(self, *, unlimited: bool = False) -> None:
        self.unlimited = unlimited

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) or value is None:
            return value
        text = str(value)
        if self.unlimited and text.strip().lower() == UNLIMITED:
            return None
        try:
            return parse_size(text)
        except BadLimit as e:
            self.fail(str(e), param, ctx)


def limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--shell-memory``, ``--max-workers`` and ``--max-binding-bytes`` to a click command
    (put it right above the function); the command receives them as ``limits``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        shell_memory: int | None,
        max_workers: int,
        max_binding_bytes: int,
        sandbox: str | None,
        shell_procs: int,
        **kwargs: Any,
    ) -> Any:
        mode = None if sandbox is None else SandboxMode(sandbox)
        try:
            limits = ShellLimits(shell_memory, max_workers, max_binding_bytes, mode, shell_procs)
        except BadLimit as e:
            raise click.UsageError(str(e)) from None
        return command(*args, limits=limits, **kwargs)

    options = [
        click.option(
            "--sandbox",
            type=click.Choice(MODES),
            default=None,
            help="Kernel confinement of every shell and program (Landlock + seccomp): "
            "workspace-write (writes only to the run's directory and scratch, no network), "
            "read-only, or full-access (none). Default: workspace-write with a network model, "
            "full-access for a scripted run. docs/security.md.",
        ),
        click.option(
            "--shell-memory",
            type=Size(unlimited=True),
            default=DEFAULT_SHELL_MEMORY,
            metavar="SIZE",
            help="Memory limit of each shell and worker process (RLIMIT_DATA; default "
            f"{format_size(DEFAULT_SHELL_MEMORY).replace(' ', '')}; '{UNLIMITED}' for none).",
        ),
        click.option(
            "--shell-procs",
            type=click.IntRange(min=MIN_PROCESSES),
            default=DEFAULT_MAX_PROCESSES,
            metavar="N",
            help="Processes at once per agent: its shell, workers and programs share one pids "
            f"cgroup (a fork bomb stops there; default {DEFAULT_MAX_PROCESSES}; where no pids "
            "cgroup is writable, no cap).",
        ),
        click.option(
            "--max-workers",
            type=click.IntRange(min=1),
            default=DEFAULT_MAX_WORKERS,
            metavar="N",
            help=f"Running spawn workers per shell (default {DEFAULT_MAX_WORKERS}).",
        ),
        click.option(
            "--max-binding-bytes",
            type=Size(),
            default=DEFAULT_MAX_BINDING_BYTES,
            metavar="SIZE",
            help="Largest binding a shell keeps; a larger let is refused (default "
            f"{format_size(DEFAULT_MAX_BINDING_BYTES).replace(' ', '')}).",
        ),
    ]
    decorated: Callable[..., Any] = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
