"""``exarch-actors fleet``: run a multi-agent scenario with a live view of the spawn tree.

The view is drawn with rich's ``Live`` (a refreshing tree, no full-screen takeover), because a
fleet run is a batch job whose scrollback a user wants to keep; textual's full-screen app is the
interactive frontend's tool. Each node is the same status line ``run`` draws
(``cli/run_report.py``) plus its settlement record. Off a terminal (CI, a pipe) the view is
skipped; what is printed around it is ``run``'s, plus the fleet-yield table.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from exarch_actors.actors.ray_nodes import NodeWatch
from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.cli.backend_options import Agents, Backend, agents_option, backend_options
from exarch_actors.cli.cost_options import CostChoice, cost_options
from exarch_actors.cli.durability import durability_option
from exarch_actors.cli.limits import limit_options
from exarch_actors.cli.mcp_options import mcp_options
from exarch_actors.cli.otlp import live_endpoint, otlp_endpoint_option
from exarch_actors.cli.provider_options import ProviderChoice, output_options, provider_options
from exarch_actors.cli.recording import record_option
from exarch_actors.cli.run_report import RunReporter, agent_line, live_agents
from exarch_actors.cli.runner import run_headless, session_path, spec_for
from exarch_actors.runtime.mcp.config import McpServer
from exarch_actors.runtime.providers.prices import FREE_DATE
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import Durability


def render_tree(report: RunReporter) -> Tree:
    """The spawn tree as rich renders it: each agent's status line and settlement record."""
    fleet = report.fleet
    agents = live_agents(fleet)
    settled = {
        nid: " ".join(
            str(x) for x in (rec.get("kind"), rec.get("status"), rec.get("retainedExecution")) if x
        )
        for nid, rec in fleet.journal.state.terminal_records().items()
    }
    children: dict[str | None, list[str]] = {}
    for name, agent in agents.items():
        children.setdefault(agent.parent, []).append(name)

    def label(name: str) -> Text:
        line = agent_line(report, agents[name])
        settle = settled.get(name)
        if settle:
            line.append(f" · {settle}", style="dim")
        return line

    root = Tree(f"fleet · {session_path(fleet.session)}")

    def add(node: Tree, parent: str | None) -> None:
        for name in sorted(children.get(parent, [])):
            add(node.add(label(name)), name)

    add(root, None)
    if fleet.nodes is not None:  # --backend ray: the cluster's nodes, joining and leaving
        root.add(nodes_line(fleet.nodes))
    governor = getattr(fleet.config, "traffic", None)
    if governor is not None:
        root.add(traffic_line(governor.figures()))
    return root


def nodes_line(watch: NodeWatch) -> Text:
    """The cluster under the tree: how many nodes are alive, and the latest joins and leaves."""
    line = Text(f"nodes · {len(watch.roster)} alive", style="bold")
    for change in list(watch.recent)[-3:]:
        style = "green" if change.change == "joined" else "red"
        line.append(f" · {change.change} {change.node[:8]} ({change.address})", style=style)
    return line


def traffic_line(figures: dict[str, Any]) -> Text:
    """The governor under the tree: each lane's limits and where they came from, what is in
    flight and queued, and the 429s seen."""
    line = Text("traffic", style="bold")
    for lane, d in (figures.get("lanes") or {}).items():
        limits = ", ".join(
            f"{v['per_minute']:g} {k}/min {v['source']}" for k, v in (d.get("limits") or {}).items()
        )
        line.append(
            f" · {lane.rsplit(' ', 1)[-1]}: {limits or 'no limit known'} · "
            f"{d.get('inflight', 0)} in flight · {d.get('queued', 0)} queued"
        )
    line.append(
        f" · {figures.get('waits', 0)} waited · {figures.get('throttled', 0)}×429",
        style="dim",
    )
    return line


YIELD_ROWS = (
    ("spawned", "spawned"),
    ("done", "done"),
    ("down", "down"),
    ("cancelled", "cancelled"),
    ("neverSettled", "never settled"),
    ("releaseUnconfirmed", "release unconfirmed"),
)
"""The yield table's rows: its JSON key, then the label a reader sees."""


