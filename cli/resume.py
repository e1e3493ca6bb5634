"""``exarch-actors resume SESSION_DIR``: rebuild a run whose control process died and finish it.

The provider is the one ``run.json`` names; ``--model``, ``--base-url``, ``--api-key``,
``--timeout`` and ``--retries`` override it (the key is never written to ``run.json``: it comes
from the flag or the provider's usual variable). Output and exit codes as ``run`` (130 / 143
when cancelled by SIGINT / SIGTERM).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import click

from exarch_actors.actors.resume import resume_run
from exarch_actors.cli import HELP_SETTINGS, Refused, exit_guard
from exarch_actors.cli.backend_options import (
    Agents,
    Backend,
    agents_option,
    backend_options,
    check_backend,
    make_backend,
)
from exarch_actors.cli.durability import durability_option
from exarch_actors.cli.otlp import live_endpoint, otlp_endpoint_option
from exarch_actors.cli.provider_options import ProviderChoice, output_options, provider_options
from exarch_actors.cli.run_report import RunReporter
from exarch_actors.cli.runner import exit_code, signals_cancel
from exarch_actors.runtime.state import disk_full
from exarch_actors.runtime.state.disk_full import DiskFull
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import read_json_document
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_lock import SessionLive
from exarch_actors.runtime.state.session_read import ResumeRefused


@click.command("resume", context_settings=HELP_SETTINGS)
@click.argument("session_dir", type=click.Path(exists=True, file_okay=False))
@provider_options(None)
@output_options
@durability_option(inherit=True)
@agents_option(inherit=True)
@backend_options
@otlp_endpoint_option()
def resume_command(
    session_dir: str,
    connection: ProviderChoice,
    as_json: bool,
    quiet: bool,
    durability: Durability | None,
    agents: Agents | None,
    backend: Backend,
    ray_address: str | None,
    placement: str | None,
    otlp_endpoint: str | None,
) -> None:
    """Resume a run from its SESSION_DIR after the control process died, and finish it.

    The provider and model are those of the run (its run.json); the options override the model,
    endpoint and key of a network run. Agents are rebuilt where the run ran them (threads, or
    processes of their own with --agents process), unless --agents says otherwise; with
    --backend ray each rebuilt agent's process is started on a Ray node, from the session
    directory's files (which hold every agent's records on the driver's machine,
    docs/scale-out.md). Prints what `run` prints, plus one `resumed:` line (what was rebuilt
    and healed). A run killed during start-up (run.json written, nothing else) is started from
    its beginning. Every record's checksum is checked: a changed byte is a damaged file.

    \b
    Exit codes:
      0    the trunk replied or quiesced
      1    the run failed (the `error:` line says why) or was capped
           or a session file could not be written for lack of space (one `disk full:`
           line names it and the space left; `resume` finishes the run once space is back)
      2    the directory cannot be resumed (a run still alive owns it: its pid is named;
           not a session, no run.json, already finished, a damaged session file named by
           file and line), a bad flag, no API key for the
           hosted service, or --backend ray without Ray installed
      130  cancelled by Ctrl-C (SIGINT): the whole tree is cancelled and settled, no process
           is left behind
      143  cancelled by SIGTERM, likewise (a second signal while the tree settles ends
           the command at once)
    """
    session = SessionDir(Path(session_dir).resolve())
    overrides = _connection_overrides(session, connection)
    check_backend(backend, ray_address, placement)
    try:
        lock = session.claim()  # a run still alive there is never touched
    except SessionLive as e:
        raise Refused(str(e)) from None
    click.get_current_context().call_on_close(lock.release)  # held until the command ends
    report = RunReporter(as_json=as_json, quiet=quiet)
    if as_json:  # a full disk stops the process at once: its object is printed there
        exit_guard.stop_report(partial(report.stopped_json, session=session.root))
    try:  # a disk still full refuses before anything is touched, as a run it stops says
        disk_full.probe(session.root)
    except DiskFull as e:
        disk_full.trip(e)  # a command ends here (cli/exit_guard.py): the message, exit 1
        raise
    hit = {"cancel": False}
    with signals_cancel(lambda: hit.__setitem__("cancel", True)) as interrupted:

        def poll() -> bool:
            report.tick()
            return interrupted.is_set()

        hosts = make_backend(backend, ray_address, placement)
        try:
            result = resume_run(
                session,
                on_start=report.attach,
                poll=poll,
                connection=overrides,
                durability=durability,
                agents=agents,
                backend=hosts,
                secret_env=connection.secret_env,
                otlp_endpoint=live_endpoint(otlp_endpoint),
            )
        except ResumeRefused as e:
            raise Refused(str(e)) from None
        finally:
            report.detach()
            if hosts is not None:
                hosts.close()
    outcome = "cancelled" if interrupted.is_set() else result.outcome
    plan = result.plan
    if not report.silent:
        healed = len(plan.finished) + len(plan.orphaned) + len(plan.no_environment)
        healed += len(plan.retained)
        trunk = "rebuilt" if plan.rebuild_trunk else "had ended"
        if plan.trunk_unborn:
            trunk = "started (the run was killed during start-up)"
        click.echo(
            f"resumed: trunk {trunk}, "
            f"{len(plan.rebuild)} children rebuilt, "
            f"{healed} slots healed, {len(plan.redeliver)} results re-delivered",
            err=True,
        )
    report.finish(
        outcome, result.reply, result.session, result.fleet_yield.to_json(), plan=plan.to_json()
    )
    sys.exit(exit_code(outcome, interrupted.signum))


def _connection_overrides(session: SessionDir, connection: ProviderChoice) -> dict[str, Any]:
    """The flags given, as :func:`actors.resume.resume_run`'s ``connection``; provider flags on
    a scripted run are refused rather than ignored."""
    try:
        run = read_json_document(session.run_spec)[0]
        provider = str(run["provider"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # resume_run refuses the directory with the precise reason
    given = {
        "model": connection.model,
        "base_url": connection.base_url,
        "api_key": connection.api_key,
    }
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if provider == "scripted" and overrides:
        raise click.UsageError(
            "this run used the scripted provider: --model, --base-url and --api-key apply to "
            "network runs"
        )
    overrides.update(connection.network_options(provider))
    return overrides
