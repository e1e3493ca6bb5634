"""Fan-in: a parent collecting its children's ends in one call (``agent-wait``), reading one end
(``agent-result``), and the replies its full inbox held back.

From its parent's side every child is in one of four states:

- **running**: spawned, not settled yet;
- **delivered**: settled, its :class:`AgentResult` sent to the parent's inbox (queued there,
  admitted as a turn already, or -- for an agent process -- refused, its verdict on the way);
- **held**: settled, its result refused by the parent's full inbox (recorded as
  ``InboxRejected``, the quota rule unchanged): the parent is told, and reads it here;
- **collected**: its end was returned by ``agent-wait`` or read by ``agent-result``.

Invariants (the fleet calls every mutator under nothing but this object's lock, and delivers a
settlement to the inbox *inside* :meth:`FanIn.settle`, so a wait that starts later sees the
delivery already made -- for an agent process, the push frame is on its channel ahead of the
wait's answer, so the parent's inbox holds the item, or has refused it, when the answer is read):

- A settlement is routed exactly once: to a wait of its parent that is pending on that child
  (never to the inbox: no second delivery), or to the parent's inbox.
- A wait answers once: at once when none of its children is running, else when the last one
  settles; :meth:`FanIn.stop_wait` ends it early (a timeout: the partial answer) or withdraws it
  (a cancelled caller: what it had collected is given back, delivered to the inbox as if no
  wait had been).
- A held reply stays readable until it is collected; :meth:`FanIn.held` is true only for a
  refusal that leaves a reply unread (a refusal of a result a wait already took tells nobody).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.fleet.inbox import AgentResult, ScheduledWakeup

RUNNING, DELIVERED, HELD, COLLECTED = "running", "delivered", "held", "collected"

HELD_NOTICE_ID = "runtime:held-replies"
"""The schedule id of the held-replies notice: a :class:`ScheduledWakeup` is idempotent (it
replaces a queued one with the same id in place, never refused by the quota), so a parent gets
at most one such notice per turn, carrying the latest count. ``schedule`` refuses ids that start
with ``runtime:``."""

HELD_NAMES_SHOWN = 20
"""Names a held-replies notice lists before ``and N more``."""


class NotAChild(ExarchError):
    """``agent-wait`` / ``agent-result`` named an agent that is not a child of the caller."""

    def __init__(self, verb: str, parent: str, name: str) -> None:
        super().__init__(f"{verb}: {name!r} is not a child of {parent}")


@dataclass(frozen=True)
class ChildEnd:
    """How one child ended, as its parent reads it."""

    child: str
    outcome: str
    """replied | quiesced | capped | cancelled | failed."""
    value: Any = None
    """The reply (``None``: the child never replied)."""
    reason: str | None = None
    """Why it ended without a reply: the cancel cause, the failure, ``ended without a reply``."""
    generation: int = 0

    def to_result(self) -> AgentResult:
        """The inbox item a parent gets when nothing waits for this end."""
        value = self.value if self.value is not None else "(no reply)"
        return AgentResult(self.child, value, status=self.outcome, generation=self.generation)

    def to_ral(self) -> dict[str, Any]:
        """``[outcome: replied, reply: VALUE]``, or ``[outcome: O, reason: TEXT]``."""
        if self.value is not None:
            return {"outcome": self.outcome, "reply": self.value}
        return {"outcome": self.outcome, "reason": self.reason or "ended without a reply"}


RUNNING_END: dict[str, Any] = {"outcome": RUNNING}
"""What a wait answers for a child still running when it ended early (a timeout)."""


@dataclass(frozen=True)
class WaitAnswer:
    """A wait's answer: the ends it collected and the children still running, in the order the
    wait named them; and how many replies stay held back for the parent afterwards."""

    ends: tuple[ChildEnd, ...] = ()
    running: tuple[str, ...] = ()
    held: int = 0

    @property
    def children(self) -> tuple[str, ...]:
        return tuple(e.child for e in self.ends)


Answer = Callable[[WaitAnswer], None]


@dataclass
class _Wait:
    order: tuple[str, ...]
    pending: set[str]
    then: Answer
    ends: dict[str, ChildEnd] = field(default_factory=dict)

    def answer(self, held: int) -> WaitAnswer:
        ends = tuple(self.ends[c] for c in self.order if c in self.ends)
        running = tuple(c for c in self.order if c in self.pending)
        return WaitAnswer(ends, running, held)


class FanIn:
    """Every parent's children, their ends and the waits in progress (see the module
    docstring). Thread-safe: one re-entrant lock, held while a settlement is delivered."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._children: dict[str, dict[str, str]] = {}
        """parent -> child -> state, in spawn order."""
        self._ends: dict[str, ChildEnd] = {}
        self._waits: dict[tuple[str, str], _Wait] = {}

    # -- the spawn site ------------------------------------------------------------------------

    def spawned(self, parent: str, child: str) -> None:
        with self.lock:
            self._children.setdefault(parent, {})[child] = RUNNING

    def settle(
        self, parent: str, end: ChildEnd, deliver: Callable[[ChildEnd], None]
    ) -> Callable[[], None] | None:
        """Route ``end``: to a wait pending on it, else ``deliver`` (to the inbox, under the
        lock). Returns the completed wait's answer to call outside the lock, if one completed."""
        with self.lock:
            self._ends[end.child] = end
            states = self._children.setdefault(parent, {})
            for key, wait in self._waits.items():
                if key[0] == parent and end.child in wait.pending:
                    wait.pending.discard(end.child)
                    wait.ends[end.child] = end
                    states[end.child] = COLLECTED
                    if wait.pending:
                        return None
                    del self._waits[key]
                    answer = wait.answer(self._held_count(parent))
                    return lambda: wait.then(answer)
            states[end.child] = DELIVERED
            deliver(end)
            return None

    def held(self, parent: str, child: str) -> bool:
        """The parent's inbox refused ``child``'s result: True if that leaves a reply unread
        (the parent must be told), False if a wait or a read has it already."""
        with self.lock:
            states = self._children.get(parent)
            if states is None or states.get(child) != DELIVERED:
                return False
            states[child] = HELD
            return True

    # -- waits and reads -----------------------------------------------------------------------

    def begin_wait(
        self, parent: str, wait_id: str, names: Iterable[str] | None, then: Answer
    ) -> WaitAnswer | None:
        """Start a wait of ``parent`` on ``names`` (``None``: every child not yet collected).
        Returns the answer when nothing named is running (``then`` is not called), else None
        (``then`` is called once the last one settles). :class:`NotAChild` for a stranger."""
        with self.lock:
            states = self._children.get(parent, {})
            if names is None:
                order = tuple(c for c, s in states.items() if s != COLLECTED)
            else:
                order = tuple(dict.fromkeys(names))
                for name in order:
                    if name not in states:
                        raise NotAChild("agent-wait", parent, name)
            wait = _Wait(order, set(), then)
            for child in order:
                if states[child] == RUNNING:
                    wait.pending.add(child)
                else:
                    wait.ends[child] = self._ends[child]
                    states[child] = COLLECTED
            if not wait.pending:
                return wait.answer(self._held_count(parent))
            self._waits[(parent, wait_id)] = wait
            return None

    def stop_wait(
        self, parent: str, wait_id: str, give_back: Callable[[ChildEnd], None] | None
    ) -> WaitAnswer | None:
        """End a pending wait early. With ``give_back`` (a cancelled caller) what it collected
        is delivered as if no wait had been and None is returned; without, its partial answer.
        None too when the wait answered already (the answer is the caller's to use)."""
        with self.lock:
            wait = self._waits.pop((parent, wait_id), None)
            if wait is None:
                return None
            if give_back is None:
                return wait.answer(self._held_count(parent))
            self._give_back(parent, wait.ends.values(), give_back)
            return None

    def give_back(
        self, parent: str, ends: Iterable[ChildEnd], deliver: Callable[[ChildEnd], None]
    ) -> None:
        """Ends a wait answered but its caller never took (cancelled as the answer came)."""
        with self.lock:
            self._give_back(parent, ends, deliver)

    def _give_back(
        self, parent: str, ends: Iterable[ChildEnd], deliver: Callable[[ChildEnd], None]
    ) -> None:
        states = self._children.setdefault(parent, {})
        for end in ends:
            states[end.child] = DELIVERED
            deliver(end)

    def read(self, parent: str, child: str) -> ChildEnd | None:
        """``agent-result``: the child's end (collected by this read), or None while it runs.
        :class:`NotAChild` for a stranger; a child this fleet never saw is the caller's to look
        up in the journal (``resume``), so it raises too."""
        with self.lock:
            states = self._children.get(parent, {})
            state = states.get(child)
            if state is None:
                raise NotAChild("agent-result", parent, child)
            if state == RUNNING:
                return None
            states[child] = COLLECTED
            return self._ends[child]

    def is_child(self, parent: str, child: str) -> bool:
        with self.lock:
            return child in self._children.get(parent, {})

    def held_names(self, parent: str) -> list[str]:
        with self.lock:
            return [c for c, s in self._children.get(parent, {}).items() if s == HELD]

    def _held_count(self, parent: str) -> int:
        return sum(1 for s in self._children.get(parent, {}).values() if s == HELD)

    def abandon(self, parent: str, deliver: Callable[[ChildEnd], None]) -> None:
        """``parent`` ended: every wait it left pending gives back what it collected."""
        with self.lock:
            for key in [k for k in self._waits if k[0] == parent]:
                self._give_back(parent, self._waits.pop(key).ends.values(), deliver)


def is_held_notice(item: object) -> bool:
    """Whether an inbox item is the held-replies notice."""
    return isinstance(item, ScheduledWakeup) and item.schedule_id == HELD_NOTICE_ID


def held_notice(names: list[str]) -> ScheduledWakeup:
    """The one coalesced notice of a parent's held-back replies (:data:`HELD_NOTICE_ID`)."""
    shown = ", ".join(names[:HELD_NAMES_SHOWN])
    more = len(names) - HELD_NAMES_SHOWN
    if more > 0:
        shown += f" and {more} more"
    n = len(names)
    text = (
        f"{n} {'reply' if n == 1 else 'replies'} from your children {'was' if n == 1 else 'were'} "
        f"held back because your inbox was full: {shown}. Nothing is lost: `agent-wait` returns "
        "every child's end you have not had yet (held ones included), and `agent-result NAME` "
        "reads one."
    )
    return ScheduledWakeup(HELD_NOTICE_ID, text)