def yield_table(fy: dict[str, Any]) -> Table:
    """Settlement counts, then the fleet's cost: ``$?`` when any agent's is unknown (with the
    known part beside it), never ``$0`` for what was not counted; a scripted run's known ``$0``
    says it is free. One row per figure (label, value): it fits 80 columns whole, where a
    column per figure cut its headers (``neverSettl…``)."""
    table = Table(title="fleet yield", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right", overflow="fold")
    for key, label in YIELD_ROWS:
        table.add_row(label, str(fy.get(key, 0)))
    cost = fy.get("cost")
    if isinstance(cost, dict):
        table.add_row("cost", cost_text(cost))
    return table


def cost_text(cost: dict[str, Any]) -> str:
    """The fleet yield's cost as the table shows it."""
    if cost.get("pricesDate") == FREE_DATE:
        return "$0 (scripted: no charge)"
    usd = cost.get("usd")
    known = f"${usd}" if usd is not None else f"$? (known ${cost.get('knownUsd')})"
    return f"{known} · prices of {cost.get('pricesDate')}"


@click.command("fleet", context_settings=HELP_SETTINGS)
@click.argument("target", metavar="SCENARIO.toml|PROMPT")
@provider_options("Model provider (default: scripted for a SCENARIO.toml, else openai).")
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the run.")
@click.option("--no-live", is_flag=True, help="Skip the live view even on a terminal.")
@agents_option()
@backend_options
@record_option
@mcp_options
@output_options
@limit_options
@durability_option()
@cost_options
@otlp_endpoint_option()
def fleet_command(
    target: str,
    connection: ProviderChoice,
    session_dir: str | None,
    no_live: bool,
    agents: Agents,
    backend: Backend,
    ray_address: str | None,
    placement: str | None,
    record: str | None,
    mcp: tuple[McpServer, ...],
    grant_mcp: tuple[str, ...],
    as_json: bool,
    quiet: bool,
    limits: ShellLimits,
    durability: Durability,
    cost: CostChoice,
    otlp_endpoint: str | None,
) -> None:
    """Run a multi-agent SCENARIO.toml (or a PROMPT for a real model) with a live spawn-tree
    view, then print the fleet yield (spawned, done, down, cancelled, never settled).

    Prints what `run` prints (session first, the trunk's errors, outcome, reply); the tree
    replaces run's agent lines, and the fleet-yield table comes before the outcome.

    \b
    Exit codes:
      0    the trunk replied or quiesced
      1    the run failed (the `error:` line says why), was capped, or reached --budget
           (outcome `budget`: the tree is cancelled, every child settled), or a session
           file could not be written for lack of space (one `disk full:` line names it and
           the space left; `resume` finishes the run once space is back)
      2    bad input: an unreadable scenario, a bad flag, no API key for the hosted service,
           --backend ray without Ray installed (the message gives the install line)
      130  cancelled by Ctrl-C (SIGINT): the whole tree is cancelled and settled, no process
           is left behind
      143  cancelled by SIGTERM, likewise (a second signal while the tree settles ends
           the command at once)
    """
    spec = spec_for(
        target,
        connection,
        session_dir=session_dir,
        limits=limits,
        record=record,
        mcp=mcp,
        grant_mcp=grant_mcp,
        durability=durability,
        prices=cost.prices,
        budget=cost.budget,
        agents=agents,
        backend=backend,
        ray_address=ray_address,
        placement=placement,
        otlp_endpoint=live_endpoint(otlp_endpoint),
    )
    report = RunReporter(
        as_json=as_json, quiet=quiet, live=not no_live, view=render_tree, keep_view=True
    )
    result = run_headless(spec, observer=report)
    fy = result.fleet_yield.to_json()
    if not report.silent:
        Console(stderr=True).print(yield_table(fy))
    report.finish(result.outcome, result.reply, result.session, fy)
    sys.exit(result.exit_code)
