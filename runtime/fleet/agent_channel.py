"""The agent-host channel protocol: every message between the control process and an agent host.

The control process keeps what is shared (registry, bus, journal, spawn site); an agent host
runs one agent and its shell. They talk through one duplex channel of length-prefixed msgpack
frames (the transport of ``actors/frames.py``; the I/O side is ``actors/channel.py``). This
module is the pure half: the message vocabulary, the codec, and the correlation of requests
with their replies.

A frame is the msgpack array ``[kind, id, reply_to, fields]``:

- ``kind`` names a message class (:data:`MESSAGE_TYPES`); ``fields`` maps its dataclass fields
  to msgpack-native values.
- ``id`` is set on a **request** (the sender waits for one reply), ``None`` otherwise.
- ``reply_to`` is set on a **reply** and names the request's ``id``.

Three classes of message, each with a reason:

- **Control frames** (:data:`CONTROL_KINDS`: steer, interrupt, cancel, shutdown) are one-way
  and bypass every mailbox: the receiving reader thread acts on them itself, so a cancel never
  waits behind the work it cancels.
- **Requests** carry a synchronous verdict: a result into a parent's inbox, a message, a slash
  command, a spawn. The producer waits for :class:`VerdictFrame` -- accepted, or the typed
  rejection (``InboxFull``, ``NameTaken``, ...) by class name and text -- so the inbox quota
  rule still reaches the producer across processes. A request that gets no reply within its
  timeout is *reported* (:class:`ReplyTimeout`), never dropped in silence, and a reply that
  arrives after its timeout is counted (:attr:`Correlator.late`).
- **Notifications** (born, died, batched bus events) need no answer.

Invariant of the codec: ``decode(encode(m)) == m`` for every message whose fields hold only
msgpack-native values, with sequences as tuples at the top level and lists inside maps
(checked by Hypothesis in ``tests/agent_host/test_agent_channel.py``). Bad bytes or an unknown
kind raise :class:`ChannelProtocolError`; nothing else escapes the decoder.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from exarch_actors.runtime.errors import ExarchError


class ChannelProtocolError(ExarchError):
    """A frame could not be decoded: bad bytes, a malformed envelope, or an unknown kind."""


class ReplyTimeout(ExarchError):
    """A request got no reply within its timeout (the request is reported, not dropped)."""

    def __init__(self, kind: str, request_id: int, timeout: float, peer: str) -> None:
        self.kind = kind
        self.request_id = request_id
        self.timeout = timeout
        self.peer = peer
        super().__init__(
            f"no reply: {peer} did not answer {kind} request #{request_id} within "
            f"{timeout:g} s; the request may still be acted on, a late reply is counted"
        )


class PeerGone(ExarchError):
    """The channel closed while a request was waiting for its reply."""

    def __init__(self, kind: str, request_id: int, peer: str, detail: str) -> None:
        self.kind = kind
        self.request_id = request_id
        self.peer = peer
        super().__init__(
            f"peer gone: {peer} closed the channel before answering {kind} #{request_id} ({detail})"
        )


# -- the vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelMessage:
    """Base of every channel message; ``KIND`` is its name on the wire."""

    KIND: ClassVar[str] = ""


# lifecycle


@dataclass(frozen=True)
class Spawn(ChannelMessage):
    """Host -> control: an agent asks the spawn site for a child (``agent NAME PROMPT``).
    A request: the reply is a :class:`VerdictFrame` (``NameTaken``, a spawn-depth refusal, ...)."""

    KIND: ClassVar[str] = "spawn"
    parent: str
    name: str
    prompt: str
    fork: bytes | None = None
    """The parent's live scope as an encoded MobileSnapshot (``agent``), or None (``spawn``)."""


@dataclass(frozen=True)
class BornFrame(ChannelMessage):
    """Host -> control: the agent and its shell are ready. ``pid`` proves it runs in its own
    process (on ``node``); ``shell_pid`` lets the supervisor kill a shell its dead host left
    behind."""

    KIND: ClassVar[str] = "born"
    agent: str
    pid: int
    shell_pid: int | None
    generation: int = 0
    node: str = "local"
    """Where the host runs: ``"local"``, or the Ray node id (``actors/ray_backend.py``)."""


@dataclass(frozen=True)
class DiedFrame(ChannelMessage):
    """Host -> control: the agent ended on its own terms (an orderly exit). A crash sends
    nothing; the control side learns of it from the channel's end of file and the exit status."""

    KIND: ClassVar[str] = "died"
    agent: str
    status: str
    """``done`` | ``cancelled`` | ``failed`` | ``shutdown``."""
    cause: str = ""


