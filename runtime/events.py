"""Fleet bus events (``Born``, ``Died``, ``Notice``, ``Io``, ``ModelCall``, ``Resources``,
``ProviderFailed`` (kind ``ProviderError``), ``SystemNote``, and the transcript-only
``InboxRejected``, ``MessageSent`` and ``CancelHop``).

Each event is a frozen dataclass naming the agent it concerns; :meth:`Event.to_record` is the
``transcript.jsonl`` line (docs/scenarios.md: every record has ``"kind"``, ``"agent"`` and an ISO
``"at"``). Pure code builds events; only ``actors/bus.py`` writes them. ``at`` is stamped at
construction so a record's time is when the fact happened, not when a slow bus wrote it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exarch_actors.runtime.fleet.inbox import INBOX_MESSAGE_TYPES, source_of
from exarch_actors.runtime.state.durable import now_iso


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


@dataclass(frozen=True)
class Event:
    """Base of every bus event. Subclasses add fields after ``agent``."""

    agent: str
    kind: ClassVar[str] = "Event"

    def to_record(self) -> dict[str, Any]:
        """The transcript line: ``kind``, ``agent``, ``at`` first, then the event's own fields."""
        record: dict[str, Any] = {"kind": self.kind, "agent": self.agent}
        for f in dataclasses.fields(self):
            if f.name not in ("agent", "at"):
                record[f.name] = _jsonable(getattr(self, f.name))
        record["at"] = getattr(self, "at", None) or now_iso()
        return record


@dataclass(frozen=True)
class Born(Event):
    """An agent registered (trunk, fork or branch), whatever its remaining fuel."""

    parent: str | None = None
    returns: bool = False
    interactive: bool = False
    fuel: int = 0
    pid: int | None = None
    """The OS process the agent runs in (the control process's own for a thread agent)."""
    node: str = "local"
    """The machine it runs on: ``"local"``, or the Ray node id (``--backend ray``)."""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "Born"


@dataclass(frozen=True)
class Died(Event):
    """An agent ended: ``outcome`` replied | quiesced | capped | cancelled | failed.

    ``reply`` is the rendered reply of a parentless agent (the run's reply), so ``resume`` can
    rebuild ``result.json`` from the transcript; a child's reply is in the spawn journal."""

    outcome: str = "quiesced"
    cause: str | None = None
    reply: str | None = None
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "Died"


@dataclass(frozen=True)
class Notice(Event):
    """A transcript/TUI-only notice (``notice``: Prune, Reap, LargeBinding, ...).

    Never model-facing."""

    notice: str = ""
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict, hash=False)
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "Notice"


@dataclass(frozen=True)
class Io(Event):
    """One tool call and what it returned, as the transcript records it."""

    call_id: str = ""
    script: str = ""
    value: str = ""
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    seconds: float | None = None
    """How long the call ran (``at`` is its end); None for a call refused without running."""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "Io"


@dataclass(frozen=True)
class ModelCall(Event):
    """One provider round trip that returned a reply (``at`` is when it came back): what the
    trace, the report and the OpenTelemetry export show of a model request
    (``runtime/observe/``). ``operation`` is ``chat`` (a turn's step) or ``summary``
    (compaction). Tokens are None when the reply carried no usage; ``cost`` is the dollar
    amount as a decimal string, None when unknown (an unpriced model, no usage). ``attempts``
    counts transport attempts (1 + retries), ``rate_wait`` the seconds it waited in the traffic
    governor."""

    model: str = ""
    provider: str = ""
    operation: str = "chat"
    seconds: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    cost: str | None = None
    stop_reason: str = ""
    tool_calls: int = 0
    attempts: int = 1
    rate_wait: float = 0.0
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "ModelCall"


@dataclass(frozen=True)
class Resources(Event):
    """A ``/resources`` probe fold: the raw rows beside their rendered card."""

    rows: tuple[tuple[str, Any], ...] = ()
    card: str = ""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "Resources"


@dataclass(frozen=True)
class ProviderFailed(Event):
    """An exhausted transport or rate-limit failure: a provider fact, not a model nudge. Its
    record keeps the kind ``ProviderError`` that transcripts have always carried (the exception
    of that name is ``runtime.providers.base.ProviderError``)."""

    error: str = ""
    message: str = ""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "ProviderError"


@dataclass(frozen=True)
class SystemNote(Event):
    """A runtime note for the human (disk warning, ...)."""

    text: str = ""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "SystemNote"


@dataclass(frozen=True)
class InboxRejected(Event):
    """A delivery with no synchronous caller left that could not be queued.

    ``agent`` is the intended recipient; ``reason`` is ``inbox full`` (with ``source``/``cap``),
    ``stale generation`` (a result from a cleared generation) or ``recipient ended``.
    ``message`` is the undelivered message itself, so nothing is lost.
    """

    source: str = ""
    reason: str = ""
    cap: int | None = None
    total: bool = False
    sender: str | None = None
    message: dict[str, Any] = field(default_factory=dict, hash=False)
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "InboxRejected"

    @classmethod
    def of(
        cls,
        recipient: str,
        msg: object,
        *,
        reason: str,
        cap: int | None = None,
        total: bool = False,
        sender: str | None = None,
    ) -> InboxRejected:
        """Build the record for an undeliverable inbox message."""
        body = _jsonable(msg) if isinstance(msg, INBOX_MESSAGE_TYPES) else {"repr": repr(msg)}
        body = {"type": type(msg).__name__, **body}
        return cls(
            recipient,
            source=source_of(msg) or "",
            reason=reason,
            cap=cap,
            total=total,
            sender=sender,
            message=body,
        )


@dataclass(frozen=True)
class MessageSent(Event):
    """An agent ``message`` (the ral verb) its recipient's inbox took, recorded before the
    sender's call returns: the durable half of the message, which ``resume`` reads.

    ``agent`` is the recipient; ``id`` the message's (``AgentMessage.id``), which the
    recipient's event log records with it (``"messageId"``). Written straight to
    ``transcript.jsonl`` (no subscriber sees it, as ``InboxRejected``), acknowledged under the
    session's durability policy. A control process killed before the recipient logged it
    leaves this record and no log line with its id: ``resume`` delivers it again, in the order
    recorded, or records it ``InboxRejected`` (``recipient ended``) when the recipient is not
    rebuilt; the checker holds every one to that (``rejections``)."""

    sender: str = ""
    id: str = ""
    text: str = ""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "MessageSent"


@dataclass(frozen=True)
class CancelHop(Event):
    """One hop of a cancel down the spawn tree (docs/architecture.md, Cancellation).

    ``agent`` is the node the hop concerns; ``sender`` the node it came from (None: from
    outside the tree). ``phase``: ``sent`` (the sender's exit signal left for ``agent``),
    ``received`` (it arrived on ``agent``'s mailbox and tripped its scope, recorded where that
    mailbox is: an agent process records its own), or ``ended`` (every node of the subtree the
    cancel of ``agent`` reached has ended; ``sender`` then is ``agent``)."""

    sender: str | None = None
    phase: str = "sent"
    cause: str = ""
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "CancelHop"


@dataclass(frozen=True)
class Overflow(Event):
    """Delivered to one bus subscriber in place of the ``missed`` events its buffer could not
    hold; the transcript still has every one of them."""

    missed: int = 0
    at: str = field(default_factory=now_iso)
    kind: ClassVar[str] = "Overflow"
