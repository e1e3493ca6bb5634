"""The session directory: where every run leaves its durable files (docs/scenarios.md).

The one module that names a file of a session: every reader (``check``, ``resume``, ``replay``,
the drills) and every writer reaches a file through :class:`SessionDir`, so they agree by
construction (``tests/test_layout.py`` holds every other module to it). What the records in
those files look like lives with their formats: ``runtime/state/session_records.py`` (transcript and
forensic record), ``runtime/state/journal.py``, ``runtime/state/eventlog.py``,
``runtime/settlement/fleet_yield.py``.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.state.durable import TORN_SUFFIX
from exarch_actors.runtime.state.private import DIR_MODE, make_private, private_dirs
from exarch_actors.runtime.state.session_lock import LOCK_NAME, Owner, SessionLock, live_owner

_RUN_SPEC = "run.json"
_TRANSCRIPT = "transcript.jsonl"
_RECORD = "record.jsonl"
_JOURNAL = "spawn-journal.jsonl"
_RESULT = "result.json"
_AGENTS = "agents"

RUN_FILES = (_RUN_SPEC, _TRANSCRIPT, _RECORD, _JOURNAL, _RESULT, _AGENTS)
"""What a run leaves in its directory; any one of them means the directory holds a run."""


class SessionDirInUse(ExarchError):
    """A new run was pointed at a directory that already holds a run.

    Two runs in one directory would share one spawn journal, so the second run's children
    collide with the first's settled records and can never be admitted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.finished = SessionDir(root).result.exists()
        if self.finished:
            what = "a finished run (result.json exists)"
            todo = "start the new run in a fresh directory (omit --session-dir for a new one)"
        else:
            what = "a run that did not finish"
            todo = (
                f"carry it on with `exarch-actors resume {root}`, or start the new run in a "
                "fresh directory (omit --session-dir for a new one)"
            )
        super().__init__(f"session directory in use: {root} already holds {what}; {todo}")


