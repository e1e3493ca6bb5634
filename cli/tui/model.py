"""What a chat tab shows, as pure data: transcript entries built from two ordered sources.

A tab's transcript merges

- the agent's **event log** (``agents/<name>/events.jsonl``, tailed by :class:`LogTail`): user
  text, assistant text, each ral call as soon as the model asked for it, steering, nudges,
  compaction and the ``cleared`` marker that opens a fresh generation; and
- the fleet **bus**: the digested result of each ral call (``Io``), notices, system notes,
  provider errors, ``/resources`` cards, inbox rejections, and the agent's end (``Died``).

Ordering rule: before a bus event about agent X is applied, X's log is read up to the present
(:meth:`Bridge` does this). An agent appends the assistant message that asks for a call before it
runs the call, and runs it before it publishes its ``Io``, so a call's result can never be shown
before the call. The same digest reaches the log as a ``tool_result``; whichever of the two comes
first fills the call's entry and the other is ignored, so a result is shown exactly once.

Everything here is pure and thread-agnostic; entries are frozen, so a batch of changes can cross
from the bridge thread to the UI thread without sharing mutable state.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Literal

from exarch_actors.runtime.events import (
    Died,
    Event,
    InboxRejected,
    Io,
    Notice,
    Overflow,
    ProviderFailed,
    Resources,
    SystemNote,
)
from exarch_actors.runtime.state.checksum import open_line

TabItemKind = Literal[
    "user",
    "steering",
    "inbound",
    "assistant",
    "ral",
    "nudge",
    "note",
    "notice",
    "error",
    "resources",
    "compacted",
    "cleared",
    "separator",
    "ended",
]

RESULT_PREVIEW_LINES = 12
"""Lines of a digested ral result shown in the transcript; the full digest is in events.jsonl."""


@dataclass(frozen=True)
class TabItem:
    """One transcript item. ``key`` is unique within its tab (a ral call's key is its call id)."""

    key: str
    kind: TabItemKind
    text: str
    result: str | None = None
    is_error: bool = False
    inherited: bool = False
    """A branch's context imported from its parent at the fork (shown dimmed)."""
    speaker: str | None = None
    """Who said an assistant entry, when not the tab's agent (a branch's inherited context);
    on a user entry, the parent that gave a sub-agent its task (no human writes there)."""

    @property
    def plain(self) -> str:
        """The entry as plain text (what tests and the screen reader of the app read)."""
        if self.kind == "ral":
            tail = "running…" if self.result is None else self.result
            return f"ral> {self.text}\n{tail}"
        return self.text


@dataclass(frozen=True)
class Append:
    agent: str
    entry: TabItem


@dataclass(frozen=True)
class Update:
    agent: str
    entry: TabItem


@dataclass(frozen=True)
class Reset:
    """The agent's context was cleared: nothing shown before this may stay on its tab."""

    agent: str


Change = Append | Update | Reset


class Transcript:
    """One agent's transcript state on the bridge side; returns the changes to show."""

    def __init__(
        self,
        agent: str,
        *,
        inherited_before: str | None = None,
        inherited_from: str | None = None,
        task_from: str | None = None,
    ) -> None:
        """``inherited_before``: a branch's ``Born`` stamp; log records stamped up to it are the
        context it imported from ``inherited_from`` at the fork (a branch starts with no prompt,
        so its own first record waits for a human or a message, well after its birth).
        ``task_from``: a sub-agent's parent; no human writes to a sub-agent, so the log's user
        text there is the task that parent gave it, and is labelled so."""
        self.agent = agent
        self._inherited_before = inherited_before
        self._parent = inherited_from or "its parent"
        self._task_from = task_from
        self._in_inherited = False
        self._seq = 0
        self._calls: dict[str, TabItem] = {}

    def _key(self) -> str:
        self._seq += 1
        return f"e{self._seq}"

    def _new(self, kind: TabItemKind, text: str, **kw: Any) -> Change:
        return Append(self.agent, TabItem(self._key(), kind, text, **kw))

    # --- the event log -------------------------------------------------------------------

    def on_record(self, rec: Mapping[str, Any]) -> list[Change]:
        """Changes for one ``events.jsonl`` record."""
        at = rec.get("at")
        inherited = bool(
            self._inherited_before is not None
            and isinstance(at, str)
            and at <= self._inherited_before  # ms stamps: the last import can share Born's
        )
        marks: list[Change] = []
        if inherited and not self._in_inherited:
            self._in_inherited = True
            marks.append(self._new("separator", f"context inherited from {self._parent}"))
        elif not inherited and self._in_inherited:
            self._in_inherited = False
            marks.append(self._new("separator", f"{self.agent} branched from {self._parent}"))
        return marks + self._on_record(rec, inherited)

    def _on_record(self, rec: Mapping[str, Any], inherited: bool) -> list[Change]:
        kind = rec.get("kind")
        text = str(rec.get("text", ""))
        if kind == "user":
            source = rec.get("source", "user")
            if source == "user":
                return [self._new("user", text, inherited=inherited, speaker=self._task_from)]
            return [self._new("inbound", text, inherited=inherited)]
        if kind == "steering":
            return [self._new("steering", text, inherited=inherited)]
        if kind == "nudge":
            return [self._new("nudge", f"nudge ({rec.get('nudge', '?')}): {text}")]
        if kind == "note":
            return [self._new("note", text)]
        if kind == "assistant":
            return self._assistant(rec.get("message") or {}, inherited)
        if kind == "tool_result":
            msg = rec.get("message") or {}
            return self._result(
                str(msg.get("tool_call_id", "")),
                str(msg.get("content", "")),
                bool(msg.get("is_error")),
            )
        if kind == "compacted":
            summary = str(rec.get("summary", ""))
            return [
                self._new(
                    "compacted",
                    f"history compacted ({rec.get('dropped', '?')} events summarised)\n{summary}",
                )
            ]
        if kind == "cleared":
            self._calls.clear()
            return [Reset(self.agent), self._new("cleared", "context cleared")]
        return []

    def _assistant(self, msg: Mapping[str, Any], inherited: bool) -> list[Change]:
        out: list[Change] = []
        text = str(msg.get("text", ""))
        if text.strip():
            speaker = self._parent if inherited else None
            out.append(self._new("assistant", text, inherited=inherited, speaker=speaker))
        for call in msg.get("tool_calls") or ():
            cid = str(call.get("id", "")) or self._key()
            args = call.get("arguments")
            script = args.get("script") if isinstance(args, dict) else None
            shown = script if isinstance(script, str) else json.dumps(args, ensure_ascii=False)
            if call.get("name") != "ral":
                shown = f"{call.get('name')} {shown}"
            key = cid
            seen = self._calls.get(cid)
            if seen is not None:
                if seen.result is None:  # seen already (a replayed record): never shown twice
                    continue
                # A new call reusing a finished call's id (servers that number calls per reply):
                # its own entry, and from now on the id's results are its.
                self._seq += 1
                key = f"{cid}#{self._seq}"
            entry = TabItem(key, "ral", shown, inherited=inherited)
            self._calls[cid] = entry
            out.append(Append(self.agent, entry))
        return out

    def _result(self, cid: str, content: str, is_error: bool) -> list[Change]:
        entry = self._calls.get(cid)
        if entry is None:  # a result whose call the log never showed: shown on its own
            orphan = TabItem(
                cid or self._key(), "ral", "(call not shown)", preview(content), is_error
            )
            self._calls[orphan.key] = orphan
            return [Append(self.agent, orphan)]
        if entry.result is not None:
            return []
        filled = replace(entry, result=preview(content), is_error=is_error)
        self._calls[cid] = filled
        return [Update(self.agent, filled)]

    # --- the bus ------------------------------------------------------------------------

    def on_event(self, ev: Event) -> list[Change]:
        """Changes for one bus event about this agent (the log already read up to now)."""
        if isinstance(ev, Io):
            return self._result(ev.call_id, ev.value, ev.error is not None)
        if isinstance(ev, Notice):
            if ev.notice == "Cleared":
                return []  # the log's ``cleared`` record already reset the tab
            return [self._new("notice", f"{ev.notice}: {ev.text}" if ev.text else ev.notice)]
        if isinstance(ev, SystemNote):
            return [self._new("note", ev.text)]
        if isinstance(ev, ProviderFailed):
            return [self._new("error", f"provider error ({ev.error}): {ev.message}")]
        if isinstance(ev, Resources):
            return [self._new("resources", ev.card)]
        if isinstance(ev, InboxRejected):
            who = f" from {ev.sender}" if ev.sender else ""
            return [
                self._new(
                    "error",
                    f"undelivered {ev.message.get('type', 'message')}{who}: {ev.reason}"
                    " (recorded in transcript.jsonl)",
                )
            ]
        if isinstance(ev, Died):
            cause = f" ({ev.cause})" if ev.cause else ""
            return [self._new("ended", f"{self.agent} ended: {ev.outcome}{cause}")]
        if isinstance(ev, Overflow):
            return [
                self._new("note", f"the view missed {ev.missed} events; transcript.jsonl has them")
            ]
        return []


def preview(content: str, lines: int = RESULT_PREVIEW_LINES) -> str:
    """The digested result as the transcript shows it: at most ``lines`` lines."""
    parts = content.rstrip("\n").split("\n")
    if len(parts) <= lines:
        return "\n".join(parts)
    return "\n".join([*parts[:lines], f"… {len(parts) - lines} more lines in events.jsonl"])


class LogTail:
    """Incremental reader of one ``events.jsonl``; follows it across ``/clear``'s rotation.

    ``/clear`` renames the current file to ``events.<n>.jsonl`` and starts a fresh one. The
    open handle keeps reading the renamed file to its end, then the tail reopens the path, so
    no record of either generation is missed. Only complete lines are parsed; a torn or
    undecodable line is skipped (the durable reader reports it, this view does not).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fh: BinaryIO | None = None
        self._buf = b""

    def read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")  # noqa: SIM115 - held across calls
            except FileNotFoundError:
                return out
        out.extend(self._drain())
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            return out  # mid-rotation: the fresh file is not there yet
        if current != os.fstat(self._fh.fileno()).st_ino:
            out.extend(self._drain())  # the archived generation's last records
            self._fh.close()
            self._fh = open(self.path, "rb")  # noqa: SIM115
            self._buf = b""
            out.extend(self._drain())
        return out

    def _drain(self) -> list[dict[str, Any]]:
        assert self._fh is not None
        data = self._fh.read()
        if not data:
            return []
        data = self._buf + data
        *lines, self._buf = data.split(b"\n")
        out: list[dict[str, Any]] = []
        for line in lines:
            try:
                rec = json.loads(open_line(line)[0])
            except ValueError:  # a damaged line (ChecksumMismatch is one too)
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
