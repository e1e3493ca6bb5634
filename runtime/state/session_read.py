"""Reading a session directory for ``resume``: every file it builds on, or a typed refusal.

The rule: ``resume`` builds only on files it can trust whole. A file is trusted when every line
but a torn last one reads and has the shape its readers rely on (``runtime/state/session_dir.py``,
``runtime/state/eventlog.py``, ``runtime/state/journal.py``). A torn last line is what a SIGKILL
mid-append
leaves: it is healed (the next append sets it aside, ``runtime/state/durable.py``). Anything else --
a garbled line in the middle, a record of the wrong shape, a journal record the settlement fold
refuses, a seq gap, a journal that lost children the transcript saw born, a corrupt snapshot of
an agent to rebuild -- is no crash's doing, and guessing past it could run a child twice or drop
one: :class:`DamagedSession` names the file and line, and ``exarch-actors resume`` exits 2.

``result.json`` is the exception: it is derived (fleet yield from the journal, outcome and reply
from the trunk's ``Died``), so a corrupt one is set aside and rebuilt (:func:`set_aside_result`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.errors import ExarchError, SnapshotRefused
from exarch_actors.runtime.providers import PROVIDER_NAMES
from exarch_actors.runtime.ral.grants import GrantPolicy
from exarch_actors.runtime.settlement.fleet_yield import read_result
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import JsonlRead, Shape, read_json_document, read_jsonl
from exarch_actors.runtime.state.eventlog import EVENT_SHAPE
from exarch_actors.runtime.state.journal import Replay, replay
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import (
    RECORD_SHAPE,
    TRANSCRIPT_SHAPE,
    born_children,
)
from exarch_actors.runtime.state.snapshot import MobileSnapshot, SnapshotMissing


class ResumeRefused(ExarchError):
    """The session cannot be resumed (not a session, already finished, unreadable run.json)."""


class NothingToResume(ResumeRefused):
    """``result.json`` exists: the run already ended."""


class DamagedSession(ResumeRefused):
    """A file ``resume`` must build on is damaged in a way no crash leaves (see the module
    docstring); ``where`` is ``file:line: what`` for the first problem, ``more`` the rest."""

    def __init__(self, root: Path, problems: list[str], why: str, todo: str) -> None:
        self.root = root
        self.where = problems[0]
        self.more = problems[1:]
        extra = f" (and {len(self.more)} more)" if self.more else ""
        super().__init__(
            f"damaged session: {root}/{self.where}{extra}. {why}; resume will not guess. "
            f"{todo} `exarch-actors check {root}` lists every damaged line."
        )


DURABILITIES = tuple(d.value for d in Durability)

_RUN_FIELDS: dict[str, tuple[Any, ...]] = {
    "prompt": (str, type(None)),
    "scenario": (str, type(None)),
    "model": (str, type(None)),
    "baseUrl": (str, type(None)),
    "diskWarnBytes": (int, type(None)),
    "windowTokens": (int, type(None)),
    "cwd": (str, type(None)),
}


@dataclass
class SessionFiles:
    """What ``resume`` read, every part validated (see the module docstring)."""

    session: SessionDir
    run: dict[str, Any]
    transcript: list[dict[str, Any]]
    journal: Replay
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    committed: set[str] = field(default_factory=set)  # agents with a Commit record
    corrupt_result: str | None = None  # why result.json is corrupt (it is rebuilt)

    def events_of(self, agent: str) -> list[dict[str, Any]]:
        return self.events.get(agent, [])


def read_session(session: SessionDir) -> SessionFiles:
    """Read and validate every file ``resume`` plans from; raises :class:`ResumeRefused`."""
    root = session.root
    doc, corrupt = read_result(session)
    if doc is not None:
        raise NothingToResume(f"{root}: {session.result.name} exists, the run already ended")
    run = read_run(session)
    transcript = _trusted(session, session.transcript, TRANSCRIPT_SHAPE)
    record = [r for p in session.record_files() for r in _trusted(session, p, RECORD_SHAPE)]
    events: dict[str, list[dict[str, Any]]] = {
        name: [r for p in session.event_logs(name) for r in _trusted(session, p, EVENT_SHAPE)]
        for name in session.agent_names()
    }
    journal = replay(session.journal, strict=False)
    problems = journal.problems()
    if problems:
        raise DamagedSession(
            root,
            problems,
            "the settlement history cannot be replayed past it, so which children finished "
            "is unknown",
            "Start a fresh run;",
        )
    _require_journal_covers_born(session, transcript, journal)
    return SessionFiles(
        session,
        run,
        transcript,
        journal,
        events,
        {str(r["agent"]) for r in record if r.get("kind") == "Commit"},
        corrupt,
    )


def _require_journal_covers_born(
    session: SessionDir, transcript: list[dict[str, Any]], rep: Replay
) -> None:
    missing = sorted(born_children(transcript) - set(rep.state.nodes))
    if not missing:
        return
    path = session.journal
    state = "missing" if not path.exists() else "empty" if not rep.records else "incomplete"
    raise DamagedSession(
        session.root,
        [
            f"{path.name}: {state}, but {session.transcript.name} records {len(missing)} Born "
            f"child(ren) it lacks ({', '.join(missing[:5])})"
        ],
        "their settlement records are lost, so whether they finished is unknown",
        "Restore the journal if you have a copy, or start a fresh run;",
    )


def load_snapshot(files: SessionFiles, agent: str) -> MobileSnapshot | None:
    """The snapshot ``agent`` is rebuilt from. None when it never checkpointed; refused when it
    is corrupt, or missing although its ``commits.jsonl`` shows the agent committed bindings (its
    shell would come back empty: every committed binding lost)."""
    path = files.session.snapshot(agent)
    rel = path.relative_to(files.session.root)
    try:
        return MobileSnapshot.load(path)
    except SnapshotMissing:
        if agent not in files.committed:
            return None
        commits = files.session.commits(agent).relative_to(files.session.root)
        problem = f"{rel}: missing, but {commits} shows {agent} committed bindings"
    except SnapshotRefused as e:
        problem = f"{rel}: {e}"
    raise DamagedSession(
        files.session.root,
        [problem],
        f"{agent}'s shell cannot be restored with the bindings it committed",
        "Restore the snapshot if you have a copy, or start a fresh run;",
    )


def set_aside_result(session: SessionDir) -> Path:
    """Move a corrupt ``result.json`` to the first free ``result.json.corrupt[.N]``; its bytes
    are kept, and ``resume`` writes a fresh one."""
    n = 1
    while session.result_set_aside(n).exists():
        n += 1
    dst = session.result_set_aside(n)
    os.replace(session.result, dst)
    return dst


def _trusted(session: SessionDir, path: Path, shape: Shape) -> list[dict[str, Any]]:
    read: JsonlRead = read_jsonl(path, shape)
    rel = str(path.relative_to(session.root))
    bad = [d.where(rel) for d in read.inner_damage]
    if bad:
        raise DamagedSession(
            session.root,
            bad,
            "a line in the middle no crash leaves behind means records are lost",
            "Repair or delete the line by hand (it is the only copy) and resume again, or "
            "start a fresh run;",
        )
    return read.records


def read_run(session: SessionDir) -> dict[str, Any]:
    """``run.json``, checked for what restarting the run needs; :class:`ResumeRefused`."""
    path = session.run_spec
    try:
        run = read_json_document(path)[0]
    except FileNotFoundError:
        raise ResumeRefused(
            f"{session.root}: no {path.name}, so nothing says how to restart it"
        ) from None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ResumeRefused(f"{path} is unreadable ({e}); resume cannot restart it") from e
    problem = _run_problem(run)
    if problem is not None:
        raise ResumeRefused(f"{path} is damaged: {problem}; resume cannot restart it")
    return run


def _run_problem(run: Any) -> str | None:
    if not isinstance(run, dict):
        return "not a JSON object"
    if run.get("provider") not in PROVIDER_NAMES:
        return f"provider {run.get('provider')!r} is not one of {PROVIDER_NAMES}"
    if run["provider"] == "scripted" and not isinstance(run.get("scenario"), str):
        return "a scripted run without its scenario path"
    for name, types in _RUN_FIELDS.items():
        value = run.get(name)
        if isinstance(value, bool) or not isinstance(value, types):
            return f"{name} is {type(value).__name__}"
    if run.get("durability", DEFAULT_DURABILITY.value) not in DURABILITIES:
        return f"durability {run.get('durability')!r} is not one of {DURABILITIES}"
    for name, parse in (("grants", GrantPolicy.from_dict), ("shellLimits", ShellLimits.from_json)):
        try:
            parse(run.get(name))
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # a wrong shape
            return f"{name} is unreadable ({type(e).__name__}: {e})"
    return None
