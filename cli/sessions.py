"""``exarch-actors sessions``: list the runs under ``.exarch/sessions`` and prune old ones.

A session a live process owns (its ``owner.lock`` held: ``runtime/state/session_lock.py``) is
listed as live and never removed: the prune takes each session's owner lock before it deletes
it, so a run that starts (or a ``resume`` that takes it) meanwhile keeps it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.runtime.state.durable import read_json_document
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_lock import SessionLive

_STAMP = re.compile(r"^(\d{8}T\d{6}Z)-")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Duration(click.ParamType):
    """``30m``, ``12h``, ``7d``, ``2w``: a positive number of seconds, minutes, hours, days or
    weeks."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, _dt.timedelta):
            return value
        m = re.fullmatch(r"(\d+)([smhdw])", str(value).strip())
        if m is None or int(m.group(1)) == 0:
            self.fail(f"{value!r} is not a duration like 30m, 12h, 7d or 2w", param, ctx)
        return _dt.timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class SessionEntry:
    """One session directory as the listing shows it."""

    path: Path
    when: _dt.datetime
    outcome: str
    """``result.json``'s outcome; without one ``running`` (a live owner) or ``unfinished``
    (``resume`` carries it on)."""
    size: int
    live_pid: int | None
    live: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.path.name,
            "path": str(self.path),
            "when": self.when.isoformat(timespec="seconds"),
            "outcome": self.outcome,
            "bytes": self.size,
            "live": self.live,
            "pid": self.live_pid,
        }


def read_entry(root: Path) -> SessionEntry:
    session = SessionDir(root)
    owner = session.live_owner()
    try:
        outcome = str(read_json_document(session.result)[0].get("outcome", "unknown"))
    except FileNotFoundError:
        outcome = "running" if owner is not None else "unfinished"
    except (OSError, ValueError, AttributeError):
        outcome = "unreadable"
    return SessionEntry(
        root,
        _when(root),
        outcome,
        _size(root),
        owner.pid if owner is not None else None,
        owner is not None,
    )


def _when(root: Path) -> _dt.datetime:
    """When the run started: the UTC stamp of its name, else the directory's mtime."""
    m = _STAMP.match(root.name)
    if m is not None:
        return _dt.datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=_dt.UTC)
    return _dt.datetime.fromtimestamp(root.stat().st_mtime, _dt.UTC)


def _size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass  # removed meanwhile (a live run's temp file)
    return total


def list_sessions(base: Path) -> list[SessionEntry]:
    """Every session directory under ``base``, newest first."""
    if not base.is_dir():
        return []
    entries = [read_entry(p) for p in base.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(entries, key=lambda e: (e.when, e.path.name), reverse=True)


def prune_candidates(
    entries: list[SessionEntry],
    now: _dt.datetime,
    older_than: _dt.timedelta | None,
    keep: int | None,
) -> list[SessionEntry]:
    """What a prune removes from ``entries`` (newest first): those past every given rule --
    older than ``older_than``, and not among the ``keep`` newest -- and never a live one."""
    chosen = []
    for i, e in enumerate(entries):
        if e.live:
            continue
        if older_than is not None and now - e.when < older_than:
            continue
        if keep is not None and i < keep:
            continue
        chosen.append(e)
    return chosen


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def remove_unless_live(entry: SessionEntry) -> bool:
    """Delete ``entry``'s directory holding its owner lock (False: a live process owns it now,
    and it was left alone)."""
    session = SessionDir(entry.path)
    try:
        lock = session.claim("exarch-actors sessions --prune")
    except SessionLive:
        return False
    try:
        shutil.rmtree(entry.path)
    finally:
        lock.release()
    return True


@click.command("sessions", context_settings=HELP_SETTINGS)
@click.option(
    "--dir",
    "base",
    type=click.Path(file_okay=False),
    default=".exarch/sessions",
    show_default=True,
    help="Where the sessions are.",
)
@click.option("--prune", is_flag=True, help="Remove sessions (with --older-than and/or --keep).")
@click.option("--older-than", type=Duration(), help="Prune only sessions older than this: 7d.")
@click.option("--keep", type=click.IntRange(min=0), help="Prune all but the N newest.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def sessions_command(
    base: str,
    prune: bool,
    older_than: _dt.timedelta | None,
    keep: int | None,
    as_json: bool,
) -> None:
    """List the sessions under .exarch/sessions (newest first: id, when it started, outcome,
    size, and whether a live process owns it), or prune them.

    A session is `unfinished` when its run never wrote result.json (`exarch-actors resume DIR`
    carries it on) and `live` while a process still writes it. --prune removes the sessions
    that pass every rule given -- older than --older-than DURATION (30m, 12h, 7d, 2w), not among
    the --keep N newest -- and never a live one: it takes each session's owner lock before it
    deletes it.

    \b
    Exit codes:
      0    listed, or pruned (a session that became live meanwhile is kept and named)
      2    bad input: --prune without --older-than or --keep, or those without --prune
    """
    if prune and older_than is None and keep is None:
        raise click.UsageError("--prune needs --older-than DURATION and/or --keep N")
    if not prune and (older_than is not None or keep is not None):
        raise click.UsageError("--older-than and --keep choose what --prune removes: add --prune")
    entries = list_sessions(Path(base))
    removed: list[SessionEntry] = []
    kept_live: list[SessionEntry] = []
    if prune:
        now = _dt.datetime.now(_dt.UTC)
        for e in prune_candidates(entries, now, older_than, keep):
            (removed if remove_unless_live(e) else kept_live).append(e)
        gone = {e.path for e in removed}
        entries = [e for e in entries if e.path not in gone]
    if as_json:
        out: dict[str, Any] = {"sessions": [e.to_json() for e in entries]}
        if prune:
            out["removed"] = [e.to_json() for e in removed]
            out["freedBytes"] = sum(e.size for e in removed)
        click.echo(json.dumps(out, indent=2))
        return
    for e in kept_live:
        click.echo(f"kept {e.path.name}: a live process took it meanwhile", err=True)
    if prune:
        freed = human_size(sum(e.size for e in removed))
        click.echo(f"pruned {len(removed)} sessions ({freed}); {len(entries)} left", err=True)
    if not entries:
        click.echo(f"no sessions under {base}", err=True)
        return
    table = Table(title=f"sessions under {base}", show_header=True)
    for col, justify in (("id", "left"), ("when (UTC)", "left"), ("outcome", "left")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("live", no_wrap=True)
    for e in entries:
        live = f"pid {e.live_pid}" if e.live_pid is not None else ("yes" if e.live else "")
        table.add_row(
            e.path.name,
            e.when.strftime("%Y-%m-%d %H:%M"),
            e.outcome,
            human_size(e.size),
            live,
        )
    Console().print(table)
