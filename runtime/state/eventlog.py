"""The agent's canonical event log: the one record of its conversation.

Two halves that never disagree:

- **on disk**, ``agents/<name>/events.jsonl``: append-only JSON lines, each acknowledged under
  the session's durability policy (:func:`runtime.state.durable.append_jsonl`: written; under
  ``machine`` also fsync'd, group-committed). Compaction never rewrites it; it only appends a
  ``compacted`` breadcrumb.
- **in memory**, the *mirror*: the events the model's context is rendered from. A compaction
  physically drops the summarised prefix from the mirror (``del events[:k]``, so the heap is
  reclaimed and :attr:`AgentLog.event_count` / :attr:`AgentLog.history_bytes` shrink to summary
  + suffix), *after* the breadcrumb is durable — a crash between the two replays to the same
  mirror, a refused compaction drops nothing.

Protocol state: ``READY_FOR_USER`` or ``AWAITING_TOOL_RESULTS`` (an assistant message asked for
tool calls not all answered). A user-role append (user, nudge, steering) or another assistant
message while results are pending is refused with :class:`ProtocolError`, so the log can never
hold a request a strict backend rejects.

Event kinds (``"kind"`` of every record): ``user`` (with ``"source"``: user, agent_result,
agent_message, wakeup, ...), ``assistant`` (the admitted message *with its tool calls*),
``tool_result`` (with ``"reply"``, the rendered value, when the call ran ``reply``: see
:meth:`AgentLog.logged_reply`), ``nudge``, ``steering``, ``note`` (a system note; model-visible
only when flagged), ``compacted`` (the breadcrumb: summary and how many mirror events it
replaced), and the disk-only ``cleared`` marker that opens a fresh generation.

/clear (:meth:`AgentLog.restart`): the current ``events.jsonl`` is renamed to the next free
``events.<n>.jsonl`` (an atomic rename; the directory fsync'd under ``machine``) and a fresh
``events.jsonl`` starts with one ``cleared`` record naming the archive. Nothing before the
clear can re-enter the model's context: the mirror is emptied, and :meth:`AgentLog.load` only
ever reads the current ``events.jsonl``. The archive stays for forensics; nothing is deleted.

An AgentLog belongs to one agent (one actor thread); it takes no locks.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.fleet.compaction import SUMMARY_PREAMBLE, suffix_start
from exarch_actors.runtime.messages import (
    AssistantMessage,
    Message,
    ToolResult,
    UserMessage,
    message_from_dict,
)
from exarch_actors.runtime.ral.codec import CodecError, decode_text, encode_text
from exarch_actors.runtime.ral.values import render
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import sync_for
from exarch_actors.runtime.state.durable import (
    Damage,
    Shape,
    append_jsonl,
    read_jsonl,
    stamped_line,
)


class ProtocolState(StrEnum):
    READY_FOR_USER = "ready_for_user"
    AWAITING_TOOL_RESULTS = "awaiting_tool_results"


class ProtocolError(ExarchError):
    """An append the provider protocol forbids in the log's current state; nothing was written."""

    def __init__(self, attempted: str, state: ProtocolState, pending: Sequence[str]) -> None:
        self.attempted = attempted
        self.state = state
        self.pending = tuple(pending)
        hint = (
            f"append a tool_result for each pending call ({', '.join(self.pending)}) first"
            if self.pending
            else "append an assistant message with those tool calls first"
        )
        super().__init__(f"event log refuses {attempted} while {state.value}: {hint}")


class UnadmittedMessage(ExarchError):
    """An assistant message that did not pass :func:`runtime.messages.admit_assistant`."""


class CompactionRefused(ExarchError):
    """Compaction is not allowed now (tool results pending); nothing was dropped."""


INTERRUPTED_RESULT = (
    "[error]\nthis tool call did not complete: the run was interrupted before its result was "
    "recorded. Re-run it if you still need it."
)
"""Model-facing text :meth:`AgentLog.settle_pending` records for a stranded call."""

