"""The inbox rule: one shared admission rule for every agent inbox and every actor mailbox.

Sources split in two:

- ``user``, ``schedule`` and ``nudge`` are idempotent: a push always succeeds and *coalesces*
  instead of growing the queue. A :class:`ScheduledWakeup` replaces a still-queued wakeup with the
  same schedule id in place (newest wins); a :class:`UserSteering` merges into a queued steering
  that is the queue's tail with a blank line, unless either side holds a line starting with
  ``/`` (merging would silently change that line's turn-boundary classification); an
  exact-duplicate :class:`InboxNudge` is a no-op.
- ``agent_result``, ``agent_message``, ``command`` and ``surface`` are quota-checked against
  ``INBOX_SOURCE_CAP`` per source and ``INBOX_TOTAL_CAP`` over the whole queue, and *rejected,
  never dropped*: :class:`runtime.errors.InboxFull` goes back to the producer and the queue is
  left exactly as it was.

:class:`InboxRule` is pure and thread-agnostic; it can carry an opaque ``tag`` per entry so the
actor mailbox (``actors/mailbox.py``) can queue pykka envelopes under the same rule.
:class:`Inbox` is the thread-safe wrapper an agent's drive loop blocks on.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exarch_actors.runtime.constants import INBOX_SOURCE_CAP, INBOX_TOTAL_CAP
from exarch_actors.runtime.errors import InboxFull

USER = "user"
SCHEDULE = "schedule"
NUDGE = "nudge"
AGENT_RESULT = "agent_result"
AGENT_MESSAGE = "agent_message"
COMMAND = "command"
SURFACE = "surface"

IDEMPOTENT_SOURCES: frozenset[str] = frozenset({USER, SCHEDULE, NUDGE})
SOURCES: tuple[str, ...] = (USER, SCHEDULE, NUDGE, AGENT_RESULT, AGENT_MESSAGE, COMMAND, SURFACE)


# --- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserSteering:
    """A human message delivered to one agent (the only thing that renews its idle lease)."""

    text: str
    source: ClassVar[str] = USER

    @property
    def is_slash(self) -> bool:
        return has_slash_line(self.text)


@dataclass(frozen=True)
class ScheduledWakeup:
    """A self-schedule firing; at most one per schedule id is ever queued."""

    schedule_id: str
    prompt: str
    source: ClassVar[str] = SCHEDULE


@dataclass(frozen=True)
class InboxNudge:
    """A runtime nudge (must_reply, continue, pin reminder, ...)."""

    kind: str
    text: str
    source: ClassVar[str] = NUDGE


@dataclass(frozen=True)
class AgentResult:
    """A child's completion routed to its parent: the child's reply value and its status."""

    child: str
    value: Any
    status: str = "done"
    generation: int = 0
    source: ClassVar[str] = AGENT_RESULT


@dataclass(frozen=True)
class AgentMessage:
    """A model-facing ``message`` from another agent; renews nothing."""

    sender: str
    text: str
    id: str = field(default="", compare=False)
    """Unique per ``message`` call (the registry gives it; compared by nobody): the recipient's
    event log records it with the message, so a supervisor that sent it to an agent process
    can tell whether the log holds it (``actors/agent_process.py``: a process SIGKILLed before
    it logged the message took it along, and its restart is given it again)."""
    source: ClassVar[str] = AGENT_MESSAGE


@dataclass(frozen=True)
class Command:
    """A slash command routed to the agent's turn boundary (``/clear``, ``/resources``, ...)."""

    text: str
    source: ClassVar[str] = COMMAND


@dataclass(frozen=True)
class Surface:
    """Surfaced items for the agent's next turn: a ral worker's completion (its value or error,
    digested), stamped with the generation of the park that watched it. Reaps are never
    surfaced: they stay in the transcript."""

    batch: tuple[Any, ...]
    generation: int = 0
    source: ClassVar[str] = SURFACE


@dataclass(frozen=True)
class ExitSignal:
    """A cancel travelling down the spawn tree, the way an OTP exit signal travels a link:
    ``sender`` (None: from outside the tree -- a command, a lease, the budget) was cancelled,
    with ``cause``, so the recipient -- whoever's mailbox it is put on -- is. It rides the
    control lane of the recipient's :class:`Inbox` (:meth:`Inbox.signal`): never
    quota-checked, served ahead of every queued turn, and its arrival hook trips the
    recipient's scope in the sender's thread. Like OTP's ``{'EXIT', From, Reason}`` it does
    not name its recipient, so one signal serves every child of its sender: one object per
    sender rather than per hop (a frozen dataclass costs ~1.5 us to make, a third of the
    1,000-node cascade's hop, docs/benchmarks.md)."""

    sender: str | None
    cause: str
    source: ClassVar[str] = "control"


