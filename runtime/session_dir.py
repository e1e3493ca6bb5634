"""The session directory: where every run leaves its durable files (SCENARIO.md contract).

One place names every path, so readers (``check``, ``resume``) and writers agree by construction.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


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
    def at(cls, path: str | os.PathLike[str]) -> SessionDir:
        """Use ``path`` (created if missing)."""
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
