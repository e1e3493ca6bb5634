"""The fleet bus: one durable ``transcript.jsonl`` writer fanning events out to any number of
subscribers (docs/scenarios.md, What a run leaves: ``transcript.jsonl``).

Invariants:

- every published event is appended to ``transcript.jsonl`` and acknowledged under the
  session's durability policy (written; under ``machine`` also covered by a group-commit
  fsync, waited for outside the bus lock) before any subscriber sees it, in one total order
  shared by the transcript and every subscriber;
- a slow subscriber never blocks a producer: each has a bounded buffer, and on overflow it is
  handed one :class:`runtime.events.Overflow` record counting exactly what it missed, in the
  position of the gap — never a silent drop, and the transcript still holds every event;
- a producer's events keep their order: :meth:`BusHandle.publish` appends to one ordered
  pending queue and nudges the bus actor to write it; once ``PENDING_CAP`` events wait (the
  quota-mailbox bound, 64), the producer writes the backlog and its own event itself, so a
  burst (a 1,000-node cascade's ``Died`` events) is neither lost, reordered, nor unbounded;
- under ``--durability process`` (a record is acknowledged by its ``write(2)``, no fsync to
  wait for) the producer writes the backlog and its event itself, under the bus lock, and hands
  them to the subscribers: the same order and acknowledgement without waking the bus thread,
  median 0.39 against 0.335 ms per binding-changing call through the whole stack writing
  inline (eight alternating pairs, docs/benchmarks.md); under ``machine`` the bus thread waits
  out the group commit instead of the producer;
- an agent process's event batch, handed over by the channel's reader
  (:meth:`BusHandle.publish_queued`), is queued for the bus thread under every policy: the
  reader never waits on another producer's write, and every write of the bus (a ``Died``, a
  rejection) drains the queue first, so the transcript's order is still the order of events;
- the bus actor's own mailbox is quota-checked like every actor's (its messages count as
  ``surface``); a refused proxy ``publish`` is written in the producer's thread instead;
- :func:`record_rejected` writes an ``InboxRejected`` straight to the transcript, not through
  the live bus: a rejected spawn completion has no caller left and must not keep a bus sender
  alive past its turn; :meth:`BusHandle.record_sent` writes a ``MessageSent`` the same way,
  acknowledged before the sender's ``message`` call returns.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pykka
from pykka import messages as pykka_messages

from exarch_actors.actors.mailbox import QuotaActor
from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
from exarch_actors.runtime.errors import InboxFull
from exarch_actors.runtime.events import Event, InboxRejected, MessageSent, Overflow
from exarch_actors.runtime.fleet.inbox import SURFACE
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.disk_full import DiskFull
from exarch_actors.runtime.state.durability import AppendFile
from exarch_actors.runtime.state.durable import append_jsonl, jsonl_line

if TYPE_CHECKING:
    from pykka._envelope import Envelope

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 1024
"""Events a subscriber may lag behind before it is handed an Overflow record instead."""

PENDING_CAP = INBOX_SOURCE_CAP
"""Events waiting for the bus thread before a producer writes the backlog itself."""


class Subscription:
    """One subscriber's bounded buffer. :meth:`offer` never blocks; :meth:`get` does."""

    def __init__(self, capacity: int = SUBSCRIBER_BUFFER, name: str = "subscriber") -> None:
        if capacity < 1:
            raise ValueError("a subscriber buffer holds at least one event")
        self.capacity = capacity
        self.name = name
        self._buf: deque[Event] = deque()
        self._missed = 0
        self._missed_total = 0
        self._closed = False
        self._cond = threading.Condition()

    @property
    def missed_total(self) -> int:
        """Events this subscriber never saw individually (each counted in an Overflow)."""
        with self._cond:
            return self._missed_total

    def offer(self, event: Event) -> bool:
        """Buffer ``event`` or count it as missed; never blocks. Returns whether it was kept."""
        with self._cond:
            if self._closed:
                return False
            if self._missed and len(self._buf) < self.capacity:
                self._buf.append(Overflow(event.agent, missed=self._missed))
                self._missed = 0
            if len(self._buf) >= self.capacity:
                self._missed += 1
                self._missed_total += 1
                return False
            self._buf.append(event)
            self._cond.notify_all()
            return True

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event (or Overflow record); ``None`` on timeout or once closed and empty."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._buf:
                    return self._buf.popleft()
                if self._missed:
                    missed, self._missed = self._missed, 0
                    return Overflow("", missed=missed)
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def drain(self) -> list[Event]:
        """Everything buffered now (and a trailing Overflow if events were missed)."""
        out: list[Event] = []
        while True:
            event = self.get(timeout=0)
            if event is None:
                return out
            out.append(event)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.get()
            if event is None:
                return
            yield event


