"""Defaults from config files: ``~/.config/exarch-actors/config.toml`` (the user's; under
``$XDG_CONFIG_HOME`` when set) and ``.exarch/config.toml`` (the project's, in the working
directory), the project's overriding the user's, and a flag overriding both::

    provider = "openai"          # the provider of a PROMPT (a SCENARIO.toml stays scripted)
    model = "gpt-4o-mini"        # with that provider (a --provider naming another ignores it)
    base_url = "http://127.0.0.1:8080/v1"
    durability = "machine"       # process | machine
    agents = "thread"            # thread | process
    shell_memory = "4GiB"
    shell_procs = 256
    max_workers = 32
    max_binding_bytes = "64MiB"

``[mcp.NAME]`` tables name MCP servers every run gets (docs/mcp.md; a scenario's and ``--mcp``
override one of the same name). They apply to ``run``, ``fleet`` and ``chat``; ``run
--show-config`` prints every value and where it came from. The limit, durability and agents keys
become the commands' defaults (click's ``default_map``: a flag still wins, and the value is
checked as the flag's would be). The provider keys are defaults of the provider's choice only: a
scenario is still played by the scripted provider unless ``--provider`` says otherwise, and
``model`` / ``base_url`` apply only to the provider the file names (a model of one vendor is
never sent to another's API). An API key is never read from a config file: keys stay in the
environment or ``--api-key``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from exarch_actors.cli.provider_options import ProviderChoice
from exarch_actors.runtime.mcp.config import McpConfigInvalid, merged, servers_from_doc

CONNECTION_KEYS = ("provider", "model", "base_url")
DEFAULT_KEYS = (
    "durability",
    "agents",
    "shell_memory",
    "shell_procs",
    "max_workers",
    "max_binding_bytes",
)
KEYS = CONNECTION_KEYS + DEFAULT_KEYS
COMMANDS = ("run", "fleet", "chat")
"""The commands a config file sets defaults for (``resume`` keeps what its run.json says)."""

_META = "exarch.config"


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "exarch-actors" / "config.toml"


def project_config_path() -> Path:
    return Path(".exarch") / "config.toml"


@dataclass(frozen=True)
class Config:
    """Every key a config file set, with the file it came from (the project's wins)."""

    values: dict[str, tuple[Any, Path]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def get(self, key: str) -> Any:
        got = self.values.get(key)
        return got[0] if got is not None else None

    def default_map(self, command: click.Command) -> dict[str, Any]:
        """The keys ``command`` has a flag for, as its ``default_map``."""
        names = {p.name for p in command.params}
        return {k: v for k, (v, _) in self.values.items() if k in DEFAULT_KEYS and k in names}


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise click.UsageError(f"cannot read config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise click.UsageError(f"config {path}: {e}") from None


def load_config(command: click.Command | None = None) -> Config:
    """The user's file, then the project's over it. A value of the wrong kind is exit 2 naming
    the file and key; an unknown key is a warning (a typo is never silently lost)."""
    values: dict[str, tuple[Any, Path]] = {}
    warnings: list[str] = []
    params = {p.name: p for p in command.params} if command is not None else {}
    for path in (user_config_path(), project_config_path()):
        for key, value in _read(path).items():
            if key == "mcp":
                try:
                    servers = servers_from_doc(value, str(path), str(path.resolve().parent))
                except McpConfigInvalid as e:
                    raise click.UsageError(f"config {e}") from None
                earlier = values.get("mcp", ((), path))[0]
                values["mcp"] = (merged(earlier, servers), path)
                continue
            if key not in KEYS:
                warnings.append(f"{path}: {key}: unknown key (ignored; known: {', '.join(KEYS)})")
                continue
            param = params.get(key)
            if key in CONNECTION_KEYS:
                if not isinstance(value, str):
                    raise click.UsageError(f"config {path}: {key}: expected a string")
                if key == "provider" and param is not None:
                    _check(param, value, path, key)
            elif param is not None:
                _check(param, value, path, key)
            values[key] = (value, path)
    return Config(values, tuple(warnings))


def _check(param: click.Parameter, value: Any, path: Path, key: str) -> None:
    try:
        param.type.convert(value, param, None)
    except click.BadParameter as e:
        raise click.UsageError(f"config {path}: {key}: {e.message}") from None


def load_for_command(ctx: click.Context, name: str | None, command: click.Command | None) -> None:
    """Load the config for subcommand ``name`` of the group's ``ctx`` (before its context is
    made): its defaults go to ``ctx.default_map``, the whole config to ``ctx.meta``."""
    if name not in COMMANDS or command is None:
        return
    config = load_config(command)
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
    ctx.default_map = {name: config.default_map(command)}
    ctx.meta[_META] = config


def current() -> Config:
    """The config the group loaded for this command (empty for a command invoked on its own)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.meta.get(_META) if ctx is not None else None
    return found if isinstance(found, Config) else Config()


def with_config(connection: ProviderChoice, *, scenario: bool) -> ProviderChoice:
    """``connection`` with the config's provider, model and base URL where no flag gave one:
    the provider only for a PROMPT (a scenario stays scripted), the model and base URL only
    with the provider the config names."""
    config = current()
    provider = connection.provider
    if provider is None and not scenario:
        provider = config.get("provider")
    if provider is None or provider == "scripted":
        return dataclasses.replace(connection, provider=provider)
    named = config.get("provider")
    if named is not None and named != provider:
        return dataclasses.replace(connection, provider=provider)
    return dataclasses.replace(
        connection,
        provider=provider,
        model=connection.model or config.get("model"),
        base_url=connection.base_url or config.get("base_url"),
    )


def provenance_lines(ctx: click.Context) -> list[str]:
    """``run --show-config``: each key, its value and where it came from."""
    config = current()
    lines = [
        f"user config:    {user_config_path()}"
        + ("" if user_config_path().is_file() else " (none)"),
        f"project config: {project_config_path()}"
        + ("" if project_config_path().is_file() else " (none)"),
    ]
    for key in KEYS:
        source = ctx.get_parameter_source(key)
        value = ctx.params.get(key)
        if source is click.core.ParameterSource.COMMANDLINE:
            where = f"flag --{key.replace('_', '-')}"
        elif source is click.core.ParameterSource.ENVIRONMENT:
            where = "environment"
        elif key in config.values:
            value, path = config.values[key]
            where = f"config {path}"
        else:
            where = "default"
        if key == "provider":
            value = (
                f"{value} for a PROMPT, scripted for a SCENARIO.toml"
                if value
                else ("scripted for a SCENARIO.toml, else openai")
            )
        lines.append(f"{key} = {_shown(value)}  ({where})")
    return lines


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    return getattr(value, "value", None) or str(value)
