"""The session directory: where every run leaves its durable files (docs/scenarios.md).

One place names every path, so readers (``check``, ``resume``) and writers agree by construction,
and says what those readers rely on in the two shared logs (:data:`TRANSCRIPT_SHAPE`,
:data:`RECORD_SHAPE`): a line that breaks it is damage named by file and line, never a failure
deep inside a reader. (The journal's and the event log's shapes live with their formats:
``runtime/journal.py``, ``runtime/eventlog.py``.)
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.durable import ListOf, Shape
from runtime.errors import ExarchError
from runtime.fleet_yield import OUTCOMES

RUN_FILES = (
    "run.json",
    "transcript.jsonl",
    "record.jsonl",
    "spawn-journal.jsonl",
    "result.json",
    "agents",
)
"""What a run leaves in its directory; any one of them means the directory holds a run."""


def _known_outcome(r: dict[str, object]) -> str | None:
    outcome = r.get("outcome")
    return None if outcome is None or outcome in OUTCOMES else f"Died outcome {outcome!r}"


TRANSCRIPT_SHAPE = Shape(
    {
        "Born": {"agent": (str,), "parent?": (str, None), "returns?": (bool,)},
        "Died": {"agent": (str,), "outcome?": (str,), "cause?": (str, None), "reply?": (str, None)},
        "InboxRejected": {"agent": (str,), "message?": (dict,)},
        "ProviderError": {"agent": (str,)},
        "Notice": {"agent": (str,), "notice?": (str,), "text?": (str,)},
    },
    {"Died": _known_outcome},
)
"""``transcript.jsonl``: the fields ``resume`` and the checker read."""

RECORD_SHAPE = Shape(
    {
        "Commit": {
            "agent": (str,),
            "epoch": (int,),
            "defined": (ListOf(str),),
            "pid?": (int, None),
            "pidStartedAt?": (int, float, None),
        },
        "Prune": {"agent": (str,), "epoch?": (int, None), "names": (ListOf(str),)},
    }
)
"""``record.jsonl``: the fields the checker (and ``resume``'s process sweep) read."""


def born_children(transcript: Iterable[dict[str, Any]]) -> set[str]:
    """Children the bus saw born (a parent, and a result owed). A spawned child is journalled
    (``spawned``, acknowledged) before its ``Born`` is published, so every one of these must be in
    the spawn journal: one that is not is a journal that lost records."""
    return {
        str(r["agent"])
        for r in transcript
        if r.get("kind") == "Born" and isinstance(r.get("parent"), str) and r.get("returns")
    }


class SessionDirInUse(ExarchError):
    """A new run was pointed at a directory that already holds a run.

    Two runs in one directory would share one spawn journal, so the second run's children
    collide with the first's settled records and can never be admitted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.finished = (root / "result.json").exists()
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
    """Paths of one session directory. Creating the object creates nothing on disk."""

    root: Path

    @classmethod
    def new(cls, base: str | os.PathLike[str] | None = None) -> SessionDir:
        """A fresh directory ``.exarch/sessions/<UTC timestamp>-<short id>/`` under ``base``."""
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        parent = Path(base) if base is not None else Path.cwd() / ".exarch" / "sessions"
        root = parent / f"{stamp}-{secrets.token_hex(3)}"
        root.mkdir(parents=True, exist_ok=False)
        return cls(root)

    @classmethod
    def fresh_at(cls, path: str | os.PathLike[str]) -> SessionDir:
        """``path`` for a *new* run: created if missing, refused with :class:`SessionDirInUse`
        if it already holds a run's files (an empty existing directory is fine)."""
        root = Path(path)
        if root.is_dir() and any((root / name).exists() for name in RUN_FILES):
            raise SessionDirInUse(root)
        return cls.at(root)

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> SessionDir:
        """Use ``path`` (created if missing), whatever it holds (``resume``, ``check``)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        return cls(root)

    @property
    def transcript(self) -> Path:
        return self.root / "transcript.jsonl"

    @property
    def record(self) -> Path:
        return self.root / "record.jsonl"

    @property
    def journal(self) -> Path:
        return self.root / "spawn-journal.jsonl"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def recording(self) -> Path:
        """``--record``: every agent's model replies as a scenario (``runtime/replay/``)."""
        return self.root / "recording.toml"

    @property
    def replay_report(self) -> Path:
        """``replay``: the replay's divergences from the session it replayed."""
        return self.root / "replay-report.json"

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / _safe(name)

    def events(self, name: str) -> Path:
        return self.agent_dir(name) / "events.jsonl"

    def snapshot(self, name: str) -> Path:
        return self.agent_dir(name) / "snapshot.msgpack"

    def scratch(self, name: str) -> Path:
        return self.root / "scratch" / _safe(name)


def _safe(name: str) -> str:
    """Agent names become directory names; refuse path tricks rather than silently rewrite."""
    if not name or name in {".", ".."} or "/" in name or "\x00" in name:
        raise ValueError(f"agent name {name!r} cannot be used as a directory name")
    return name