_UNPARSED = object()
USER_ROLE_KINDS = frozenset({"user", "nudge", "steering"})
_META_KINDS = frozenset({"cleared"})


def _message_of(kind: str, want: type) -> Callable[[dict[str, Any]], str | None]:
    def check(record: dict[str, Any]) -> str | None:
        try:
            msg = message_from_dict(record["message"])
        except Exception as e:  # untrusted bytes: whatever the parser trips on is damage
            return f"{kind} message unreadable ({type(e).__name__}: {e})"
        return None if isinstance(msg, want) else f"{kind} message has the wrong role"

    return check


EVENT_SHAPE = Shape(
    {
        "user": {"text": (str,), "source?": (str,), "messageId?": (str,)},
        "nudge": {"text": (str,)},
        "steering": {"text": (str,)},
        "note": {"text": (str,), "model_visible?": (bool,)},
        "assistant": {"message": (dict,)},
        "tool_result": {"message": (dict,), "reply?": (str,)},
        "compacted": {"summary": (str,), "dropped": (int,)},
        "cleared": {"archived?": (str, None)},
    },
    {
        "assistant": _message_of("assistant", AssistantMessage),
        "tool_result": _message_of("tool_result", ToolResult),
    },
)
"""What :meth:`AgentLog.load` (and ``resume``, the checker) rely on in an ``events.jsonl`` record:
a record that breaks it is reported as damage, never raised from deep inside a reader."""


@dataclass(frozen=True)
class LogEvent:
    """One mirror event: the record as written (without ``"at"``) and its serialised size."""

    kind: str
    data: Mapping[str, Any]
    size: int

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> LogEvent:
        body = {k: v for k, v in data.items() if k != "at"}
        size = len(json.dumps(body, ensure_ascii=False).encode("utf-8")) + 1
        return cls(str(body.get("kind", "")), body, size)

    def message(self) -> Message | None:
        """What this event contributes to the model's context, if anything (parsed once: the
        transcript is rendered before every provider request, so re-parsing every event each
        time made a long history cost ~1.5 ms per call)."""
        cached = self.__dict__.get("_message", _UNPARSED)
        if cached is _UNPARSED:
            cached = self._parse()
            self.__dict__["_message"] = cached  # a frozen dataclass keeps a plain __dict__
        return cast("Message | None", cached)

    def _parse(self) -> Message | None:
        k = self.kind
        if k in USER_ROLE_KINDS:
            return UserMessage(str(self.data.get("text", "")))
        if k == "assistant" or k == "tool_result":
            msg = message_from_dict(self.data["message"])
            assert isinstance(msg, AssistantMessage | ToolResult)
            return msg
        if k == "compacted":
            return UserMessage(SUMMARY_PREAMBLE + str(self.data.get("summary", "")))
        if k == "note" and self.data.get("model_visible"):
            return UserMessage("[system note] " + str(self.data.get("text", "")))
        return None


@dataclass
class LoadReport:
    """What :meth:`AgentLog.load` read and what it had to skip."""

    records: int = 0
    damage: list[Damage] = field(default_factory=list)
    protocol_anomalies: list[str] = field(default_factory=list)

    @property
    def torn(self) -> bool:
        return any(d.torn_tail for d in self.damage)