InboxMsg = (
    UserSteering | ScheduledWakeup | InboxNudge | AgentResult | AgentMessage | Command | Surface
)
INBOX_MESSAGE_TYPES: tuple[type, ...] = (
    UserSteering,
    ScheduledWakeup,
    InboxNudge,
    AgentResult,
    AgentMessage,
    Command,
    Surface,
)


def has_slash_line(text: str) -> bool:
    """Whether any line of ``text`` starts with ``/`` (a slash command line)."""
    return any(line.startswith("/") for line in text.split("\n"))


def source_of(msg: object) -> str | None:
    """The inbox source of an inbox message, or ``None`` for anything else."""
    if isinstance(msg, INBOX_MESSAGE_TYPES):
        return str(msg.source)  # type: ignore[attr-defined]
    return None


# --- the pure rule ----------------------------------------------------------------------------


class PushEffect(enum.Enum):
    """What a successful push did to the queue."""

    QUEUED = "queued"  # a new entry at the tail
    MERGED = "merged"  # steering folded into the tail steering entry
    REPLACED = "replaced"  # a queued wakeup with the same schedule id took the new prompt
    DUPLICATE = "duplicate"  # an equal nudge is already queued: no-op


@dataclass
class _Entry:
    source: str
    item: Any
    tag: Any = None


@dataclass(frozen=True)
class Pushed:
    """Result of :meth:`InboxRule.push`.

    ``absorbed`` lists the tags of entries that will never be popped on their own because the
    push coalesced them away (the replaced wakeup's tag, or the new push's own tag when it merged
    or was a duplicate). A mailbox resolves their reply futures; an agent inbox ignores them.
    """

    outcome: PushEffect
    absorbed: tuple[Any, ...] = ()