@dataclass(frozen=True)
class Shutdown(ChannelMessage):
    """Control -> host (control frame): stop the agent and its shell, then exit."""

    KIND: ClassVar[str] = "shutdown"
    reason: str = "shutdown"


# control frames: they bypass every mailbox


@dataclass(frozen=True)
class Steer(ChannelMessage):
    """Control -> host: a human message for the agent (renews its idle lease)."""

    KIND: ClassVar[str] = "steer"
    agent: str
    text: str


@dataclass(frozen=True)
class InterruptFrame(ChannelMessage):
    """Control -> host: stop the run in flight only (Esc); workers keep running."""

    KIND: ClassVar[str] = "interrupt"
    agent: str
    reason: str = "interrupt"


@dataclass(frozen=True)
class CancelFrame(ChannelMessage):
    """Control -> host: a cancel's hop reached this agent, the one frame that bridges its scope
    across the process boundary. The host puts it on its inbox's control lane, whose arrival
    trips the agent's token and its shell's eval root (the run in flight and every worker).
    A cancelled scope stays cancelled."""

    KIND: ClassVar[str] = "cancel"
    agent: str
    reason: str = "cancelled"
    sender: str | None = None
    """The node the cancel hopped from (None: from outside the tree)."""


# requests with a synchronous verdict


@dataclass(frozen=True)
class DeliverResult(ChannelMessage):
    """A child's result into its parent's inbox (either direction: the parent may live in
    another host). Reply: :class:`VerdictFrame`."""

    KIND: ClassVar[str] = "result"
    recipient: str
    child: str
    value: Any
    status: str = "done"
    generation: int = 0


@dataclass(frozen=True)
class SendMessage(ChannelMessage):
    """A model-facing ``message`` from one agent to another. Reply: :class:`VerdictFrame`."""

    KIND: ClassVar[str] = "message"
    recipient: str
    sender: str
    text: str


@dataclass(frozen=True)
class SlashCommand(ChannelMessage):
    """A slash command for the agent's turn boundary (``/clear``, ``/model``). Reply:
    :class:`VerdictFrame`."""

    KIND: ClassVar[str] = "command"
    recipient: str
    text: str


@dataclass(frozen=True)
class VerdictFrame(ChannelMessage):
    """The reply to a verdict request: accepted, or the typed rejection.

    ``rejection`` is the exception class name (``InboxFull``, ``NameTaken``, ``UnknownAgent``)
    so the producer can re-raise the same type; ``detail`` is its message text.
    """

    KIND: ClassVar[str] = "verdict"
    accepted: bool
    rejection: str | None = None
    detail: str = ""
    outcome: str = ""
    """For an accepted inbox push: ``queued`` | ``merged`` | ``replaced`` | ``duplicate``."""


@dataclass(frozen=True)
class Failed(ChannelMessage):
    """The reply to a request whose handler raised: the error's type and text (never lost)."""

    KIND: ClassVar[str] = "failed"
    error: str
    detail: str


# work, probes


@dataclass(frozen=True)
class RunScript(ChannelMessage):
    """Control -> host: run one ral script on the agent's shell. Reply: :class:`ScriptResult`."""

    KIND: ClassVar[str] = "run"
    script: str


@dataclass(frozen=True)
class ScriptResult(ChannelMessage):
    """The reply to :class:`RunScript`: the tool result as the agent would see it."""

    KIND: ClassVar[str] = "ran"
    value: str
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    error_kind: str | None = None
    epoch: int = 0
    host_pid: int | None = None


@dataclass(frozen=True)
class Ping(ChannelMessage):
    """A liveness probe; answered by the host's reader thread itself (no mailbox hop)."""

    KIND: ClassVar[str] = "ping"
    seq: int = 0


@dataclass(frozen=True)
class Pong(ChannelMessage):
    KIND: ClassVar[str] = "pong"
    seq: int = 0
    pid: int = 0


@dataclass(frozen=True)
class Probe(ChannelMessage):
    """Control -> host: read-only figures (the /resources card, the fleet view). Reply:
    :class:`ProbeReply`."""

    KIND: ClassVar[str] = "probe"
    agent: str


@dataclass(frozen=True)
class ProbeReply(ChannelMessage):
    KIND: ClassVar[str] = "probed"
    agent: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Events(ChannelMessage):
    """Host -> control: bus events (Io, Notice, ...) as their dict form, batched and flushed at
    each call boundary or every few milliseconds, so the transcript keeps one writer."""

    KIND: ClassVar[str] = "events"
    agent: str
    batch: tuple[dict[str, Any], ...] = ()


# the agent's site across the channel (actors/agent_process.py)


