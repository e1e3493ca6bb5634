"""``exarch-actors run``: a headless trunk that ends at quiescence and prints its reply."""

from __future__ import annotations

import sys
from functools import partial
from typing import Literal

import click

from exarch_actors.cli import HELP_SETTINGS, config, exit_guard
from exarch_actors.cli.backend_options import Backend, agents_option, backend_options
from exarch_actors.cli.cost_options import CostChoice, cost_options
from exarch_actors.cli.durability import durability_option
from exarch_actors.cli.grants import grant_options
from exarch_actors.cli.limits import limit_options
from exarch_actors.cli.mcp_options import mcp_options
from exarch_actors.cli.otlp import live_endpoint, otlp_endpoint_option
from exarch_actors.cli.provider_options import ProviderChoice, output_options, provider_options
from exarch_actors.cli.recording import record_option
from exarch_actors.cli.run_report import RunReporter
from exarch_actors.cli.runner import run_headless, spec_for
from exarch_actors.runtime.mcp.config import McpServer
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import Durability


@click.command("run", context_settings=HELP_SETTINGS)
@click.argument("target", metavar="SCENARIO.toml|PROMPT", required=False)
@click.option(
    "--show-config",
    is_flag=True,
    help="Print each default a config file can set (provider, model, base_url, durability, "
    "agents, shell limits), its value and where it came from (flag, config file, default), "
    "and exit.",
)
@provider_options(
    "Model provider (default: scripted for a SCENARIO.toml, else openai; with a network "
    "provider a SCENARIO.toml's [fleet] prompt goes to the real model)."
)
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the run.")
@click.option("--chat", is_flag=True, help="No system prompt and no tool: a bare conversation.")
@click.option("--disk-warn-bytes", type=click.IntRange(min=1), help="Warn past this many bytes.")
@click.option("--window-tokens", type=click.IntRange(min=1), help="The model's context window.")
@agents_option()
@backend_options
@record_option
@grant_options
@mcp_options
@output_options
@limit_options
@durability_option()
@cost_options
@otlp_endpoint_option()
def run_command(
    target: str | None,
    show_config: bool,
    connection: ProviderChoice,
    session_dir: str | None,
    chat: bool,
    disk_warn_bytes: int | None,
    window_tokens: int | None,
    agents: Literal["thread", "process"],
    backend: Backend,
    ray_address: str | None,
    placement: str | None,
    grant_exec: tuple[str, ...],
    grant_root: tuple[str, ...],
    mcp: tuple[McpServer, ...],
    grant_mcp: tuple[str, ...],
    record: str | None,
    as_json: bool,
    quiet: bool,
    limits: ShellLimits,
    durability: Durability,
    cost: CostChoice,
    otlp_endpoint: str | None,
) -> None:
    """Run a headless trunk on a SCENARIO.toml (the scripted provider: no network, no key) or
    on a PROMPT (a real model), and print its reply. A bare word that names no file but names
    one of the packaged examples (fanout, chain, chat, crashing, fanin, fanin-small, memory,
    regression) plays that example: `exarch-actors run fanout` works from an installed wheel.

    Defaults come from ~/.config/exarch-actors/config.toml and .exarch/config.toml (the
    project's over the user's; a flag over both): provider, model, base_url, durability,
    agents, shell_memory, max_workers, max_binding_bytes; and [mcp.NAME] tables, the MCP
    servers every run gets (docs/mcp.md). --show-config prints each value and where it came
    from.

    An argument with a '/' or a .toml ending and no spaces is a path: if it names no file,
    that is an error naming the file (exit 2), never a prompt sent to a model.

    \b
    Prints, in order:
      stderr  session: .exarch/sessions/<id>      (first: where the run is written)
      stderr  a live line per agent (on a terminal): turn, ral calls, tokens, last call
      stderr  the trunk's ral errors and notes, as they happen
      stderr  outcome: replied|quiesced|failed|capped|cancelled
      stderr  children: 3 failed, 37 replied    (children by terminal reason, if any)
      stderr  rate limit: N of M requests waited (the traffic governor, if any waited)
      stderr  error: WHY (the trunk's last provider error when it did not reply)
      stdout  the reply (a trunk that never called `reply`: its last text, with a note;
              after Ctrl-C nothing but a reply: the last text goes to stderr)

    --quiet keeps only the reply (or the last text and its note), the scenario's warnings and
    the error line; --json prints one JSON object on stdout instead (outcome, reply, lastText,
    error, session, fleetYield) and keeps stderr as --quiet does. A run a full disk stopped
    prints it too: outcome "failed", the disk-full message as error, diskFull {path,
    freeBytes}, fleetYield null.

    \b
    Exit codes:
      0    the trunk replied, or quiesced (a ral error it could not get past ends it here too)
      1    the run failed (a provider error: the `error:` line says which), was capped,
           reached --budget (outcome `budget`: the tree is cancelled, every child settled),
           or quiesced without a reply while a child failed (`children:` counts them)
           or a session file could not be written for lack of space (one `disk full:`
           line names it and the space left; `resume` finishes the run once space is back)
      2    bad input: an unreadable scenario, a bad flag, no API key for the hosted service,
           --backend ray without Ray installed (the message gives the install line)
      130  cancelled by Ctrl-C (SIGINT): the whole tree is cancelled and settled, no process
           is left behind
      143  cancelled by SIGTERM, likewise (a second signal while the tree settles ends
           the command at once)
    """
    if show_config:
        for line in config.provenance_lines(click.get_current_context()):
            click.echo(line)
        return
    if target is None:
        raise click.UsageError("Missing argument 'SCENARIO.toml|PROMPT'.")
    spec = spec_for(
        target,
        connection,
        chat=chat,
        session_dir=session_dir,
        disk_warn_bytes=disk_warn_bytes,
        window_tokens=window_tokens,
        grant_exec=grant_exec,
        grant_root=grant_root,
        mcp=mcp,
        grant_mcp=grant_mcp,
        limits=limits,
        record=record,
        durability=durability,
        prices=cost.prices,
        budget=cost.budget,
        agents=agents,
        backend=backend,
        ray_address=ray_address,
        placement=placement,
        otlp_endpoint=live_endpoint(otlp_endpoint),
    )
    report = RunReporter(as_json=as_json, quiet=quiet)
    if as_json:  # a full disk stops the process at once: its object is printed there
        exit_guard.stop_report(partial(report.stopped_json, session=spec.session_dir))
    try:
        result = run_headless(spec, observer=report)
    finally:
        exit_guard.stop_report(None)
    report.finish(result.outcome, result.reply, result.session, result.fleet_yield.to_json())
    sys.exit(result.exit_code)
