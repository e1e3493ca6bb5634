"""The quota mailbox: the inbox rule (``runtime/fleet/inbox.py``) installed as every pykka actor's
inbox.

pykka 4.5 builds an actor's inbox with ``_create_actor_inbox()`` and only ever calls ``put``,
``get`` and ``empty`` on it (``pykka._actor.ActorInbox``), so a :class:`QuotaMailbox` is a
``queue.Queue`` look-alike with two lanes:

- the **control lane** — :class:`Cancel`, :class:`Interrupt` and any proxy call to a method the
  actor lists in ``control_methods``. Never quota-checked, always served before queued work,
  and the actor's control hook runs *in the producer's thread at put time*, so a cancel trips
  the cooperative token while the actor may still be busy in a long handler.
- the **work lane** — everything else, admitted by :class:`runtime.fleet.inbox.InboxRule`. Inbox
  messages keep their own source (and coalesce as the rule says); any other message (a proxy
  call, a plain ``tell``) counts against the actor's ``call_source`` (``command`` by default).
  A refused message raises :class:`runtime.errors.InboxFull` out of the sender's ``tell``/
  ``ask``/proxy call and is never queued: rejected to the sender, never dropped.

pykka's stop keeps pykka's contract: it travels the work lane in FIFO order (source ``stop``,
never quota-checked, never coalesced), so it is served after every message queued before it,
and it trips no token (a stop is not a cancel: send :class:`Cancel` first to abort the work).
What is queued behind a stop is settled when it is served (``QuotaActor._stop``), and once the
actor's thread has settled its last envelope the mailbox is closed: an ask put later is
answered ``ActorDeadError`` at once, never left waiting. pykka's own suite runs against this
mailbox in ours (``tests/pykka_contract/``).

Subclass :class:`QuotaActor` instead of ``pykka.ThreadingActor``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pykka
from pykka import messages as pykka_messages

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.constants import INBOX_SOURCE_CAP, INBOX_TOTAL_CAP
from exarch_actors.runtime.errors import InboxFull
from exarch_actors.runtime.fleet.inbox import COMMAND, InboxRule, PushEffect, source_of

if TYPE_CHECKING:
    from pykka._envelope import Envelope

log = logging.getLogger(__name__)

CONTROL = "control"
"""The mailbox lane of messages that are never quota-checked and jump the queue."""

STOP = "stop"
"""The work-lane source of pykka's stop: never quota-checked, served in FIFO order."""

_ActorStop: type = pykka_messages._ActorStop  # pykka's stop payload (private, stable since 2.0)


@dataclass(frozen=True)
class Cancel:
    """Cancel the receiving actor's cooperative token (a terminate-class cause)."""

    cause: str = "cancelled"


@dataclass(frozen=True)
class Interrupt:
    """Stop the receiving actor's current turn only (Esc / Ctrl-C on its tab)."""

    reason: str = "interrupt"


@dataclass(frozen=True)
class Coalesced:
    """The reply an ``ask`` gets when its message was folded into a queued one by the rule."""

    outcome: PushEffect


def _refuse(envelope: Envelope[Any]) -> None:
    """An envelope put after its actor's mailbox closed: an ask is answered ``ActorDeadError``
    (what pykka raises for a put to a dead actor), a tell is logged (the actor's
    ``on_undelivered`` has run its last)."""
    if envelope.reply_to is not None:
        _answer_dead(envelope.reply_to, "the actor stopped before the message was put")
    elif not isinstance(envelope.message, (*_CONTROL_TYPES, _ActorStop)):  # those: moot
        log.warning("a stopped actor's closed mailbox refused %r", envelope.message)


def _answer_dead(reply_to: Any, why: str) -> None:
    """Answer an ask ``ActorDeadError``, as pykka does for an actor that is gone."""
    dead = pykka.ActorDeadError(why)
    reply_to.set_exception(exc_info=(pykka.ActorDeadError, dead, None))


def _resolve_absorbed(envelopes: tuple[Any, ...], outcome: PushEffect) -> None:
    for env in envelopes:
        reply_to = getattr(env, "reply_to", None)
        if reply_to is not None:
            try:
                reply_to.set(Coalesced(outcome))
            except queue.Full:
                pass  # a pykka future holds one value: it was already answered, nothing is lost