@dataclass(frozen=True)
class Call(ChannelMessage):
    """A request either way: one method of the other end's site by name (an explicit table on
    the receiving side), its arguments as an opaque ``payload``. Reply: :class:`ReturnFrame`.

    The payload is a pickle: both ends are this program, started from the same fork server,
    and the values that cross (inbox items, snapshots, events, typed errors) are its own
    frozen dataclasses; the envelope stays msgpack, so a bad frame is still refused by kind."""

    KIND: ClassVar[str] = "call"
    method: str
    payload: bytes = b""


@dataclass(frozen=True)
class ReturnFrame(ChannelMessage):
    """The reply to :class:`Call`: the pickled result, or the pickled typed error the handler
    raised (``InboxFull``, ``NameUsed``, ``DeskRefusal``...), re-raised in the caller."""

    KIND: ClassVar[str] = "return"
    payload: bytes = b""
    error: bytes | None = None


@dataclass(frozen=True)
class PublishFrame(ChannelMessage):
    """Host -> control: a batch of bus events (pickled), flushed at every call boundary and
    every few milliseconds; the transcript keeps one writer."""

    KIND: ClassVar[str] = "publish"
    agent: str
    payload: bytes = b""


@dataclass(frozen=True)
class Ended(ChannelMessage):
    """Host -> control: the agent's drive loop ended (an orderly end, unlike a crash): its
    outcome, reply and figures (pickled). The host then waits for :class:`Shutdown`."""

    KIND: ClassVar[str] = "ended"
    agent: str
    payload: bytes = b""


@dataclass(frozen=True)
class RecordFrame(ChannelMessage):
    """Host -> control: one durable write the host made in its node's copy of the session
    directory, for the control side to make in the real one (``runtime/state/record_mirror.py``):
    a notification under durability ``process`` (the control side writes it before it reads
    the host's next frame), a request under ``machine`` (the :class:`ReturnFrame` comes once it
    is fsync'd)."""

    KIND: ClassVar[str] = "record"
    agent: str
    op: str
    """``lines`` | ``bytes`` | ``replace`` | ``rename``."""
    path: str
    """Relative to the session root, POSIX separators."""
    data: bytes = b""
    to: str | None = None
    """A ``rename``'s new path."""


@dataclass(frozen=True)
class DiskFullFrame(ChannelMessage):
    """Host -> control: a session file the host writes could not be written for lack of space
    (``runtime/state/disk_full.py``); the host stops at once, and the control side stops the
    run with this message instead of restarting the agent."""

    KIND: ClassVar[str] = "disk-full"
    agent: str
    path: str
    reason: str
    free_bytes: int | None = None


MESSAGE_TYPES: tuple[type[ChannelMessage], ...] = (
    Spawn,
    BornFrame,
    DiedFrame,
    Shutdown,
    Steer,
    InterruptFrame,
    CancelFrame,
    DeliverResult,
    SendMessage,
    SlashCommand,
    VerdictFrame,
    Failed,
    RunScript,
    ScriptResult,
    Ping,
    Pong,
    Probe,
    ProbeReply,
    Events,
    Call,
    ReturnFrame,
    PublishFrame,
    Ended,
    RecordFrame,
    DiskFullFrame,
)
BY_KIND: dict[str, type[ChannelMessage]] = {t.KIND: t for t in MESSAGE_TYPES}
assert len(BY_KIND) == len(MESSAGE_TYPES), "two message types share a KIND"

CONTROL_KINDS: frozenset[str] = frozenset(
    {Steer.KIND, InterruptFrame.KIND, CancelFrame.KIND, Shutdown.KIND}
)
"""Kinds a reader thread dispatches itself, bypassing every mailbox and queue."""

VERDICT_KINDS: frozenset[str] = frozenset(
    {Spawn.KIND, DeliverResult.KIND, SendMessage.KIND, SlashCommand.KIND}
)
"""Requests whose reply is a :class:`VerdictFrame` (or :class:`Failed`)."""

_TUPLE_FIELDS: dict[type[ChannelMessage], frozenset[str]] = {
    t: frozenset(f.name for f in dataclasses.fields(t) if str(f.type).startswith("tuple"))
    for t in MESSAGE_TYPES
}
_FIELD_NAMES: dict[type[ChannelMessage], tuple[str, ...]] = {
    t: tuple(f.name for f in dataclasses.fields(t)) for t in MESSAGE_TYPES
}
"""Each message class's field names, in order: ``dataclasses.fields`` per frame was ~1.5 of
the ~3.6 us an encode took (a Ray host encodes about four ``RecordFrame`` a ral call)."""


@dataclass(frozen=True)
class Envelope:
    """One frame: a message with its correlation ids."""

    message: ChannelMessage
    id: int | None = None
    """Set on a request: the sender waits for exactly one reply naming it."""
    reply_to: int | None = None
    """Set on a reply: the ``id`` of the request it answers."""