@dataclass
class InboxRule:
    """The admission rule over one queue; pure, FIFO, not thread-safe.

    Invariants (checked by the Hypothesis model in ``tests/fleet/test_inbox_model.py``):
    every quota-source count stays ``<= source_cap``; a quota push is accepted iff its source
    count is below ``source_cap`` and the total depth below ``total_cap``; a rejected push leaves
    the queue unchanged; no accepted message is ever lost except by the three coalescing rules.
    """

    source_cap: int = INBOX_SOURCE_CAP
    total_cap: int = INBOX_TOTAL_CAP
    recipient: str | None = None
    _queue: deque[_Entry] = field(default_factory=deque, repr=False)
    _counts: dict[str, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self._queue)

    def depths(self) -> dict[str, int]:
        """Queued entries per source, every source present (a probe: never mutates)."""
        return {s: self._counts.get(s, 0) for s in self._sources()}

    def _sources(self) -> Iterable[str]:
        extra = [s for s in self._counts if s not in SOURCES]
        return (*SOURCES, *extra)

    def admissible(self, source: str) -> InboxFull | None:
        """The rejection a push from ``source`` would get now, or ``None``."""
        if source in IDEMPOTENT_SOURCES:
            return None
        if self._counts.get(source, 0) >= self.source_cap:
            return InboxFull(source, self.source_cap, recipient=self.recipient)
        if len(self._queue) >= self.total_cap:
            return InboxFull(source, self.total_cap, total=True, recipient=self.recipient)
        return None

    def push(self, item: Any, *, source: str | None = None, tag: Any = None) -> Pushed:
        """Admit ``item`` or raise :class:`InboxFull` (queue untouched).

        ``source`` defaults to the item's own source; a non-inbox item (an actor call) must name
        one. Coalescing applies only to the idempotent message types.
        """
        src = source if source is not None else source_of(item)
        if src is None:
            raise TypeError(f"no inbox source for {type(item).__name__}; pass source=")
        if src in IDEMPOTENT_SOURCES:
            coalesced = self._coalesce(item, tag)
            if coalesced is not None:
                return coalesced
        else:
            refusal = self.admissible(src)
            if refusal is not None:
                raise refusal
        self._append(_Entry(src, item, tag))
        return Pushed(PushEffect.QUEUED)

    def push_exempt(self, item: Any, *, source: str, tag: Any = None) -> None:
        """Queue ``item`` at the tail with no quota check and no coalescing.

        For the one message a mailbox may neither refuse nor reorder: pykka's stop, which is
        served after the work queued before it. It counts in the depth like any other entry.
        """
        self._append(_Entry(source, item, tag))

    def _coalesce(self, item: Any, tag: Any) -> Pushed | None:
        if isinstance(item, ScheduledWakeup):
            for entry in self._queue:
                old = entry.item
                if isinstance(old, ScheduledWakeup) and old.schedule_id == item.schedule_id:
                    old_tag = entry.tag
                    entry.item, entry.tag = item, tag
                    return Pushed(PushEffect.REPLACED, (old_tag,))
            return None
        if isinstance(item, UserSteering):
            if not self._queue:
                return None
            tail = self._queue[-1]
            if isinstance(tail.item, UserSteering) and not tail.item.is_slash and not item.is_slash:
                tail.item = UserSteering(f"{tail.item.text}\n\n{item.text}")
                return Pushed(PushEffect.MERGED, (tag,))
            return None
        if isinstance(item, InboxNudge):
            for entry in self._queue:
                if entry.item == item:
                    return Pushed(PushEffect.DUPLICATE, (tag,))
            return None
        return None

    def _append(self, entry: _Entry) -> None:
        self._queue.append(entry)
        self._counts[entry.source] = self._counts.get(entry.source, 0) + 1

    def _forget(self, entry: _Entry) -> None:
        n = self._counts[entry.source] - 1
        if n:
            self._counts[entry.source] = n
        else:
            del self._counts[entry.source]

    def pop(self) -> Any | None:
        """The oldest item, or ``None`` when empty."""
        popped = self.pop_entry()
        return None if popped is None else popped[0]

    def pop_entry(self) -> tuple[Any, Any] | None:
        """The oldest ``(item, tag)``, or ``None`` when empty."""
        if not self._queue:
            return None
        entry = self._queue.popleft()
        self._forget(entry)
        return entry.item, entry.tag

    def peek(self) -> Any | None:
        return self._queue[0].item if self._queue else None

    def items(self) -> list[Any]:
        """A copy of the queued items, oldest first (for probes and tests)."""
        return [e.item for e in self._queue]

    def drain_steering(self) -> list[UserSteering]:
        """Remove and return the queued non-slash steering that precedes any slash steering.

        Tool-boundary steering: a plain human message joins the running turn after the tool
        results, while a slash line waits for its turn boundary. Steering queued *after* a slash
        line stays queued so the human's order is kept.
        """
        taken: list[UserSteering] = []
        kept: deque[_Entry] = deque()
        blocked = False
        for entry in self._queue:
            item = entry.item
            if isinstance(item, UserSteering) and not blocked:
                if item.is_slash:
                    blocked = True
                    kept.append(entry)
                else:
                    taken.append(item)
                    self._forget(entry)
                continue
            kept.append(entry)
        self._queue = kept
        return taken

    def take(self, wanted: Callable[[Any], bool]) -> list[Any]:
        """Remove and return the queued items ``wanted`` selects, oldest first; the rest keep
        their order. A removal frees quota and admits nothing, so the admission rule holds
        (``agent-wait`` takes the results it returns, never to be delivered twice)."""
        taken: list[Any] = []
        kept: deque[_Entry] = deque()
        for entry in self._queue:
            if wanted(entry.item):
                taken.append(entry.item)
                self._forget(entry)
            else:
                kept.append(entry)
        self._queue = kept
        return taken

    def clear(self) -> list[tuple[Any, Any]]:
        """Remove everything (an inbox being torn down); return what was queued."""
        out = [(e.item, e.tag) for e in self._queue]
        self._queue.clear()
        self._counts.clear()
        return out


# --- the thread-safe inbox ----------------------------------------------------------------------

WAKE_TIMEOUT = 0.25
"""Backstop between park-verdict reads. Every verdict change that matters is an explicit wake
(a push, a cascade, a child deregistering), so this only bounds a missed one; one verdict read
(three registry reads, five children) measured 5 µs, so 100 parked agents at 4 reads/s spend
0.2% of a core."""


