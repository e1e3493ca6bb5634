"""The fleet's traffic governor: every model request of every agent waits here before it is sent.

One :class:`Governor` per run, in the control process. Agents of the thread backend reach it
directly; an agent process (and a Ray host, on any node) reaches the same object through its
channel (``actors/traffic_gate.py``), so one budget holds for the whole fleet, never one per
process or per node. A provider holds the governor as a plain attribute: pickled into an agent
process it becomes that process's installed gate (:func:`install_gate`).

Invariants:

- **A rate limit is a wait, never a failure.** A request is granted when its lane
  (``runtime/providers/traffic.py``) allows it; a 429/529 that arrives anyway sends it back to
  the queue, in its first place (:class:`Gate` callers pass the age of their first ask), and
  costs no transport retry. Only :attr:`TrafficLimits.max_wait` seconds of waiting in all
  fail it (:class:`RateWaitExpired`, which says so).
- **Order.** Each lane grants in the order requests were first asked (FIFO by first arrival,
  a request sent back by a 429 keeping its place). An agent has at most one request in flight,
  so a queue of N agents serves each once per N grants: nobody starves, and a parent that
  collects its children waits behind at most one request of each.
- **Never blocks a caller's thread in the control process.** :meth:`Governor.submit` returns at
  once and calls ``then`` when the request is granted (or expired), from the governor's own
  thread or inline; the control side of an agent process answers its channel from there, so a
  thousand waiting agents hold no thread of the fleet's pool.
- **Cancellable at once.** A waiter whose scope is cancelled withdraws its ticket
  (:meth:`Governor.withdraw`): a granted-but-unsent request gives its budget back.
- **Free when nothing paces.** A lane with no limit set, learned or backed off grants inline,
  without a queue or a thread hand-off.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.providers.base import RateLimited
from exarch_actors.runtime.providers.traffic import (
    Cost,
    Lane,
    LaneKey,
    TrafficLimits,
    WireLimits,
    estimate_cost,
)

FAST_GRANT = 0.02
"""Seconds a waiter waits for its grant before it tells its agent it is waiting for the rate
limit (a grant in the same instant is not a wait anyone needs to see)."""


class RateWaitExpired(RateLimited):
    """A request waited for the rate limit longer than the ceiling (``--rate-wait``)."""

    kind = "rate_limit"


@dataclass(frozen=True)
class TrafficVerdict:
    """What the governor says of a request: granted, or (``error``) not after the ceiling."""

    granted: bool
    error: str | None = None


@dataclass
class _Ticket:
    id: str
    key: LaneKey
    cost: Cost
    arrived: float
    deadline: float
    then: Callable[[TrafficVerdict], None]
    queued_at: float


_Due = tuple[Callable[[TrafficVerdict], None], TrafficVerdict]
"""A verdict to hand out, with whom to hand it to (outside the lock)."""


@dataclass(frozen=True)
class Ask:
    """One request asking to be sent: its lane, its size, its output cap; ``age``, seconds
    since it was first asked (its place in the queue); ``waited``, seconds it already waited for
    the rate limit (the ceiling counts them all)."""

    key: LaneKey
    payload_bytes: int
    max_tokens: int | None = None
    age: float = 0.0
    waited: float = 0.0


class Gate(Protocol):
    """What a provider asks of the traffic governor, wherever it runs."""

    def admit(
        self,
        ask: Ask,
        cancel: CancelScope,
        on_wait: Callable[[bool, float], None] | None = None,
    ) -> tuple[str, float]:
        """Wait until a request may be sent; (ticket, seconds waited)."""
        ...

    def observe(self, ticket: str, status: int, wire: WireLimits) -> None:
        """The reply's status and rate-limit headers, as soon as they arrive."""
        ...

    def finish(self, ticket: str, usage: Cost | None) -> None:
        """The request is over; ``usage`` as its reply reported (None if none)."""
        ...


_ids = itertools.count(1)


def new_ticket_id() -> str:
    """Unique across the fleet: the asking process's pid and its own counter."""
    return f"{os.getpid()}-{next(_ids)}"