class BusCore:
    """The bus state: thread-safe, callable from the bus actor or a producer's thread.

    Every write happens under one lock, pending events first, so the transcript and every
    subscriber see one order that extends each producer's own order. That lock covers only
    the ``write(2)``: under ``machine`` durability the wait for the group-commit fsync happens
    after it is released (:meth:`_settle`), so no producer queues behind another's fsync, and
    subscribers are handed events in that same order once the fsync that covers them ended.
    """

    def __init__(
        self, transcript: str | os.PathLike[str] | None, *, pending_cap: int = PENDING_CAP
    ) -> None:
        self.transcript = Path(transcript) if transcript is not None else None
        self.pending_cap = pending_cap
        self._lock = threading.RLock()  # the writes: transcript order, _seq, _written
        self._queue = threading.Lock()  # _pending alone: queueing never waits behind a write
        self._pending: deque[Event] = deque()
        self._written: deque[tuple[int, Event]] = deque()  # written, not yet handed out
        self._deliver = threading.Lock()  # hands out _written in order; never across an fsync
        self._subs: list[Subscription] = []
        self._seq = 0
        self._ticket = 0
        self._writer: AppendFile | None = None
        self.published = 0

    def submit(self, event: Event) -> bool:
        """Queue ``event`` for the bus thread; return False if it was written here instead
        (the pending queue was at its cap, so this producer wrote the backlog itself).
        Queueing takes only the queue's lock, never held across a ``write(2)``."""
        with self._queue:
            if len(self._pending) < self.pending_cap:
                self._pending.append(event)
                return True
        with self._lock:
            self._drain_locked(event)
            upto, ticket = self._seq, self._ticket
        self._settle(upto, ticket)
        return False

    def writes_inline(self) -> bool:
        """Whether a producer writes its own event: the transcript is held by a bound writer
        whose policy acknowledges a record at its ``write(2)`` (see the module docstring)."""
        writer = self._writer
        if writer is None and self.transcript is not None:
            writer = durability.writer_for(self.transcript)
        return writer is not None and writer.policy is durability.Durability.PROCESS

    def drain(self) -> int:
        """Write every pending event; return how many."""
        with self._lock:
            n, _ = self._drain_locked()
            upto, ticket = self._seq, self._ticket
        self._settle(upto, ticket)
        return n

    def write_aside(self, write: Callable[[Path], object]) -> None:
        """Run ``write`` of a record that bypasses the bus (a rejection) under the write lock,
        after the queue is written: the transcript keeps the order in which things happened
        even while producers' events wait in the queue."""
        assert self.transcript is not None
        with self._lock:
            self._drain_locked()
            upto, ticket = self._seq, self._ticket
            write(self.transcript)
        self._settle(upto, ticket)

    def publish(self, event: Event) -> dict[str, Any]:
        """Write the backlog, then ``event``, now; return ``event``'s record once it is
        acknowledged under the transcript's durability policy."""
        with self._lock:
            _, record = self._drain_locked(event)
            upto, ticket = self._seq, self._ticket
        self._settle(upto, ticket)
        assert record is not None
        return record

    def _drain_locked(self, event: Event | None = None) -> tuple[int, dict[str, Any] | None]:
        """Under the write lock: take the queue whole and write it, then ``event``, in one
        ``write(2)``; return how many were written and ``event``'s record. The queue's lock is
        not held across the write, so producers queue meanwhile (what they queue is written
        by the next drain: nothing else writes until the write lock is released). One write a
        batch, not one an event: every ``write(2)`` gives the GIL away, and a bus lock held
        across many of them, each waiting for the GIL to come back among the control
        process's threads, held every inline publisher (a ``Died``) for 59 ms on average,
        up to 2.4 s, at the end of a 200-agent run. A write that fails puts the queue back
        as it was (nothing of it counted as published) and raises; one that failed midway
        (``ENOSPC``) leaves nothing of the batch in the file (its writer cuts the fragment off
        again, ``runtime/state/disk_full.py``), so the retry writes each line once."""
        with self._queue:
            batch, self._pending = self._pending, deque()
        events = [*batch, event] if event is not None else list(batch)
        if not events:
            return 0, None
        records = [e.to_record() for e in events]
        try:
            self._write_records(records)
        except BaseException:
            with self._queue:
                self._pending.extendleft(reversed(batch))
            raise
        for e in events:
            self._seq += 1
            self._written.append((self._seq, e))
        self.published += len(events)
        return len(events), records[-1] if event is not None else None

    def _write_records(self, records: list[dict[str, Any]]) -> None:
        if self.transcript is None:
            return
        writer = self._writer or durability.writer_for(self.transcript)
        if writer is None:
            for record in records:
                append_jsonl(self.transcript, record)
            return
        self._writer = writer
        self._ticket = writer.write(b"".join(jsonl_line(r)[1] for r in records))

    def _settle(self, upto: int, ticket: int) -> None:
        """Wait (no bus lock held) until the transcript's fsync covers ``ticket`` under
        ``machine``, then hand every written event up to ``upto`` to the subscribers, in order."""
        if self._writer is not None:
            self._writer.wait(ticket)
        with self._deliver:
            while self._written and self._written[0][0] <= upto:
                event = self._written.popleft()[1]
                for sub in self._subs:
                    sub.offer(event)

    def subscribe(
        self, capacity: int = SUBSCRIBER_BUFFER, name: str = "subscriber"
    ) -> Subscription:
        sub = Subscription(capacity, name)
        with self._deliver:
            self._subs = [*self._subs, sub]
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._deliver:
            self._subs = [s for s in self._subs if s is not sub]
        sub.close()

    def close(self) -> None:
        self.drain()
        with self._deliver:
            subs, self._subs = self._subs, []
        for sub in subs:
            sub.close()