class AgentLog:
    """Append-only event log plus its in-memory mirror. See the module docstring."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """A log writing to ``path``; the mirror starts empty (use :meth:`load` to resume)."""
        self.path = Path(path)
        self._events: list[LogEvent] = []
        self._rendered: list[Message] = []
        """:meth:`render_transcript` of the first ``_rendered_upto`` events, extended as events
        are appended and rebuilt after anything else changes the mirror (compaction, a dropped
        frame, a clear): rendering the whole mirror before every provider request was ~0.2 us
        per event, so a long turn's renders grew with its length."""
        self._rendered_upto = 0
        self._bytes = 0
        self._pending: list[str] = []  # tool-call ids awaiting results, in request order
        self._used_tokens: int | None = None

    # --- reading ---------------------------------------------------------------------------

    @property
    def events(self) -> tuple[LogEvent, ...]:
        return tuple(self._events)

    @property
    def event_count(self) -> int:
        return len(self._events)

    @property
    def history_bytes(self) -> int:
        """Serialised size of the mirror (what COMPACT_THRESHOLD is compared to)."""
        return self._bytes

    @property
    def state(self) -> ProtocolState:
        return (
            ProtocolState.AWAITING_TOOL_RESULTS if self._pending else ProtocolState.READY_FOR_USER
        )

    @property
    def pending_tool_calls(self) -> tuple[str, ...]:
        return tuple(self._pending)

    @property
    def used_tokens(self) -> int | None:
        """Usage of the last assistant message since the last compaction or clear, else None.

        Reset by a compaction so a pre-compaction figure cannot make compaction due again at once.
        """
        return self._used_tokens

    def logged_reply(self, *, final_after: str | None = None) -> Any:
        """The reply of the last batch, if one of its calls ran ``reply``: the ``"reply"`` of
        the last tool result after the last assistant message. A returning child's reply ends
        it after that batch, so a rebuilt child (``resume``, a restart) whose log holds one had
        replied -- its settlement, which carried the value, may never have been written (a
        full disk refused it; the control process died first). None when no call of the last
        batch replied, or when an assistant message came after the reply (the turn went on).

        ``final_after``: a nudge kind that makes a reply final (a headless trunk's
        ``self_verify``: its first reply is turned back once). The reply counts only when that
        nudge was logged in the same turn before it; a first, provisional reply does not (the
        rebuilt trunk verifies it as the dead one would have).

        The value comes back typed from ``replyValue`` (a log written before it existed, or a
        value that would not encode, gives the rendered text)."""
        reply: Any = None
        for i in range(len(self._events) - 1, -1, -1):
            ev = self._events[i]
            if reply is None:
                if ev.kind == "assistant":
                    return None
                if ev.kind == "tool_result" and isinstance(ev.data.get("reply"), str):
                    reply = reply_of(ev.data)
                    if final_after is None:
                        return reply
                continue
            if ev.kind == "nudge" and ev.data.get("nudge") == final_after:
                return reply
            if ev.kind in ("user", "steering", "cleared"):  # the turn began without it
                return None
        return None

    def can_compact(self) -> bool:
        return not self._pending

    def render_transcript(self) -> list[Message]:
        """The model's context: the mirror's messages, adjacent user-role texts merged.

        A compacted log renders its summary first, as a user message. Merging adjacent user
        messages (a summary then the suffix's first user text, a nudge then a pinned reminder)
        keeps strict role alternation for backends that demand it.
        """
        events = self._events
        out = self._rendered
        for i in range(self._rendered_upto, len(events)):
            msg = events[i].message()
            if msg is None:
                continue
            if isinstance(msg, UserMessage) and out and isinstance(out[-1], UserMessage):
                out[-1] = UserMessage(out[-1].text + "\n\n" + msg.text)
            else:
                out.append(msg)
        self._rendered_upto = len(events)
        return list(out)

    def _rerender(self) -> None:
        """The mirror changed other than by an append: the next render starts over."""
        self._rendered = []
        self._rendered_upto = 0

    # --- appending -------------------------------------------------------------------------

    def append_user(
        self, text: str, *, source: str = "user", message_id: str | None = None
    ) -> LogEvent:
        """A user-role message; ``message_id``: the id of the agent ``message`` it admits
        (``"messageId"``), which its sender's supervisor looks for (``logged_messages``)."""
        self._require_ready("a user message")
        record: dict[str, Any] = {"kind": "user", "source": source, "text": text}
        if message_id is not None:
            record["messageId"] = message_id
        return self._append(record)

    def append_nudge(self, nudge_kind: str, text: str) -> LogEvent:
        self._require_ready("a nudge")
        return self._append({"kind": "nudge", "nudge": nudge_kind, "text": text})

    def append_steering(self, text: str) -> LogEvent:
        self._require_ready("steering")
        return self._append({"kind": "steering", "text": text})

    def append_note(self, text: str, *, model_visible: bool = False) -> LogEvent:
        """A system note. A model-visible note is user-role, so it needs ReadyForUser."""
        if model_visible:
            self._require_ready("a model-visible note")
        return self._append({"kind": "note", "text": text, "model_visible": model_visible})

    def append_assistant(self, msg: AssistantMessage) -> LogEvent:
        """Append an *admitted* assistant message; its tool calls become pending."""
        self._require_ready("an assistant message")
        ids = [c.id for c in msg.tool_calls]
        if len(set(ids)) != len(ids) or any(
            not isinstance(c.arguments, dict) for c in msg.tool_calls
        ):
            raise UnadmittedMessage(
                "assistant message has non-object tool-call arguments or duplicate ids; "
                "pass it through runtime.messages.admit_assistant before appending"
            )
        ev = self._append({"kind": "assistant", "message": msg.to_dict()}, msg)
        self._pending = ids
        if msg.usage is not None:
            self._used_tokens = msg.usage.used
        return ev

    def append_tool_result(
        self, result: ToolResult, *, reply: str | None = None, value: str | None = None
    ) -> LogEvent:
        """Answer one pending call. ``reply``: the value (rendered) the call's ``reply`` gave,
        written in the same record, so the reply is durable exactly when the call's result is
        -- before the agent's settlement is attempted (:meth:`logged_reply`); ``value``: that
        value as :func:`runtime.ral.codec.encode_text` wrote it (``replyValue``), so a rebuilt
        agent replies with the value, not its text."""
        if result.tool_call_id not in self._pending:
            raise ProtocolError(
                f"a tool_result for unrequested id {result.tool_call_id!r}",
                self.state,
                self._pending,
            )
        record: dict[str, Any] = {"kind": "tool_result", "message": result.to_dict()}
        if reply is not None:
            record["reply"] = reply
            if value is not None:
                record["replyValue"] = value
        ev = self._append(record, result)
        self._pending.remove(result.tool_call_id)
        return ev

    def settle_pending(self, text: str = INTERRUPTED_RESULT) -> list[LogEvent]:
        """Answer every pending call with an error result, so the log is ReadyForUser again.

        The single exit of the drive loop and resume after a crash mid-dispatch use this: the
        next user-role append is then always admissible (turn-ends-ready).
        """
        return [
            self.append_tool_result(ToolResult(cid, text, is_error=True))
            for cid in list(self._pending)
        ]

    # --- compaction, clear, fork -------------------------------------------------------------

    def apply_compaction(self, summary: str, keep_from: int | None = None) -> LogEvent:
        """Replace the mirror's prefix ``[:keep_from]`` with ``summary``.

        ``keep_from`` defaults to :func:`runtime.fleet.compaction.suffix_start`. The breadcrumb is
        appended (acknowledged) first; only then is the prefix dropped. Raises
        :class:`CompactionRefused` with tool results pending, dropping nothing.
        """
        if not self.can_compact():
            raise CompactionRefused(
                f"cannot compact while tool results are pending ({', '.join(self._pending)}); "
                "compact at the top of apply, when the log is ReadyForUser"
            )
        n = len(self._events)
        if keep_from is None:
            keep_from = suffix_start([e.kind for e in self._events], [e.size for e in self._events])
        if not 0 <= keep_from <= n:
            raise ValueError(f"keep_from {keep_from} outside 0..{n}")
        record = {
            "kind": "compacted",
            "summary": summary,
            "dropped": keep_from,
            "dropped_bytes": sum(e.size for e in self._events[:keep_from]),
            "kept": n - keep_from,
        }
        append_jsonl(self.path, record)
        self._apply_compacted(LogEvent.of(record))
        self._used_tokens = None
        return self._events[0]

    def restart(self) -> Path | None:
        """/clear: archive the current generation and start a fresh, empty one.

        Returns the archive path (None when there was no file yet). Pending tool calls are
        forgotten with the rest: the fresh generation starts ReadyForUser.
        """
        archive: Path | None = None
        if self.path.exists():
            stem, suffix = self.path.stem, self.path.suffix  # events.jsonl -> events.<N>.jsonl
            archive = self.path.with_name(f"{stem}.{self._next_generation()}{suffix}")
            os.replace(self.path, archive)
            _fsync_dir(self.path.parent)
            durability.shipped(self.path, "rename", to=archive)
        append_jsonl(self.path, {"kind": "cleared", "archived": archive.name if archive else None})
        self._events = []
        self._rerender()
        self._bytes = 0
        self._pending = []
        self._used_tokens = None
        return archive

    def fork_context(self) -> list[LogEvent]:
        """The model-visible context a forked child imports.

        A pending, unanswered assistant tool-call frame (the parent is mid-dispatch) is dropped
        together with any partial results after it, so the child inherits a request context
        rather than a dangling provider protocol. Non-model-visible events are left out.
        """
        events = list(self._events)
        if self._pending:
            for i in range(len(events) - 1, -1, -1):
                if events[i].kind == "assistant":
                    events = events[:i]
                    break
        return [e for e in events if e.message() is not None]

    def import_context(self, events: Iterable[LogEvent]) -> None:
        """Append a parent's :meth:`fork_context` to this (fresh) log, durably."""
        for ev in events:
            if ev.kind == "compacted":
                record = {**ev.data, "dropped": 0, "dropped_bytes": 0, "kept": len(self._events)}
                append_jsonl(self.path, record)
                self._apply_compacted(LogEvent.of(record))
                continue
            if ev.kind == "assistant":
                msg = message_from_dict(ev.data["message"])
                assert isinstance(msg, AssistantMessage)
                self.append_assistant(msg)
            elif ev.kind == "tool_result":
                res = message_from_dict(ev.data["message"])
                assert isinstance(res, ToolResult)
                self.append_tool_result(res)
            else:
                self._require_ready(f"imported {ev.kind}")
                self._append(dict(ev.data))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> tuple[AgentLog, LoadReport]:
        """Rebuild the mirror from ``path`` (resume), honouring ``compacted`` breadcrumbs.

        A torn last line, a corrupt line or a record that breaks :data:`EVENT_SHAPE` is
        skipped and reported, never raised. A record that breaks the protocol (a result for an
        unrequested id, a user message while results are pending) is kept as far as it is
        harmless and reported in ``protocol_anomalies``. A log that ends mid-dispatch loads
        AwaitingToolResults: call :meth:`settle_pending`.
        """
        log = cls(path)
        read = read_jsonl(path, EVENT_SHAPE)
        report = LoadReport(records=len(read.records), damage=list(read.damage))
        for i, rec in enumerate(read.records):
            kind = rec.get("kind")
            if kind in _META_KINDS:
                continue
            ev = LogEvent.of(rec)
            if kind == "compacted":
                log._apply_compacted(ev)
                log._used_tokens = None
                continue
            try:
                msg = ev.message()
            except (KeyError, ValueError, TypeError) as e:
                report.protocol_anomalies.append(f"record {i + 1}: unreadable {kind}: {e}")
                continue
            if kind == "tool_result":
                assert isinstance(msg, ToolResult)
                if msg.tool_call_id in log._pending:
                    log._pending.remove(msg.tool_call_id)
                else:
                    report.protocol_anomalies.append(
                        f"record {i + 1}: result for unrequested id {msg.tool_call_id!r} skipped"
                    )
                    continue
            elif log._pending and (kind == "assistant" or kind in USER_ROLE_KINDS):
                report.protocol_anomalies.append(
                    f"record {i + 1}: {kind} while results pending; pending calls dropped"
                )
                log._drop_dangling_frame()
            if kind == "assistant":
                assert isinstance(msg, AssistantMessage)
                log._pending = [c.id for c in msg.tool_calls]
                if msg.usage is not None:
                    log._used_tokens = msg.usage.used
            log._events.append(ev)
            log._bytes += ev.size
        return log, report

    # --- internals ---------------------------------------------------------------------------

    def _require_ready(self, attempted: str) -> None:
        if self._pending:
            raise ProtocolError(attempted, self.state, self._pending)

    def _append(self, record: dict[str, Any], message: Message | None = None) -> LogEvent:
        """Write ``record`` and mirror it; ``message``: what it parses to (``record`` holds its
        ``to_dict``), kept so the next render does not parse it back."""
        line, size = stamped_line(record)  # one encoding for the line and the mirror's size
        durability.append(self.path, line)
        ev = LogEvent(str(record.get("kind", "")), record, size)
        if message is not None:
            ev.__dict__["_message"] = message  # what message() caches (a frozen dataclass)
        self._events.append(ev)
        self._bytes += ev.size
        return ev

    def _apply_compacted(self, ev: LogEvent) -> None:
        dropped = int(ev.data.get("dropped", 0))
        del self._events[:dropped]  # frees the prefix: the mirror holds no other reference
        self._events.insert(0, ev)
        self._rerender()
        self._bytes = sum(e.size for e in self._events)

    def _drop_dangling_frame(self) -> None:
        """Remove an unanswered assistant frame (and partial results) from the mirror's tail."""
        for i in range(len(self._events) - 1, -1, -1):
            if self._events[i].kind == "assistant":
                del self._events[i:]
                self._rerender()
                break
        self._bytes = sum(e.size for e in self._events)
        self._pending = []

    def _next_generation(self) -> int:
        archive = re.compile(rf"^{re.escape(self.path.stem)}\.(\d+){re.escape(self.path.suffix)}$")
        taken = [
            int(m.group(1))
            for p in self.path.parent.iterdir()
            if (m := archive.match(p.name)) is not None
        ]
        return max(taken, default=0) + 1


