"""``exarch-actors replay SESSION_DIR``: re-run a recorded session offline and compare, call by
call, what each agent's ral calls returned now with what they returned then.

The scenario is the session's ``recording.toml`` (written by ``--record``), played by the
scripted provider into a new session directory (never the recorded one) with the recorded run's
working directory, grants, ``--chat`` and ``--agents`` (its ``run.json``). The comparison and
the volatile-part rules are ``runtime/replay/divergence.py`` and ``runtime/replay/volatile.py``;
this command runs, prints and exits.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.cli.runner import RunOutcome, RunSpec, read_scenario, run_headless, session_path
from exarch_actors.runtime.ral.grants import GrantPolicy
from exarch_actors.runtime.replay.divergence import Divergence, Report, compare, read_facts
from exarch_actors.runtime.replay.volatile import RULES, Normaliser, UnknownRule, rule_names
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import Durability, parse_durability
from exarch_actors.runtime.state.durable import atomic_write_bytes, read_json_document
from exarch_actors.runtime.state.record_mirror import node_copy_name
from exarch_actors.runtime.state.session_dir import SessionDir

DEFAULT_DEADLINE = 600.0
"""Seconds a replay may run before it is cancelled and counts as diverged."""

SHOWN_LINES = 12
"""Lines of each side of a divergence printed (replay-report.json keeps all of it)."""
_INDENT = 11


class _Deadline:
    """The run observer of a replay: says where it writes, cancels it past the deadline."""

    def __init__(self, seconds: float, quiet: bool) -> None:
        self.seconds = seconds
        self.quiet = quiet
        self.hit = False
        self._fleet: Any = None
        self._end = 0.0

    def attach(self, fleet: Any) -> None:
        self._fleet = fleet
        self._end = time.monotonic() + self.seconds
        if not self.quiet:
            click.echo(f"session: {session_path(fleet.session)}", err=True)

    def tick(self) -> None:
        if not self.hit and time.monotonic() > self._end:
            self.hit = True
            self._fleet.cancel_all("replay deadline")

    def detach(self) -> None:
        pass


@click.command("replay", context_settings=HELP_SETTINGS)
@click.argument("session_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--session-dir",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Where to write the replay's own session (default: a new .exarch/sessions/<id>).",
)
@click.option(
    "--ignore",
    multiple=True,
    type=click.Choice([*RULES, "all"]),
    help="Blank a volatile part before comparing (repeatable): time (dates, clock times), "
    "pid (a number after 'pid'), tmp (the random directory under /tmp or $TMPDIR), all.",
)
@click.option(
    "--ignore-regex",
    multiple=True,
    metavar="RE",
    help="Blank every match of the Python regex RE before comparing (repeatable).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_DEADLINE,
    show_default=True,
    help="Seconds the replay may run; past them it is cancelled and counts as diverged.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def replay_command(
    session_dir: str,
    out_dir: str | None,
    ignore: tuple[str, ...],
    ignore_regex: tuple[str, ...],
    deadline: float,
    as_json: bool,
) -> None:
    """Replay SESSION_DIR's recording (its recording.toml, written by --record) offline with the
    scripted provider, in a new session directory, and compare what each agent's ral calls
    returned now with what they returned then: value, stdout, stderr and error, as the model
    saw them; then which children each agent spawned, and how it ended.

    \b
    Prints, in order:
      stderr  session: .exarch/sessions/<id>   (the replay's; SESSION_DIR is never written)
      stdout  for each agent that diverged, its first divergence: the call, then and now
      stdout  diverged: N of M agents ...  |  no divergence: N ral calls of M agents ...
      stderr  report: <session>/replay-report.json

    The two session directories always read as <session> when compared; --ignore and
    --ignore-regex blank more (docs/scenarios.md, "Recording and replay").

    \b
    Exit codes:
      0    nothing diverged
      1    something diverged, or the replay ran past --deadline
      2    bad input: no recording.toml in SESSION_DIR (run with --record), a recording
           made in the chat UI, an unreadable recording, a bad flag
      130  cancelled: Ctrl-C cancels the replay and leaves no process behind
      143  cancelled by SIGTERM, likewise
    """
    outcome, report = replay_session(
        session_dir, out_dir, ignore, ignore_regex, deadline, quiet=as_json
    )
    if report is None:
        sys.exit(outcome.exit_code)  # Ctrl-C: the run's own exit code
    new = outcome.session
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        _print(report)
        click.echo(f"report: {session_path(new)}/{new.replay_report.name}", err=True)
    sys.exit(1 if report.diverged else 0)


def replay_session(
    session_dir: str,
    out_dir: str | None = None,
    ignore: tuple[str, ...] = (),
    ignore_regex: tuple[str, ...] = (),
    deadline: float = DEFAULT_DEADLINE,
    *,
    quiet: bool = False,
) -> tuple[RunOutcome, Report | None]:
    """Replay ``session_dir``'s recording into a new session and compare; the report is also
    written to the new session's ``replay-report.json``. ``None`` for the report when the
    replay was cancelled (Ctrl-C) before its deadline: nothing was compared. What ``replay``
    and :func:`exarch_actors.replay` share; refusals are ``click.UsageError``."""
    old = SessionDir(Path(session_dir).resolve())
    try:
        normalise = Normaliser(rule_names(ignore), tuple(ignore_regex))
    except UnknownRule as e:
        raise click.UsageError(str(e)) from None
    spec = _replay_spec(old, out_dir)
    observer = _Deadline(deadline, quiet=quiet)
    outcome = run_headless(spec, observer=observer)
    if outcome.outcome == "cancelled" and not observer.hit:
        return outcome, None
    new = outcome.session
    normalise = dataclasses.replace(
        normalise, roots=_roots(old.root, new.root), copies=(node_copy_name(old.root),)
    )
    report = compare(read_facts(old), read_facts(new), normalise, ignore=normalise.describe())
    if observer.hit:
        late = Divergence(
            "*", "deadline", f"the replay did not finish within {deadline:g} s: cancelled"
        )
        report = dataclasses.replace(report, divergences=(*report.divergences, late))
    atomic_write_bytes(new.replay_report, json.dumps(report.to_json(), indent=2).encode())
    return outcome, report


def _replay_spec(old: SessionDir, out_dir: str | None) -> RunSpec:
    """What to run: the recording, as the recorded run ran (its run.json), into a new session."""
    if not old.recording.is_file():
        raise click.UsageError(
            f"{old.root} has no {old.recording.name}: record a run with --record FILE.toml"
        )
    scenario = read_scenario(str(old.recording))
    if scenario.recording is not None and scenario.recording.get("interactive"):
        raise click.UsageError(
            f"{old.recording} was recorded in the chat UI: its replies answer typed messages; "
            f"play it with `exarch-actors chat {old.recording}`"
        )
    if out_dir is not None and Path(out_dir).resolve() == old.root:
        raise click.UsageError("--session-dir: a replay never writes into the session it replays")
    try:
        run = read_json_document(old.run_spec)[0]
    except (OSError, ValueError):
        run = {}
    recorded = scenario.recording or {}
    return RunSpec(
        provider="scripted",
        prompt=None,
        scenario=scenario,
        session_dir=out_dir,
        chat=bool(run.get("chat", recorded.get("chat", False))),
        disk_warn_bytes=run.get("diskWarnBytes"),
        cwd=run.get("cwd") if isinstance(run.get("cwd"), str) else None,
        grants=GrantPolicy.from_dict(run["grants"]) if run.get("grants") else None,
        limits=ShellLimits.from_json(run.get("shellLimits")),  # the recorded run's limits
        durability=_durability(run.get("durability")),  # and its durability
        agents="process" if run.get("agents") == "process" else "thread",  # and where agents ran
        mcp=scenario.mcp,  # served from the recorded replies only: no server is started
    )


def _durability(value: object) -> Durability:
    try:
        return parse_durability(value if isinstance(value, str) else None)
    except ValueError:  # an unknown policy in a damaged run.json: the default, as when absent
        return parse_durability(None)


def _roots(*roots: Path) -> tuple[str, ...]:
    out: list[str] = []
    for r in roots:
        out += [str(r), str(r.resolve())]
    return tuple(out)


def _print(report: Report) -> None:
    for d in report.divergences:
        where = f"{d.agent}: " if d.agent != "*" else ""
        click.echo(f"{where}{d.summary}" + (f" ({d.call_id})" if d.call_id else ""))
        if d.script is not None:
            click.echo(_side("script", d.script))
        if d.then is not None or d.now is not None:
            click.echo(_side("then", d.then))
            click.echo(_side("now", d.now))
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    calls, agents = _count(report.calls, "ral call"), _count(report.agents, "agent")
    if report.diverged:
        diverged = len({d.agent for d in report.divergences})
        click.echo(f"diverged: {diverged} of {agents} ({calls} compared)")
    else:
        click.echo(f"no divergence: {calls} of {agents} returned what they returned then")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _side(label: str, text: str | None) -> str:
    lines = (text if text is not None else "(nothing)").splitlines() or [""]
    if len(lines) > SHOWN_LINES:
        lines = [*lines[:SHOWN_LINES], f"... {len(lines) - SHOWN_LINES} more lines"]
    head = f"  {label}:".ljust(_INDENT)
    return head + ("\n" + " " * _INDENT).join(lines)