@dataclass(frozen=True)
class SessionDir:
    """Paths of one session directory. Creating the object creates nothing on disk; what a
    run creates in it is private to the user (``runtime/state/private.py``: directories
    ``0700``, files ``0600``)."""

    root: Path

    @classmethod
    def new(cls, base: str | os.PathLike[str] | None = None) -> SessionDir:
        """A fresh directory ``.exarch/sessions/<UTC timestamp>-<short id>/`` under ``base``."""
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        parent = Path(base) if base is not None else Path.cwd() / ".exarch" / "sessions"
        root = parent / f"{stamp}-{secrets.token_hex(3)}"
        private_dirs(parent)
        root.mkdir(DIR_MODE)
        return cls(root)

    @classmethod
    def fresh_at(cls, path: str | os.PathLike[str]) -> SessionDir:
        """``path`` for a *new* run: created if missing, refused with :class:`SessionDirInUse`
        if it already holds a run's files (an empty existing directory is fine)."""
        root = Path(path)
        if cls(root).holds_a_run():
            raise SessionDirInUse(root)
        return cls.at(root)

    @classmethod
    def claim_fresh(
        cls, path: str | os.PathLike[str] | None, command: str | None = None
    ) -> tuple[SessionDir, SessionLock]:
        """A directory for a new run, owned: ``path`` as :meth:`fresh_at` takes it (or a new one
        under ``.exarch/sessions/`` when None), with its lock held. A live owner is refused
        first (:class:`~runtime.state.session_lock.SessionLive`: it says the run is running,
        its pid and where), then a directory that holds a run (:class:`SessionDirInUse`)."""
        if path is None:
            session = cls.new()
            return session, session.claim(command)
        session = cls.at(path)
        lock = session.claim(command)
        if session.holds_a_run():
            lock.release()
            raise SessionDirInUse(session.root)
        return session, lock

    def claim(self, command: str | None = None) -> SessionLock:
        """Take this session's owner lock for this process (``runtime/state/session_lock.py``):
        every command that writes a session holds it for as long as it writes."""
        return SessionLock.acquire(self.owner_lock, self.root, command)

    def live_owner(self) -> Owner | None:
        """The live process that owns this session, or None."""
        return live_owner(self.owner_lock)

    @property
    def owner_lock(self) -> Path:
        """The owner lock (``runtime/state/session_lock.py``): not a run file, it only says who
        is writing the session now."""
        return self.root / LOCK_NAME

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> SessionDir:
        """Use ``path`` (created if missing), whatever it holds. Readers of an existing session
        (``check``, ``resume``, ``replay``) use ``SessionDir(path)``, which creates nothing."""
        root = Path(path)
        private_dirs(root)
        make_private(root)
        return cls(root)

    def holds_a_run(self) -> bool:
        """Whether any file a run leaves is here (:data:`RUN_FILES`)."""
        return self.root.is_dir() and any((self.root / name).exists() for name in RUN_FILES)

    @property
    def run_spec(self) -> Path:
        """How the run was started (provider, prompt, scenario, grants): ``resume`` restarts
        it from this."""
        return self.root / _RUN_SPEC

    @property
    def transcript(self) -> Path:
        """The bus: every event of every agent (``runtime/state/session_records.py``)."""
        return self.root / _TRANSCRIPT

    @property
    def record(self) -> Path:
        """Forensic records: Prune, Rollback, Reap (``runtime/state/session_records.py``);
        each agent's ``Commit`` records are in its own :meth:`commits`."""
        return self.root / _RECORD

    def record_files(self) -> list[Path]:
        """Every file of forensic records: ``record.jsonl``, then each agent's
        :meth:`commits` that exists (sorted by agent). Readers of Commit records read them all;
        the order of records across files is their ``at``, not their place."""
        own = [self.commits(name) for name in self.agent_names()]
        return [self.record, *(p for p in own if p.exists())]

    @property
    def journal(self) -> Path:
        """The settlement journal (``runtime/state/journal.py``)."""
        return self.root / _JOURNAL

    @property
    def result(self) -> Path:
        """Outcome, reply and fleet yield, written at the end
        (``runtime/settlement/fleet_yield.py``)."""
        return self.root / _RESULT

    def result_set_aside(self, n: int) -> Path:
        """Where the ``n``-th corrupt ``result.json`` is set aside (its bytes kept)."""
        return self.root / (f"{_RESULT}.corrupt" if n == 1 else f"{_RESULT}.corrupt.{n}")

    @property
    def mcp(self) -> Path:
        """The fleet's MCP servers' directory: each stdio server's stderr (``NAME.stderr``) and
        the scratch directory a confined server may write (``docs/mcp.md``)."""
        return self.root / "mcp"

    @property
    def recording(self) -> Path:
        """``--record``: every agent's model replies as a scenario (``runtime/replay/``)."""
        return self.root / "recording.toml"

    @property
    def replay_report(self) -> Path:
        """``replay``: the replay's divergences from the session it replayed."""
        return self.root / "replay-report.json"

    @property
    def agents(self) -> Path:
        """The directory of every agent's own files."""
        return self.root / _AGENTS

    def agent_names(self) -> list[str]:
        """Every agent that has a directory here, sorted."""
        d = self.agents
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def _agent_dir(self, name: str) -> Path:
        return self.agents / _safe(name)

    def events(self, name: str) -> Path:
        """``name``'s current event log; ``/clear`` archives it beside itself as
        ``events.<N>.jsonl`` (``runtime/state/eventlog.py``)."""
        return self._agent_dir(name) / "events.jsonl"

    def event_logs(self, name: str) -> list[Path]:
        """Every generation of ``name``'s event log (archives from /clear, then the current),
        sorted by file name."""
        current = self.events(name)
        d = current.parent
        return sorted(d.glob(f"{current.stem}*{current.suffix}")) if d.is_dir() else []

    def snapshot(self, name: str) -> Path:
        return self._agent_dir(name) / "snapshot.msgpack"

    def commits(self, name: str) -> Path:
        """``name``'s ``Commit`` records, one per clean ral call, written by its host alone.

        Not in the shared ``record.jsonl``: with agents as processes, 200 hosts appending one
        line a call to one file met under its ``flock`` on ~28% of appends, each waiter
        sleeping 0.1-10 ms and then re-checking the tail another writer moved: 200 agents x
        50 calls on 2 cores ran 1,494-1,676 calls/s so, 1,716-1,821 with a file per agent."""
        return self._agent_dir(name) / "commits.jsonl"

    def scratch(self, name: str) -> Path:
        return self.root / "scratch" / _safe(name)

    def retained_snapshot(self, node_id: str) -> Path:
        """Where the release sweep keeps a retained child's in-flight snapshot. A node id is
        rewritten, not refused, here: the sweep must persist whatever id the journal holds."""
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in node_id) or "_"
        return self.root / "retained" / safe / "snapshot.msgpack"

    def torn_side_files(self) -> list[Path]:
        """Torn tails an append set aside (``<file>.torn``, ``runtime/state/durable.py``),
        sorted."""
        return sorted([*self.root.glob("*" + TORN_SUFFIX), *self.agents.glob(f"*/*{TORN_SUFFIX}")])


def _safe(name: str) -> str:
    """Agent names become directory names; refuse path tricks rather than silently rewrite."""
    if not name or name in {".", ".."} or "/" in name or "\x00" in name:
        raise ValueError(f"agent name {name!r} cannot be used as a directory name")
    return name