def reply_fields(value: Any) -> tuple[str, str | None]:
    """What a record keeps of a reply (:func:`reply_of` reads it back): its rendered text
    (``reply``) and the value itself (``replyValue``, None when it does not encode)."""
    return render(value), encode_text(value)


def reply_of(record: Mapping[str, Any]) -> Any:
    """The reply a record holds (an event log's ``tool_result``, the spawn journal's
    ``execution-result``): its ``replyValue`` decoded, typed as the agent gave it; else (an
    older record, a value that would not encode, a damaged one) its rendered ``reply``; None
    when it holds neither."""
    encoded = record.get("replyValue")
    if isinstance(encoded, str):
        try:
            return decode_text(encoded)
        except CodecError:
            pass  # the rendered text still says what it was
    reply = record.get("reply")
    return reply if isinstance(reply, str) else None


def event_logs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` (an agent's ``events.jsonl``) and the logs a ``/clear`` archived beside it
    (``events.<n>.jsonl``), those that exist, oldest first."""
    current = Path(path)
    if not current.parent.is_dir():
        return []
    archive = re.compile(rf"^{re.escape(current.stem)}\.(\d+){re.escape(current.suffix)}$")
    archived = sorted(
        (int(m.group(1)), p)
        for p in current.parent.iterdir()
        if (m := archive.match(p.name)) is not None
    )
    return [p for _, p in archived] + ([current] if current.exists() else [])


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable under its policy (a no-op under ``process``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        sync_for(path)(fd)
    finally:
        os.close(fd)