def wait_for_grant(
    submit: Callable[[Callable[[TrafficVerdict], None]], None],
    withdraw: Callable[[], None],
    cancel: CancelScope,
    on_wait: Callable[[bool, float], None] | None,
) -> float:
    """Submit one request and wait for its verdict: the seconds waited. Raises
    :class:`Cancelled` (the ticket withdrawn) or :class:`RateWaitExpired`."""
    done = threading.Event()
    verdict: list[TrafficVerdict] = []

    def then(v: TrafficVerdict) -> None:
        verdict.append(v)
        done.set()

    started = time.monotonic()
    submit(then)
    if not done.wait(FAST_GRANT):
        if on_wait is not None:
            on_wait(True, 0.0)
        wake = done.set  # one bound method: the scope forgets it by identity
        cancel.on_cancel(wake)
        try:
            done.wait()
        finally:
            cancel.discard_callback(wake)
        if cancel.cancelled:  # granted or not: withdrawn, so an unsent grant is given back
            withdraw()
            raise Cancelled(cancel.reason or "cancelled")
        if on_wait is not None:
            on_wait(False, time.monotonic() - started)
    v = verdict[0]
    if not v.granted:
        raise RateWaitExpired(v.error or "waited too long for the rate limit", status=None)
    return time.monotonic() - started


