"""``exarch-actors check SESSION_DIR``: the invariant checker over a session directory.

Exit codes: 0 when every invariant held (or was skipped), 1 when one is violated, 2 when the path
is not a session directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.cli.backend_options import check_backend
from exarch_actors.cli.durability import describe_durability
from exarch_actors.runtime.drills.invariant_check import InvariantReport, NotASession, check_session
from exarch_actors.runtime.state.session_dir import SessionDir

_STYLE = {"held": "green", "violated": "bold red", "skipped": "dim"}


def report_table(report: InvariantReport, title: str | None = None) -> Table:
    """The invariants as a rich table (shared with ``drill``)."""
    table = Table(title=title or f"invariants of {report.session}", expand=False)
    table.add_column("invariant")
    table.add_column("status")
    table.add_column("checked", justify="right")
    table.add_column("details")
    for r in report.results:
        lines = list(r.details) + [f"[dim]{n}[/dim]" for n in r.notes]
        table.add_row(
            r.name,
            f"[{_STYLE[r.status]}]{r.status}[/]",
            str(r.checked),
            "\n".join(lines[:8]) + ("\n..." if len(lines) > 8 else ""),
        )
    return table


@click.command("check", context_settings=HELP_SETTINGS)
@click.argument("session_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--no-processes", is_flag=True, help="Skip the leftover-process invariant (another machine)."
)
@click.option(
    "--ray-address",
    metavar="HOST:PORT|auto",
    help="A run of --backend ray: look for its leftover processes on every node of this Ray "
    "cluster (each node looks on its own) instead of this machine, and for the nodes' copies "
    "of its session directory, which are removed once none of its processes runs.",
)
def check_command(
    session_dir: str, as_json: bool, no_processes: bool, ray_address: str | None
) -> None:
    """Check the invariants of a SESSION_DIR (what `run`, `fleet`, `chat`, `resume` or a drill
    round left): every child settled once, no process left behind, append-only files intact
    (every record's checksum matches: a changed byte is named by file and line; a session
    written before checksums is noted as such). It names the run's durability (run.json) and
    what it promised an acknowledged record.

    \b
    Exit codes:
      0    every invariant held (or was skipped)
      1    an invariant is violated (the table says which, and where)
      2    the path is not a session directory
    """
    table = None
    if ray_address is not None and not no_processes:
        check_backend("ray")
        from exarch_actors.actors.ray_backend import RayBackend

        table = RayBackend(ray_address)
    try:
        report = check_session(
            SessionDir(Path(session_dir)), processes=not no_processes, table=table
        )
    except NotASession as e:
        raise click.UsageError(str(e)) from None
    except ConnectionError as e:  # Ray's own: no cluster at that address
        raise click.UsageError(f"--ray-address {ray_address}: {e}") from None
    finally:
        if table is not None:
            table.close()
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        console = Console()
        console.print(report_table(report))
        console.print(f"[dim]{describe_durability(report.durability)}[/dim]")
        verdict = (
            "[green]all invariants held[/]"
            if report.ok
            else (f"[bold red]{len(report.violated)} invariant(s) violated[/]")
        )
        console.print(verdict)
    sys.exit(0 if report.ok else 1)