def record_rejected(transcript: str | os.PathLike[str], event: InboxRejected) -> dict[str, Any]:
    """Write an ``InboxRejected`` straight to ``transcript.jsonl``, bypassing the bus."""
    return append_jsonl(transcript, event.to_record())


@dataclass(frozen=True)
class Publish:
    """Publish one event (the tell form of ``bus.proxy().publish``)."""

    event: Event


@dataclass(frozen=True)
class Drain:
    """Write the pending queue; sent by :meth:`BusHandle.publish`."""


class Bus(QuotaActor):
    """The fleet bus actor; its messages count against the ``surface`` quota."""

    call_source: ClassVar[str] = SURFACE

    def __init__(self, core: BusCore | str | os.PathLike[str] | None) -> None:
        super().__init__()
        self.core = core if isinstance(core, BusCore) else BusCore(core)

    def mailbox_recipient(self) -> str:
        return "bus"

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Publish):
            return self.core.publish(message.event)
        if isinstance(message, Drain):
            try:
                return self.core.drain()
            except DiskFull:  # the queue is kept whole; the latch stops the run
                return 0
        return super().on_receive(message)

    def serves_at_stop(self, message: Any) -> bool:
        """Publishes queued behind a stop are still written: the transcript loses nothing."""
        return isinstance(message, Publish | Drain) or (
            isinstance(message, pykka_messages.ProxyCall) and message.attr_path == ("publish",)
        )

    def on_stop(self) -> None:
        self.core.close()

    def on_mailbox_full(self, envelope: Envelope[Any], full: InboxFull) -> bool:
        """A refused publish is written in the producer's thread instead (after the backlog,
        so order holds); a refused Drain is redundant — the queued ones write everything."""
        message = envelope.message
        if isinstance(message, Drain):
            if envelope.reply_to is not None:
                envelope.reply_to.set(0)
            return True
        if isinstance(message, Publish):
            event: Any = message.event
        elif (
            isinstance(message, pykka_messages.ProxyCall)
            and message.attr_path == ("publish",)
            and message.args
        ):
            event = message.args[0]
        else:
            return False
        if not isinstance(event, Event):
            return False
        record = self.core.publish(event)
        if envelope.reply_to is not None:
            envelope.reply_to.set(record)
        return True

    def publish(self, event: Event) -> dict[str, Any]:
        """Proxy-call form of :class:`Publish` (``bus.proxy().publish(event)``)."""
        return self.core.publish(event)

    def subscribe(
        self, capacity: int = SUBSCRIBER_BUFFER, name: str = "subscriber"
    ) -> Subscription:
        return self.core.subscribe(capacity, name)

    def unsubscribe(self, sub: Subscription) -> None:
        self.core.unsubscribe(sub)