class Governor:
    """The run's one traffic governor (the module docstring's invariants)."""

    def __init__(
        self, limits: TrafficLimits | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or TrafficLimits()
        self._clock = clock
        self._cond = threading.Condition()
        self._lanes: dict[LaneKey, Lane] = {}
        self._queues: dict[LaneKey, list[_Ticket]] = {}
        self._granted: dict[str, _Ticket] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def __reduce__(self) -> tuple[Callable[[], Gate], tuple[()]]:
        """Pickled into an agent process (or onto a Ray node), the governor is that process's
        installed gate: the channel back to this object."""
        return (installed_gate, ())

    # -- the asynchronous surface (the control side of a channel) --------------------------------

    def submit(
        self,
        ticket_id: str,
        ask: Ask,
        then: Callable[[TrafficVerdict], None],
    ) -> None:
        """Queue a request; ``then`` is called once, with its verdict (inline if it may go now)."""
        with self._cond:
            now = self._clock()
            lane = self._lane(ask.key)
            cost = estimate_cost(ask.payload_bytes, ask.max_tokens, lane.typical_output)
            ticket = _Ticket(
                ticket_id,
                ask.key,
                cost,
                now - max(0.0, ask.age),
                now + max(0.0, self.limits.max_wait - ask.waited),
                then,
                now,
            )
            queue = self._queues.setdefault(ask.key, [])
            if self._closed or (not queue and lane.unlimited(now)):
                lane.grant(cost, now)
                self._granted[ticket_id] = ticket
                grant_now = True
            else:
                # FIFO by first arrival: a request sent back by a 429 keeps its place
                at = len(queue)
                while at > 0 and queue[at - 1].arrived > ticket.arrived:
                    at -= 1
                queue.insert(at, ticket)
                grant_now = False
                self._ensure_thread()
                self._cond.notify_all()
        if grant_now:
            then(TrafficVerdict(True))

    def withdraw(self, ticket_id: str) -> None:
        """The asker gave up (cancelled): out of the queue, or its unsent grant given back."""
        with self._cond:
            for queue in self._queues.values():
                for i, t in enumerate(queue):
                    if t.id == ticket_id:
                        del queue[i]
                        self._cond.notify_all()
                        return
            ticket = self._granted.pop(ticket_id, None)
            if ticket is not None:
                self._lanes[ticket.key].withdraw(ticket.cost, self._clock())
                self._cond.notify_all()

    def observe(self, ticket: str, status: int, wire: WireLimits) -> None:
        with self._cond:
            t = self._granted.get(ticket)
            if t is None:
                return
            self._lanes[t.key].observe(status, wire, self._clock(), t.cost)
            self._cond.notify_all()

    def finish(self, ticket: str, usage: Cost | None) -> None:
        with self._cond:
            t = self._granted.pop(ticket, None)
            if t is None:
                return
            self._lanes[t.key].finish(t.cost, usage, self._clock())
            self._cond.notify_all()

    # -- the blocking surface (a provider in this process) ---------------------------------------

    def admit(
        self,
        ask: Ask,
        cancel: CancelScope,
        on_wait: Callable[[bool, float], None] | None = None,
    ) -> tuple[str, float]:
        ticket = new_ticket_id()
        seconds = wait_for_grant(
            lambda then: self.submit(ticket, ask, then),
            lambda: self.withdraw(ticket),
            cancel,
            on_wait,
        )
        return ticket, seconds

    # -- figures -------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """Per lane (``"URL model"``): limits and their source, in flight, queued, 429s, waits;
        and the totals the fleet yield keeps."""
        with self._cond:
            lanes = {}
            for key, lane in self._lanes.items():
                d = lane.describe()
                d["queued"] = len(self._queues.get(key, ()))
                lanes[f"{key[0]} {key[1]}"] = d
            return {
                "lanes": lanes,
                "waits": sum(lane.figures.waits for lane in self._lanes.values()),
                "wait_seconds": round(
                    sum(lane.figures.wait_seconds for lane in self._lanes.values()), 3
                ),
                "throttled": sum(lane.figures.throttled for lane in self._lanes.values()),
                "requests": sum(lane.figures.requests for lane in self._lanes.values()),
                "expired": sum(lane.figures.expired for lane in self._lanes.values()),
                "set": self.limits.to_dict(),
            }

    def close(self) -> None:
        """Grant everything queued (its askers are being cancelled) and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    # -- the scheduler -------------------------------------------------------------------------

    def _lane(self, key: LaneKey) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(self.limits)
        return lane

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="traffic-governor", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                verdicts, wake = self._due()
                if not verdicts:
                    if self._closed and not any(self._queues.values()):
                        return
                    self._cond.wait(None if wake is None else max(0.0, wake - self._clock()))
                    continue
            for then, verdict in verdicts:
                try:
                    then(verdict)
                except Exception:  # an asker that is gone: its channel said so already
                    pass

    def _due(self) -> tuple[list[_Due], float | None]:
        """Under the lock: every verdict due now, and when the next one may be."""
        now = self._clock()
        out: list[_Due] = []
        wake: float | None = None
        for key, queue in self._queues.items():
            lane = self._lanes[key]
            for t in [t for t in queue if t.deadline <= now and not self._closed]:
                queue.remove(t)
                lane.figures.expired += 1
                waited = now - t.queued_at
                lane.figures.wait_seconds += waited
                out.append(
                    (
                        t.then,
                        TrafficVerdict(
                            False,
                            f"waited {self.limits.max_wait:g}s in all for the rate limit of "
                            f"{key[0]} ({key[1]}) and was not let through "
                            f"(the ceiling is --rate-wait {self.limits.max_wait:g})",
                        ),
                    )
                )
            while queue:
                head = queue[0]
                at = now if self._closed else lane.ready_at(head.cost, now)
                if at is None:  # in-flight cap: a finish wakes us
                    break
                if at > now:
                    wake = at if wake is None else min(wake, at)
                    break
                queue.pop(0)
                lane.grant(head.cost, now)
                self._granted[head.id] = head
                lane.figures.waits += 1
                lane.figures.wait_seconds += now - head.queued_at
                out.append((head.then, TrafficVerdict(True)))
            if queue:
                deadline = min(t.deadline for t in queue)
                wake = deadline if wake is None else min(wake, deadline)
        return out, wake


# -- the gate of this process ------------------------------------------------------------------

_installed: Gate | None = None


class _InstalledGate:
    """The gate of whatever process this is, looked up at each use: a provider unpickled before
    its process installed the channel's gate still reaches it. No gate installed: ungoverned."""

    def admit(
        self,
        ask: Ask,
        cancel: CancelScope,
        on_wait: Callable[[bool, float], None] | None = None,
    ) -> tuple[str, float]:
        gate = _installed
        if gate is None:
            return "", 0.0
        return gate.admit(ask, cancel, on_wait)

    def observe(self, ticket: str, status: int, wire: WireLimits) -> None:
        if _installed is not None and ticket:
            _installed.observe(ticket, status, wire)

    def finish(self, ticket: str, usage: Cost | None) -> None:
        if _installed is not None and ticket:
            _installed.finish(ticket, usage)

    def __reduce__(self) -> tuple[Callable[[], Gate], tuple[()]]:
        return (installed_gate, ())


def installed_gate() -> Gate:
    """What a pickled governor becomes in another process."""
    return _InstalledGate()


def install_gate(gate: Gate | None) -> None:
    """This process's gate to the run's governor (an agent process: its channel's)."""
    global _installed
    _installed = gate
