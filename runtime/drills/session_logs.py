"""The checker's reader of a session's JSON-lines logs: every record that has its shape, and
every line that does not, reported rather than raised.

``resume`` reads the same files strictly (``runtime/state/session_read.py``: damage refuses). The
checker must instead go on and report everything it finds, so this reader keeps what reads,
notes a torn last line (the expected shape of a crash mid-append) and records anything else as
damage named by file and line (a line whose checksum does not match among it). Lines written
before checksums (``runtime/state/checksum.py``) are counted, so ``check`` can say the session
predates them. Each file is read once (cached), so the ``files-parse``
invariant, checked last, reports what the other invariants read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.state.durable import Shape, read_jsonl
from exarch_actors.runtime.state.eventlog import EVENT_SHAPE
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import RECORD_SHAPE, TRANSCRIPT_SHAPE


@dataclass
class SessionLogs:
    """The logs of one session as the checker reads them (see the module docstring)."""

    session: SessionDir
    damage: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    bare: dict[Path, int] = field(default_factory=dict)  # lines written before checksums
    cache: dict[Path, list[dict[str, Any]]] = field(default_factory=dict)

    def jsonl(self, path: Path, shape: Shape | None = None) -> list[dict[str, Any]]:
        """The records of ``path`` that have ``shape``; the rest is reported (a torn last line
        as a note, anything else as damage)."""
        if path not in self.cache:
            read = read_jsonl(path, shape)
            rel = path.relative_to(self.session.root)
            for d in read.damage:
                if d.torn_tail:
                    self.torn.append(f"{rel}:{d.line}: torn last line ({len(d.text)} B) skipped")
                else:
                    self.damage.append(d.where(str(rel)))
            if read.bare:
                self.bare[rel] = read.bare
            self.cache[path] = read.records
        return self.cache[path]

    @property
    def transcript(self) -> list[dict[str, Any]]:
        return self.jsonl(self.session.transcript, TRANSCRIPT_SHAPE)

    @property
    def record(self) -> list[dict[str, Any]]:
        return [r for p in self.session.record_files() for r in self.jsonl(p, RECORD_SHAPE)]

    @property
    def journal(self) -> list[dict[str, Any]]:
        """The journal's lines as read; its fold (``runtime/state/journal.py``) is the stricter
        reader of its records."""
        return self.jsonl(self.session.journal)

    def events(self, agent: str) -> list[dict[str, Any]]:
        """Every record of every generation of ``agent``'s event log, oldest file first."""
        out: list[dict[str, Any]] = []
        for p in self.session.event_logs(agent):
            out.extend(self.jsonl(p, EVENT_SHAPE))
        return out

    def read_every_log(self) -> list[Path]:
        """Read (and cache) every log of the session, noting its damage; the files read."""
        session = self.session
        shapes: dict[Path, Shape | None] = {
            session.transcript: TRANSCRIPT_SHAPE,
            session.journal: None,
        }
        shapes.update((p, RECORD_SHAPE) for p in session.record_files())
        for agent in session.agent_names():
            shapes.update((p, EVENT_SHAPE) for p in session.event_logs(agent))
        for path, shape in shapes.items():
            self.jsonl(path, shape)
        return list(shapes)