# -- the codec --------------------------------------------------------------------------------


def encode(env: Envelope) -> bytes:
    """The frame body of ``env`` (the transport adds the length prefix)."""
    msg = env.message
    names = _FIELD_NAMES.get(type(msg))
    if names is None:
        raise ChannelProtocolError(f"not a channel message: {type(msg).__name__}")
    fields = {name: getattr(msg, name) for name in names}
    try:
        return msgpack.packb([msg.KIND, env.id, env.reply_to, fields], use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise ChannelProtocolError(f"{msg.KIND}: a field is not msgpack-native: {e}") from None


def decode(data: bytes) -> Envelope:
    """The envelope in ``data``; :class:`ChannelProtocolError` for anything malformed."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types on bad bytes
        raise ChannelProtocolError(f"undecodable frame ({len(data)} bytes): {e}") from None
    if not (isinstance(obj, list) and len(obj) == 4 and isinstance(obj[3], dict)):
        raise ChannelProtocolError("malformed frame: expected [kind, id, reply_to, fields]")
    kind, rid, reply_to, fields = obj
    cls = BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ChannelProtocolError(f"unknown message kind {kind!r}")
    for name, value in (("id", rid), ("reply_to", reply_to)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ChannelProtocolError(f"{kind}: {name} must be an integer or nil, got {value!r}")
    tuples = _TUPLE_FIELDS[cls]
    if tuples:  # most kinds have no tuple field: no copy of the map (a RecordFrame's decode)
        fields = {
            k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in fields.items()
        }
    try:
        msg = cls(**fields)
    except TypeError as e:
        raise ChannelProtocolError(f"{kind}: fields do not match the message: {e}") from None
    return Envelope(msg, rid, reply_to)


def rejection_of(error: BaseException) -> VerdictFrame:
    """The :class:`VerdictFrame` that carries ``error`` back to the producer as a typed
    rejection."""
    return VerdictFrame(accepted=False, rejection=type(error).__name__, detail=str(error))


# -- correlation ------------------------------------------------------------------------------


@dataclass
class Correlator:
    """Request ids and their deadlines; pure (the caller supplies ``now``), not thread-safe.

    Invariants: every id handed out by :meth:`open` leaves the table exactly once -- by a
    reply (:meth:`close` returns True), by its deadline (:meth:`expire` returns it), or by the
    channel ending (:meth:`drain` returns it). A reply for an id no longer in the table is a
    late or unknown reply: counted in :attr:`late`, never matched to a newer request (ids are
    never reused).
    """

    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _open: dict[int, tuple[str, float]] = field(default_factory=dict)
    _deadlines: list[tuple[float, int]] = field(default_factory=list)
    late: int = 0

    def open(self, kind: str, now: float, timeout: float) -> int:
        rid = next(self._ids)
        self._open[rid] = (kind, now + timeout)
        heapq.heappush(self._deadlines, (now + timeout, rid))
        return rid

    def close(self, rid: int) -> bool:
        """A reply for ``rid`` arrived: True if it was still waited for.

        Its deadline stays in the heap until :meth:`expire` passes it; once answered deadlines
        outnumber the open requests (plus a slack of 64) the heap is rebuilt from the open
        ones, so a channel that answers every request in time holds O(open) deadlines, not one
        per request it ever made."""
        if self._open.pop(rid, None) is None:
            self.late += 1
            return False
        if len(self._deadlines) > 2 * len(self._open) + 64:
            self._deadlines = [(deadline, i) for i, (_, deadline) in self._open.items()]
            heapq.heapify(self._deadlines)
        return True

    def expire(self, now: float) -> list[tuple[int, str]]:
        """The requests whose deadline passed (removed from the table), as ``(id, kind)``."""
        out: list[tuple[int, str]] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, rid = heapq.heappop(self._deadlines)
            entry = self._open.pop(rid, None)
            if entry is not None:
                out.append((rid, entry[0]))
        return out

    def drain(self) -> list[tuple[int, str]]:
        """Every open request (the channel ended), as ``(id, kind)``; the table is emptied."""
        out = [(rid, kind) for rid, (kind, _) in self._open.items()]
        self._open.clear()
        self._deadlines.clear()
        return out

    def next_deadline(self) -> float | None:
        while self._deadlines and self._deadlines[0][1] not in self._open:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def pending(self) -> Mapping[str, int]:
        """Open requests per kind (a probe)."""
        counts: dict[str, int] = {}
        for kind, _ in self._open.values():
            counts[kind] = counts.get(kind, 0) + 1
        return counts