class Inbox:
    """An agent's inbox: :class:`InboxRule` behind a Condition.

    ``push`` never blocks (it either admits or raises :class:`InboxFull`); consumers block in
    :meth:`pop` or :meth:`next_or_idle`. :meth:`wake` lets a canceller make a parked consumer
    re-evaluate its park verdict at once.
    """

    def __init__(
        self,
        *,
        recipient: str | None = None,
        source_cap: int = INBOX_SOURCE_CAP,
        total_cap: int = INBOX_TOTAL_CAP,
    ) -> None:
        self._rule = InboxRule(source_cap, total_cap, recipient)
        self._cond = threading.Condition()
        self._wakes = 0
        self._signals: deque[ExitSignal] = deque()
        """The control lane: exit signals, taken before any queued turn."""
        self._waiting = 0
        """Consumers blocked on the condition: a signal or a wake with none notifies nobody
        (``notify_all`` is Python code, ~1 us of a cascade's ~3 us hop)."""
        self._on_signal: Callable[[ExitSignal], None] | None = None

    # -- the control lane --

    def bind_signal(self, hook: Callable[[ExitSignal], None] | None) -> None:
        """What a signal's arrival does, in the sender's thread at put time (its owner's scope
        tripped while its consumer may be busy in a long turn)."""
        self._on_signal = hook

    def signal(self, sig: ExitSignal) -> None:
        """Put ``sig`` on the control lane: never refused (no quota counts it), served ahead of
        every queued turn, its arrival hook run here first, and every parked consumer woken."""
        hook = self._on_signal
        if hook is not None:
            hook(sig)
        with self._cond:
            self._signals.append(sig)
            self._wakes += 1
            if self._waiting:
                self._cond.notify_all()

    def signals(self) -> list[ExitSignal]:
        """The signals queued on the control lane (a probe; never mutates)."""
        with self._cond:
            return list(self._signals)

    def _next_locked(self) -> InboxMsg | ExitSignal | None:
        if self._signals:
            return self._signals.popleft()
        item: InboxMsg | None = self._rule.pop()
        return item

    @property
    def recipient(self) -> str | None:
        return self._rule.recipient

    def push(self, msg: InboxMsg) -> PushEffect:
        """Admit ``msg`` or raise :class:`InboxFull` naming source, cap and recipient."""
        with self._cond:
            outcome = self._rule.push(msg).outcome
            self._cond.notify_all()
        return outcome

    def pop(self, timeout: float | None = None) -> InboxMsg | ExitSignal | None:
        """The next message (a signal first, else the oldest turn), waiting up to ``timeout``
        seconds (``None``: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not len(self._rule) and not self._signals:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._waiting += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
            return self._next_locked()

    def try_pop(self) -> InboxMsg | None:
        """The oldest queued turn, if any (the control lane is not a turn: left alone)."""
        with self._cond:
            item: InboxMsg | None = self._rule.pop()
            return item

    def next_or_idle(
        self,
        park_verdict_fn: Callable[[], Any],
        wake_timeout: float = WAKE_TIMEOUT,
    ) -> InboxMsg | ExitSignal | None:
        """The next message -- a signal of the control lane ahead of every queued turn -- or
        ``None`` once the park verdict says the agent should end.

        ``park_verdict_fn`` returns a :class:`runtime.fleet.park.ParkMode`; anything other than
        ``QUIESCE`` keeps the agent parked. The verdict is re-evaluated on *every* wake — a push,
        a :meth:`wake` (a cancel, a child settling) or ``wake_timeout`` passing — and always
        outside the inbox lock, since it reads the registry, whose writers push into inboxes.
        """
        from exarch_actors.runtime.fleet.park import (
            ParkMode,  # local: park imports nothing from here
        )

        while True:
            with self._cond:
                item = self._next_locked()
                if item is not None:
                    return item
                seen = self._wakes
            if park_verdict_fn() is ParkMode.QUIESCE:
                with self._cond:  # a message that raced the verdict still wins
                    return self._next_locked()
            with self._cond:
                if not len(self._rule) and not self._signals and self._wakes == seen:
                    self._waiting += 1
                    try:
                        self._cond.wait(wake_timeout)
                    finally:
                        self._waiting -= 1

    def wake(self) -> None:
        """Make every parked consumer re-evaluate its verdict now."""
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()

    def depths(self) -> dict[str, int]:
        """Queued messages per source (a probe; never mutates, never renews a lease)."""
        with self._cond:
            return self._rule.depths()

    def drain_steering(self) -> list[UserSteering]:
        with self._cond:
            return self._rule.drain_steering()

    def take(self, wanted: Callable[[Any], bool]) -> list[InboxMsg]:
        """Remove and return the queued items ``wanted`` selects (:meth:`InboxRule.take`)."""
        with self._cond:
            return self._rule.take(wanted)

    def items(self) -> list[InboxMsg]:
        with self._cond:
            return self._rule.items()

    def __len__(self) -> int:
        with self._cond:
            return len(self._rule)
