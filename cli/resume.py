"""``exarch-actors resume SESSION_DIR``: rebuild a run whose control process died and finish it.

Exit codes as ``run``: 0 replied or quiesced, 1 failed or capped, 2 when the directory cannot be
resumed (not a session, no run.json, already finished), 130 when cancelled.
"""

from __future__ import annotations

import json
import sys

import click

from actors.resume import ResumeRefused, resume_run
from cli.runner import EXIT_CODES, session_path, sigint_cancels


class Refused(click.ClickException):
    """A typed refusal, printed as ``Error: ...`` (no usage text: the command line was fine)."""

    exit_code = 2


@click.command("resume")
@click.argument("session_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def resume_command(session_dir: str, as_json: bool) -> None:
    """Resume a run from its session directory after the control process died."""
    hit = {"cancel": False}
    with sigint_cancels(lambda: hit.__setitem__("cancel", True)) as interrupted:
        try:
            result = resume_run(session_dir, poll=interrupted.is_set)
        except ResumeRefused as e:
            raise Refused(str(e)) from None
    outcome = "cancelled" if interrupted.is_set() else result.outcome
    if as_json:
        click.echo(
            json.dumps(
                {
                    "outcome": outcome,
                    "reply": result.reply,
                    "session": str(result.session.root),
                    "plan": result.plan.to_json(),
                    "fleetYield": result.fleet_yield.to_json(),
                }
            )
        )
    else:
        click.echo(f"session: {session_path(result.session)}", err=True)
        plan = result.plan
        healed = len(plan.finished) + len(plan.orphaned) + len(plan.no_environment)
        healed += len(plan.retained)
        click.echo(
            f"resumed: trunk {'rebuilt' if plan.rebuild_trunk else 'had ended'}, "
            f"{len(plan.rebuild)} children rebuilt, "
            f"{healed} slots healed, {len(plan.redeliver)} results re-delivered",
            err=True,
        )
        click.echo(f"outcome: {outcome}", err=True)
        if result.reply is not None:
            click.echo(result.reply)
    sys.exit(EXIT_CODES.get(outcome, 1))
