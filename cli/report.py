"""``exarch-actors report SESSION_DIR``: the session as one self-contained HTML file
(``runtime/observe/report_html.py``), with the invariants ``check`` verified.

Exit codes: 0 when the report was written, 2 when the path is not a session directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.runtime.drills.invariant_check import NotASession, check_session
from exarch_actors.runtime.observe.report_html import render_report
from exarch_actors.runtime.observe.spans import NotASessionDir, read_view
from exarch_actors.runtime.state.session_dir import SessionDir


def session_report(session: SessionDir, *, processes: bool = True) -> str:
    """The report page of ``session`` (what ``report`` writes); :class:`NotASessionDir`."""
    return render_report(read_view(session), _invariants(session, processes=processes))


def _invariants(session: SessionDir, *, processes: bool) -> dict[str, Any] | None:
    try:
        return check_session(session, processes=processes).to_json()
    except NotASession:
        return None


@click.command("report", context_settings=HELP_SETTINGS)
@click.argument("session_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the page (default: SESSION_DIR's name + .html, here).",
)
@click.option(
    "--no-processes", is_flag=True, help="Skip the leftover-process invariant (another machine)."
)
def report_command(session_dir: str, output: str | None, no_processes: bool) -> None:
    """Write SESSION_DIR as one self-contained HTML page (no network when it is viewed):
    the outcome, the invariants `check` verified, the spawn tree with each agent's terminal
    reason, tokens and cost (collapsible), a timeline, the most expensive agents and model
    requests and the slowest ral calls, every error and every rejected message. A search box
    filters all of it by agent name, reason or text; it stays readable for 1,000 agents.

    \b
    Prints (stderr): report: FILE (N agents, M errors)
    \b
    Exit codes:
      0    the report was written (whatever the invariants say: the page shows them)
      2    the path is not a session directory
    """
    session = SessionDir(Path(session_dir))
    try:
        view = read_view(session)
    except NotASessionDir as e:
        raise click.UsageError(str(e)) from None
    page = render_report(view, _invariants(session, processes=not no_processes))
    target = Path(output) if output else Path(f"{session.root.resolve().name}.html")
    target.write_text(page, encoding="utf-8")
    click.echo(f"report: {target} ({len(view.agents)} agents, {len(view.errors)} errors)", err=True)
