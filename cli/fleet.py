"""``exarch-actors fleet``: run a multi-agent scenario with a live view of the spawn tree.

The view is drawn with rich's ``Live`` (a refreshing tree, no full-screen takeover), because a
fleet run is a batch job whose scrollback a user wants to keep; textual's full-screen app is the
interactive frontend's tool. Off a terminal (CI, a pipe) the view is skipped and only the final
yield is printed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.tree import Tree

from cli.limits import limit_options
from cli.runner import RunSpec, read_scenario, run_headless, session_path
from runtime.limits import ShellLimits

_STATE_STYLE = {
    "working": "bold yellow",
    "idle": "cyan",
    "replied": "green",
    "quiesced": "green",
    "cancelled": "magenta",
    "failed": "red",
    "capped": "red",
    "starting": "dim",
}


def render_tree(fleet: Any) -> Tree:
    """The spawn tree as rich renders it: state, turns, tokens and settlement per agent."""
    agents = dict(fleet.agents)
    settled = {
        nid: " ".join(
            str(x) for x in (rec.get("kind"), rec.get("status"), rec.get("retainedExecution")) if x
        )
        for nid, rec in fleet.journal.state.terminal_records().items()
    }
    children: dict[str | None, list[str]] = {}
    for name, agent in agents.items():
        children.setdefault(agent.parent, []).append(name)

    def label(name: str) -> str:
        a = agents[name]
        s = a.stats
        style = _STATE_STYLE.get(s.state, "")
        tokens = f"{s.input_tokens + s.output_tokens} tok" if s.tokens_known else "tok ?"
        settle = settled.get(name)
        tail = f" · {settle}" if settle else ""
        return (
            f"[bold]{name}[/] [{style}]{s.state}[/] · turns {s.turns} · calls {s.ral_calls}"
            f" · {tokens}{tail}"
        )

    root = Tree(f"fleet · {session_path(fleet.session)}")

    def add(node: Tree, parent: str | None) -> None:
        for name in sorted(children.get(parent, [])):
            add(node.add(label(name)), name)

    add(root, None)
    return root


def yield_table(fy: dict[str, Any]) -> Table:
    table = Table(title="fleet yield", show_header=True)
    for key in ("spawned", "done", "down", "cancelled", "neverSettled", "releaseUnconfirmed"):
        table.add_column(key, justify="right")
    table.add_row(
        *(
            str(fy.get(k, 0))
            for k in ("spawned", "done", "down", "cancelled", "neverSettled", "releaseUnconfirmed")
        )
    )
    return table


@click.command("fleet")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, no live view.")
@click.option("--no-live", is_flag=True, help="Skip the live view even on a terminal.")
@limit_options
def fleet_command(
    scenario: str, session_dir: str | None, as_json: bool, no_live: bool, limits: ShellLimits
) -> None:
    """Run a multi-agent SCENARIO with a live spawn-tree view, then print the fleet yield."""
    spec = RunSpec(
        provider="scripted",
        prompt=None,
        scenario=read_scenario(scenario),
        session_dir=session_dir,
        limits=limits,
    )
    console = Console(stderr=True)
    live_ok = console.is_terminal and not as_json and not no_live
    live: Live | None = None

    def on_start(fleet: Any) -> None:
        nonlocal live
        if live_ok:
            live = Live(
                get_renderable=lambda: render_tree(fleet),
                console=console,
                refresh_per_second=8,
                transient=False,
            )
            live.start()

    try:
        result = run_headless(spec, on_start=on_start)
    finally:
        if live is not None:
            live.stop()
    fy = result.fleet_yield.to_json()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "outcome": result.outcome,
                    "reply": result.reply,
                    "session": str(result.session.root),
                    "fleetYield": fy,
                }
            )
        )
    else:
        console.print(yield_table(fy))
        click.echo(f"session: {session_path(result.session)}", err=True)
        click.echo(f"outcome: {result.outcome}", err=True)
        if result.reply is not None:
            click.echo(result.reply)
    sys.exit(result.exit_code)