class QuotaMailbox:
    """A two-lane, quota-checked stand-in for ``queue.Queue`` (see the module docstring)."""

    def __init__(
        self,
        *,
        source_cap: int = INBOX_SOURCE_CAP,
        total_cap: int = INBOX_TOTAL_CAP,
        recipient: str | None = None,
    ) -> None:
        self._rule = InboxRule(source_cap, total_cap, recipient)
        self._control: deque[Envelope[Any]] = deque()
        self._cond = threading.Condition()
        self._classify: Callable[[Any], str] = default_classify
        self._on_control: Callable[[Any], None] | None = None
        self._on_full: Callable[[Envelope[Any], InboxFull], bool] | None = None
        self._closed = False

    def close(self) -> None:
        """Admit nothing more: the owner's thread settles what is queued after this and ends.

        pykka checks that an actor is alive before it puts a message; a sender preempted
        between that check and its put (an agent process's threads are in the idle class
        after its end) put an ask after the actor's last settle, and waited its whole timeout
        (10 s, a shell's close) for an answer nobody would give. After this, every put is
        refused at once (:func:`_refuse`)."""
        with self._cond:
            self._closed = True

    def bind(
        self,
        *,
        classify: Callable[[Any], str] | None = None,
        on_control: Callable[[Any], None] | None = None,
        on_full: Callable[[Envelope[Any], InboxFull], bool] | None = None,
        recipient: str | None = None,
    ) -> None:
        """Attach the owning actor's classifier and hooks (called from its ``__init__``)."""
        if classify is not None:
            self._classify = classify
        self._on_control = on_control
        self._on_full = on_full
        if recipient is not None:
            self._rule.recipient = recipient

    # -- the queue.Queue surface pykka uses --

    def put(
        self, envelope: Envelope[Any], block: bool = True, timeout: float | None = None
    ) -> None:
        """Admit ``envelope`` or raise InboxFull in the sender's thread. Never blocks."""
        message = envelope.message
        if isinstance(message, _ActorStop):  # never refused, never reordered: pykka's contract
            with self._cond:
                if not self._closed:
                    self._rule.push_exempt(message, source=STOP, tag=envelope)
                    self._cond.notify()
                    return
            _refuse(envelope)
            return
        lane = self._classify(message)
        if lane == CONTROL:
            hook = self._on_control
            if hook is not None:
                try:
                    hook(message)
                except Exception:  # the hook must never stop the control message itself
                    log.exception("control hook failed for %r", message)
            with self._cond:
                if not self._closed:
                    self._control.append(envelope)
                    self._cond.notify()
                    return
            _refuse(envelope)
            return
        try:
            with self._cond:
                if self._closed:
                    pushed = None
                else:
                    pushed = self._rule.push(message, source=lane, tag=envelope)
                    self._cond.notify()
        except InboxFull as full:
            handler = self._on_full
            if handler is not None and handler(envelope, full):
                return
            raise
        if pushed is None:
            _refuse(envelope)
            return
        if pushed.absorbed:
            _resolve_absorbed(pushed.absorbed, pushed.outcome)

    def put_nowait(self, envelope: Envelope[Any]) -> None:
        self.put(envelope)

    def get(self, block: bool = True, timeout: float | None = None) -> Envelope[Any]:
        """The next envelope, control lane first; ``queue.Empty`` on a non-blocking miss."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._control:
                    return self._control.popleft()
                entry = self._rule.pop_entry()
                if entry is not None:
                    item, envelope = entry
                    if envelope.message is not item:  # the rule merged steering into it
                        envelope.message = item
                    return envelope
                if not block:
                    raise queue.Empty
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise queue.Empty
                self._cond.wait(remaining)

    def get_nowait(self) -> Envelope[Any]:
        return self.get(block=False)

    def empty(self) -> bool:
        with self._cond:
            return not self._control and not len(self._rule)

    def qsize(self) -> int:
        with self._cond:
            return len(self._control) + len(self._rule)

    def depths(self) -> dict[str, int]:
        """Queued work per source (``stop`` while a stop is queued) plus the control lane
        (a probe; never mutates)."""
        with self._cond:
            out = self._rule.depths()
            out[CONTROL] = len(self._control)
            return out


_CONTROL_TYPES: tuple[type, ...] = (Cancel, Interrupt)


def is_control(message: Any, control_methods: frozenset[str] = frozenset()) -> bool:
    """Whether ``message`` travels the control lane."""
    if isinstance(message, _CONTROL_TYPES):
        return True
    return (
        isinstance(message, pykka_messages.ProxyCall)
        and bool(message.attr_path)
        and message.attr_path[-1] in control_methods
    )


def default_classify(message: Any) -> str:
    if is_control(message):
        return CONTROL
    return source_of(message) or COMMAND


class QuotaActor(pykka.ThreadingActor):
    """A ``pykka.ThreadingActor`` whose inbox enforces the inbox rule.

    Class attributes a subclass may set:

    - ``control_methods``: proxy-call method names that travel the control lane;
    - ``call_source``: the quota source non-inbox messages count against (``command``);
    - ``mailbox_source_cap`` / ``mailbox_total_cap``: the caps (64 per source / 256 in all).

    ``cancel_scope`` is the actor's cooperative token (an agent replaces it with the token it
    registered); ``interrupt_scope`` is the current turn's scope, if any. Control messages trip
    them in the producer's thread via :meth:`on_control_arrival`.
    """

    control_methods: ClassVar[frozenset[str]] = frozenset()
    call_source: ClassVar[str] = COMMAND
    mailbox_source_cap: ClassVar[int] = INBOX_SOURCE_CAP
    mailbox_total_cap: ClassVar[int] = INBOX_TOTAL_CAP

    @staticmethod
    def _create_actor_inbox() -> QuotaMailbox:
        return QuotaMailbox()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancel_scope: CancelScope = CancelScope()
        self.interrupt_scope: CancelScope | None = None
        mailbox = self.mailbox
        mailbox._rule.source_cap = self.mailbox_source_cap
        mailbox._rule.total_cap = self.mailbox_total_cap
        mailbox.bind(
            classify=self.mailbox_source,
            on_control=self.on_control_arrival,
            on_full=self.on_mailbox_full,
            recipient=self.mailbox_recipient(),
        )

    @property
    def mailbox(self) -> QuotaMailbox:
        inbox = self.actor_inbox
        assert isinstance(inbox, QuotaMailbox)
        return inbox

    def mailbox_recipient(self) -> str:
        return type(self).__name__

    def mailbox_source(self, message: Any) -> str:
        """The lane or quota source of ``message``: ``CONTROL`` or an inbox source."""
        if is_control(message, self.control_methods):
            return CONTROL
        return source_of(message) or self.call_source

    def on_control_arrival(self, message: Any) -> None:
        """Runs in the *producer's* thread as a control message is put: trip the tokens now."""
        if isinstance(message, Cancel):
            self.cancel_scope.cancel(message.cause)
        elif isinstance(message, Interrupt):
            scope = self.interrupt_scope
            if scope is not None:
                scope.cancel(message.reason)

    def on_mailbox_full(self, envelope: Envelope[Any], full: InboxFull) -> bool:
        """Runs in the producer's thread when the rule refuses ``envelope``. Return True if the
        actor handled it another way (answering ``envelope.reply_to`` itself); the default
        lets InboxFull reach the sender."""
        return False

    def _handle_receive(self, message: Any) -> Any:
        """Cancel and Interrupt were acted on at arrival; :meth:`on_control_served` then runs in
        the actor's own thread, so ``on_receive`` never sees them."""
        if isinstance(message, Cancel | Interrupt):
            return self.on_control_served(message)
        return super()._handle_receive(message)

    def on_control_served(self, message: Cancel | Interrupt) -> Any:
        """Actor-thread follow-up of a Cancel or Interrupt (default: nothing more to do)."""
        return None

    def on_undelivered(self, messages: list[Any]) -> None:
        """Told messages still queued when the actor stopped (asks get ActorDeadError).

        The default logs them; an actor whose tells carry facts overrides this to record them.
        """
        for message in messages:
            log.warning("%s stopped before handling %r", self, message)

    def serves_at_stop(self, message: Any) -> bool:
        """Whether a message queued *behind* a stop is handled anyway (the bus writes late
        publishes); the default refuses it (work queued before the stop was already served)."""
        return False

    def _stop(self) -> None:
        """pykka's stop (served in its FIFO place), then settle every envelope queued behind it
        *before* the stop is acknowledged: served (:meth:`serves_at_stop`), refused with
        ActorDeadError (asks), or handed to :meth:`on_undelivered` (tells) — none vanishes
        silently, and a caller whose ``stop(block=True)`` returned sees the final state."""
        super()._stop()
        self._settle_queued()

    def _settle_queued(self) -> None:
        untold: list[Any] = []
        mailbox = self.mailbox
        while True:
            try:
                envelope = mailbox.get(block=False)
            except queue.Empty:
                break
            message = envelope.message
            if isinstance(message, _ActorStop):
                if envelope.reply_to is not None:
                    envelope.reply_to.set(None)
                continue
            if self.serves_at_stop(message):
                try:
                    result = self._handle_receive(message)
                except Exception:
                    if envelope.reply_to is not None:
                        envelope.reply_to.set_exception()
                    else:
                        log.exception("%s failed serving %r at stop", self, message)
                else:
                    if envelope.reply_to is not None:
                        envelope.reply_to.set(result)
                continue
            if envelope.reply_to is None:
                if not isinstance(message, _CONTROL_TYPES):
                    untold.append(message)
                continue
            _answer_dead(envelope.reply_to, f"{self.actor_ref} stopped before handling the message")
        if untold:
            try:
                self.on_undelivered(untold)
            except Exception:
                log.exception("on_undelivered failed in %s", self)

    def _actor_loop_teardown(self) -> None:
        """Anything put between the stop and the thread's exit is settled the same way; the
        mailbox is closed first, so nothing put later waits for this thread."""
        self.mailbox.close()
        self._settle_queued()