@dataclass(frozen=True)
class BusHandle:
    """What :func:`start_bus` returns. ``publish`` never blocks on subscribers, never loses an
    event and never reorders one producer's events."""

    ref: pykka.ActorRef[Bus]
    core: BusCore

    def publish(self, event: Event) -> None:
        if self.core.writes_inline():
            self.core.publish(event)
            return
        if not self.core.submit(event):
            return  # written in this thread: the backlog was at its cap
        self._nudge()

    def publish_queued(self, events: Iterable[Event]) -> None:
        """Publish ``events`` (one producer's, in order) through the bus thread whatever the
        policy: queued, and the bus thread nudged once. For a producer that never needs its
        record back and must not wait on other producers' writes: a channel reader handing
        over an agent process's event batch. Written inline under ``process``, the readers of
        200 agent processes (one batch per ral call each) queued on the bus lock for 75 ms on
        average, up to 3.7 s, each ``write(2)`` made under the lock giving the GIL away to
        another thread mid-write -- and every frame behind a waiting reader waited with it
        (an agent's ``Ended`` among them: the ends of a 200-agent run settled over ~0.8 s with
        the cores 35-45 % idle; docs/benchmarks.md). Every write of the bus drains the queue
        first, so a ``Died`` or a rejection written inline still comes after them."""
        queued = False
        for event in events:
            queued = self.core.submit(event) or queued
        if queued:
            self._nudge()

    def _nudge(self) -> None:
        try:
            self.ref.tell(Drain())  # a full mailbox already holds drains that write it
        except pykka.ActorDeadError:
            self.core.drain()

    def subscribe(
        self, capacity: int = SUBSCRIBER_BUFFER, name: str = "subscriber"
    ) -> Subscription:
        return self.core.subscribe(capacity, name)

    def unsubscribe(self, sub: Subscription) -> None:
        self.core.unsubscribe(sub)

    def record_rejected(self, event: InboxRejected) -> None:
        """Durable-only record of a rejected spawn completion or surfaced batch."""
        if self.core.transcript is None:
            log.warning("rejected with no transcript: %s", event.to_record())
            return
        self.core.write_aside(lambda path: record_rejected(path, event))

    def record_sent(self, event: MessageSent) -> None:
        """Durable-only record of an agent ``message`` its recipient's inbox took, written in
        this thread after everything queued and acknowledged under the transcript's policy
        before it returns (what ``resume`` delivers again: ``runtime/events.py``)."""
        if self.core.transcript is None:
            return
        self.core.write_aside(lambda path: append_jsonl(path, event.to_record()))

    def flush(self) -> None:
        """Write everything published so far, in this thread."""
        self.core.drain()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the bus; everything published or queued is written first."""
        self.ref.stop(block=True, timeout=timeout)
        self.core.close()


def start_bus(transcript: str | os.PathLike[str] | None) -> BusHandle:
    """Start the fleet bus writing ``transcript`` (``None``: subscribers only)."""
    core = BusCore(transcript)
    return BusHandle(Bus.start(core), core)
