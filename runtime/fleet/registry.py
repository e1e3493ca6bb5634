"""The registry's state: :class:`FleetRegistry`, the fleet's spawn tree plus each entry's live
cancel handles and inbox, behind one lock (docs/architecture.md, Cancellation). Pure state and
rules, no actor: ``actors/registry.py`` puts an actor and a lease-reaper thread in front of it.

Invariants:

- Every method may be called from any thread; the :class:`actors.registry.Registry` actor and
  the park verdict's synchronous reads share this one state.
- The cascade stops each node across both layers: its cooperative token (a CancelScope the agent
  registered) and its shell's eval root (a CancelScope-like or callable handle; ``None`` for the
  trunk). It calls them directly, never through the target's own mailbox, and *outside* the
  lock (a CancelScope callback may call back into the registry), so a node busy in a long
  handler or an in-flight ral evaluation is reached at its next poll point.
- One broken cancel handle never stops the rest of the cascade (:func:`_trip` logs it).
- Reads (``lookup``, ``is_live``, ``engaged``, ``live_descendants``, ``lease_figures``) are
  probes: they never mutate and never renew a lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from runtime.cancel import CancelScope
from runtime.errors import InboxFull
from runtime.events import InboxRejected
from runtime.fleet.inbox import (
    AgentMessage,
    AgentResult,
    InboxMsg,
    PushEffect,
    Surface,
    UserSteering,
)
from runtime.fleet.inbox import Inbox as AgentInbox
from runtime.fleet.spawn_tree import (
    IDLE_LEASE_SECS,
    Clock,
    IdleLease,
    LeaseExpired,
    LeaseRemaining,
    SpawnNode,
    SpawnTree,
)

log = logging.getLogger("actors.registry")  # the name its records have always carried

DEADLINE = "deadline"
"""The cancel cause of an idle lease that ran past its bound."""


class Cancellable(Protocol):
    def cancel(self, reason: str = ..., /) -> None: ...


CancelHandle = Cancellable | Callable[[str], None]
"""A node's shell handle the cascade trips: a CancelScope-like (``actors.eval_root.EvalRoot``)
or a plain callable taking the cause."""
RejectionRecorder = Callable[[InboxRejected], None]


def _trip(handle: Any, cause: str) -> None:
    if handle is None:
        return
    try:
        if hasattr(handle, "cancel"):
            handle.cancel(cause)
        else:
            handle(cause)
    except Exception:  # one broken handle must not stop the rest of the cascade
        log.exception("cancel handle %r failed", handle)


@dataclass
class _Handles:
    token: CancelScope
    eval_root: CancelHandle | None
    inbox: AgentInbox
    interrupt: Callable[[str], None] | None
    on_cancel: Callable[[str], None] | None = None
    ending: Callable[[], None] | None = None
    """Run before any token of the cascade trips: the node learns it is ending before anything
    watching its token can act on the trip (an in-process agent's eval root made terminal)."""


@dataclass(frozen=True)
class Entry:
    """A snapshot of one live registry entry."""

    name: str
    parent: str | None
    returns: bool
    interactive: bool
    fuel: int
    generation: int
    token: CancelScope
    eval_root: CancelHandle | None
    inbox: AgentInbox
    engaged: bool
    lease: IdleLease | None
    cancel_cause: str | None

    @property
    def conversing(self) -> bool:
        return self.interactive and not self.returns


@dataclass(frozen=True)
class LeaseReport:
    """One pass of the reaper: who was cascaded, and when to fire next (``None``: no lease)."""

    reaped: tuple[str, ...]
    next_fire: float | None


class FleetRegistry:
    """The thread-safe registry state: a :class:`SpawnTree` plus each entry's live handles.

    Every method may be called from any thread. Cancel handles run *outside* the lock, since
    a CancelScope callback may call back into the registry.
    """

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        lease_bound: float = IDLE_LEASE_SECS,
        on_dropped: RejectionRecorder | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        """Notified when a lease is armed (a register) or re-timed (``lease_changed``)."""
        self.tree = SpawnTree(clock=clock, lease_bound=lease_bound)
        self._handles: dict[str, _Handles] = {}
        self.on_dropped = on_dropped
        self.empty = threading.Event()
        self.empty.set()

    # -- membership --

    def register(
        self,
        name: str,
        parent: str | None = None,
        *,
        returns: bool,
        interactive: bool = False,
        token: CancelScope | None = None,
        eval_root: CancelHandle | None = None,
        inbox: AgentInbox | None = None,
        interrupt: Callable[[str], None] | None = None,
        on_cancel: Callable[[str], None] | None = None,
        fuel: int | None = None,
    ) -> Entry:
        """Register a live agent; NameTaken, UnknownAgent/AgentEnded (parent), FuelExhausted.

        A child registered under a parent that is already cancelled (a cancel that arrived
        mid-fork) is registered and tripped at once with the parent's cause.
        """
        with self._lock:
            node = self.tree.register(
                name, parent, returns=returns, interactive=interactive, fuel=fuel
            )
            handles = _Handles(
                token if token is not None else CancelScope(),
                eval_root,
                inbox if inbox is not None else AgentInbox(recipient=name),
                interrupt,
                on_cancel,
            )
            self._handles[name] = handles
            self.empty.clear()
            self._changed.notify_all()
            entry = self._entry(node)
        if node.cancel_cause is not None:
            self._trip_all([handles], node.cancel_cause)
        return entry

    def attach(
        self,
        name: str,
        *,
        token: CancelScope | None = None,
        eval_root: CancelHandle | None = None,
        inbox: AgentInbox | None = None,
        interrupt: Callable[[str], None] | None = None,
        on_cancel: Callable[[str], None] | None = None,
        ending: Callable[[], None] | None = None,
    ) -> None:
        """Replace an entry's handles after registration (the agent and its shell are built
        after the name is reserved). An entry already cancelled (a cancel that arrived
        mid-fork) has the new handles tripped at once, so nothing attached late escapes."""
        with self._lock:
            node = self.tree.get(name)
            h = self._handles[name]
            if token is not None:
                h.token = token
            if eval_root is not None:
                h.eval_root = eval_root
            if inbox is not None:
                h.inbox = inbox
            if interrupt is not None:
                h.interrupt = interrupt
            if on_cancel is not None:
                h.on_cancel = on_cancel
            if ending is not None:
                h.ending = ending
            cause = node.cancel_cause
        if cause is not None:
            self._trip_all([h], cause)

    def deregister(self, name: str) -> bool:
        """The agent ended. Idempotent: ``False`` when it was not registered."""
        with self._lock:
            if not self.tree.is_live(name):
                return False
            node = self.tree.deregister(name)
            self._handles.pop(name, None)
            parent = self._handles.get(node.parent_name) if node.parent_name else None
            if self.tree.is_empty():
                self.empty.set()
            # no lease wake: an end arms no lease and brings none closer (leases arm at
            # register), and a cascade's 100 ends woke the lease reaper 100 times for nothing
        if parent is not None:  # a parent HeldByChildren re-reads its verdict at once
            parent.inbox.wake()
        return True

    # -- reads (probes: they never mutate and never renew a lease) --

    def lookup(self, name: str) -> Entry | None:
        with self._lock:
            node = self.tree.lookup(name)
            return None if node is None else self._entry(node)

    def get(self, name: str) -> Entry:
        with self._lock:
            return self._entry(self.tree.get(name))

    def is_live(self, name: str) -> bool:
        with self._lock:
            return self.tree.is_live(name)

    def engaged(self, name: str) -> bool:
        with self._lock:
            node = self.tree.lookup(name)
            return node is not None and node.engaged

    def live_descendants(self, name: str) -> list[str]:
        with self._lock:
            if not self.tree.is_live(name):
                return []
            return self.tree.live_descendants(name)

    def has_live_descendants(self, name: str) -> bool:
        """Whether ``name`` is live and has a live descendant (a park verdict's read)."""
        with self._lock:
            return self.tree.is_live(name) and self.tree.has_live_descendants(name)

    def is_descendant(self, ancestor: str, name: str) -> bool:
        """Whether ``name`` is a live proper descendant of ``ancestor`` (agent-cancel's check)."""
        with self._lock:
            if not (self.tree.is_live(ancestor) and self.tree.is_live(name)):
                return False
            return name in self.tree.live_descendants(ancestor)

    def lease_figures(self, name: str) -> dict[str, float | None]:
        """The idle-lease rows of ``/resources``: a probe, so it renews nothing.

        ``nearest_reap_secs`` is the least remaining margin over ``name`` and its descendants
        (``None``: nothing leased); ``bound_secs`` is the idle bound (the demote threshold).
        """
        with self._lock:
            if not self.tree.is_live(name):
                return {"nearest_reap_secs": None, "bound_secs": self.tree.lease_bound}
            now = self.tree.clock()
            margins = [
                max(0.0, n.lease.remaining(now))
                for n in self.tree.subtree(name)
                if n.lease is not None
            ]
            return {
                "nearest_reap_secs": min(margins) if margins else None,
                "bound_secs": self.tree.lease_bound,
            }

    def names(self) -> list[str]:
        with self._lock:
            return self.tree.names()

    def is_empty(self) -> bool:
        with self._lock:
            return self.tree.is_empty()

    def wait_empty(self, timeout: float | None = None) -> bool:
        """Block until no agent is registered: the fleet is alive while this is False."""
        return self.empty.wait(timeout)

    @property
    def generation(self) -> int:
        with self._lock:
            return self.tree.generation

    def child_fuel(self, parent: str) -> int:
        """What a child of ``parent`` would get; FuelExhausted at 0 (the desk's wall)."""
        with self._lock:
            return self.tree.child_fuel(parent)

    # -- the cascade --

    def cancel(self, name: str, cause: str = "cancelled") -> list[str]:
        """Cancel ``name`` and its whole subtree across both layers; return who was reached.

        Idempotent: an agent that already ended yields ``[]``; a name never registered raises
        UnknownAgent.
        """
        return self._cascade(name, cause, include_root=True)

    def cancel_descendants(self, root: str, cause: str = "cancelled") -> list[str]:
        """Abandon ``root``'s children (a returning agent replied); the generation stays."""
        return self._cascade(root, cause, include_root=False)

    def _cascade(self, name: str, cause: str, *, include_root: bool) -> list[str]:
        with self._lock:
            if self.tree.has_ended(name):
                return []
            nodes = self.tree.subtree(name)
            if not include_root:
                nodes = nodes[1:]
            self.tree.mark_cancelled(nodes, cause)
            handles = [self._handles[n.name] for n in nodes]
            recorded = [n.cancel_cause or cause for n in nodes]
        self._trip_all(handles, cause, recorded)
        return [n.name for n in nodes]

    @staticmethod
    def _trip_all(handles: list[_Handles], cause: str, recorded: list[str] | None = None) -> None:
        """Trip ``handles``: every ``ending`` hook, then every token (the cheap, cooperative
        layer reaches every node soonest), then each eval root, ``on_cancel`` hook and inbox.

        The ``ending`` hooks go first because a token's trip wakes whoever watches it: an
        in-process agent's shell, busy in a call, re-sent the trip to its host as a plain
        interrupt when it woke before the cascade reached its eval root, and the host unwound
        the call (``1:1 cancelled``) instead of being killed with the cascade's cause (1 run in
        25 of ``tests/agent/test_reply.py``'s cancelled child). An agent process orders the
        same two steps in its own process (its cancel frame).

        An ``on_cancel`` hook gets the cause the registry recorded for its node (``recorded``,
        read under the lock: the first cause, which a later cascade's own does not replace), so
        a hook that forwards it (a process agent's cancel frame) needs no registry read of its
        own per node: the hundred reads of a 100-agent cascade each took the registry lock
        against the settlements of the agents already ended."""
        for h in handles:
            if h.ending is not None:
                try:
                    h.ending()
                except Exception:  # one broken hook must not stop the rest of the cascade
                    log.exception("ending hook %r failed", h.ending)
        for h in handles:
            h.token.cancel(cause)
        for i, h in enumerate(handles):
            _trip(h.eval_root, cause)
            if h.on_cancel is not None:
                _trip(h.on_cancel, recorded[i] if recorded is not None else cause)
            h.inbox.wake()

    def clear_subtree(self, root: str, cause: str = "clear", *, include_root: bool = False) -> int:
        """Reap ``root``'s subtree and advance the generation; return the new generation.

        Descendants are cancelled and removed from the registry; a late result or deferred
        batch stamped before this generation is dropped and recorded by :meth:`deliver`.
        ``include_root`` also cancels and removes ``root`` itself (``/close``).
        """
        self.cancel_descendants(root, cause)
        if include_root:
            self.cancel(root, cause)
        with self._lock:
            generation, nodes = self.tree.clear_subtree(root)
            reaped = nodes if include_root else nodes[1:]
        for node in reversed(reaped):  # children before parents
            self.deregister(node.name)
        return generation

    def interrupt(self, name: str, reason: str = "interrupt") -> None:
        """Stop ``name``'s current turn only; its descendants keep running.

        Uses the agent's interrupt hook if it registered one, else trips its sticky token
        (which the drive loop resets at the next turn boundary).
        """
        with self._lock:
            self.tree.get(name)
            h = self._handles[name]
        if h.interrupt is not None:
            h.interrupt(reason)
        else:
            h.token.cancel(reason)
        h.inbox.wake()

    # -- delivery --

    def steer(self, name: str, text: str) -> PushEffect:
        """Deliver a human message: engaged, and the idle lease renewed (the only renewal)."""
        with self._lock:  # pushed under the lock: never into the inbox of an agent that ended
            self.tree.get(name)
            outcome = self._handles[name].inbox.push(UserSteering(text))  # never refused
            self.tree.record_exchange(name)
        return outcome

    def record_exchange(self, name: str) -> None:
        """Record a human exchange the agent itself admitted (a steering it drained): engaged
        and lease renewed. Only human input may call this; ``message`` and probes never do."""
        with self._lock:
            if self.tree.is_live(name):
                self.tree.record_exchange(name)

    def message(self, sender: str, name: str, text: str | AgentMessage) -> PushEffect:
        """Model-facing message: renews nothing. Raises InboxFull, UnknownAgent or AgentEnded."""
        msg = text if isinstance(text, AgentMessage) else AgentMessage(sender, text)
        with self._lock:  # pushed under the lock: never into the inbox of an agent that ended
            self.tree.get(name)
            return self._handles[name].inbox.push(msg)

    def deliver(
        self,
        recipient: str,
        msg: AgentResult | Surface,
        *,
        stamp: int | None = None,
        sender: str | None = None,
    ) -> str:
        """Deliver a spawn completion or surfaced batch, which has no caller to refuse to.

        Returns ``"delivered"``, or records an :class:`InboxRejected` through ``on_dropped`` and
        returns ``"stale"`` (stamped before a clear that reaped the recipient's subtree),
        ``"ended"`` (recipient gone) or ``"full"`` (recipient's inbox at its cap). An inbox in
        another process (one with ``send_push``) answers later: ``"delivered"`` means sent, and
        its ``"full"`` is recorded when its verdict arrives.
        """
        stamp = msg.generation if stamp is None else stamp
        sender = sender if sender is not None else getattr(msg, "child", None)
        # The push happens under the registry lock: a recipient deregistering concurrently
        # either sees the item in its inbox (and records it if it cannot take it) or this call
        # sees it ended and records it here. Inbox.push never calls back into the registry.
        # The drop is decided under the lock and recorded after it: the record is a durable
        # append, and no lock but its file writer's own is held across its fsync.
        # An inbox in another process (``send_push``) is sent to under the lock, and its
        # verdict is not waited for: the frame is ahead of the recipient's deregistration on
        # its pipe all the same, and a refusal is recorded when the verdict arrives.
        dropped: tuple[str, str] | None = None

        def full(e: InboxFull) -> None:
            event = InboxRejected.of(
                recipient, msg, reason="inbox full", cap=e.cap, total=e.total, sender=sender
            )
            self._record(event)

        try:
            with self._lock:
                if not self.tree.is_live(recipient):
                    dropped = ("recipient ended", "ended")
                elif self.tree.is_stale(recipient, stamp):
                    dropped = ("stale generation", "stale")
                else:
                    inbox = self._handles[recipient].inbox
                    send = getattr(inbox, "send_push", None)
                    if send is None:
                        inbox.push(msg)
                    else:
                        send(msg, full)
        except InboxFull as e:
            full(e)
            return "full"
        if dropped is not None:
            return self._drop(recipient, msg, dropped[0], sender, dropped[1])
        return "delivered"

    def _drop(
        self, recipient: str, msg: InboxMsg, reason: str, sender: str | None, tag: str
    ) -> str:
        self._record(InboxRejected.of(recipient, msg, reason=reason, sender=sender))
        return tag

    def _record(self, event: InboxRejected) -> None:
        if self.on_dropped is None:
            log.warning("undeliverable: %s", event.to_record())
            return
        try:
            self.on_dropped(event)
        except Exception:
            log.exception("recording %s failed", event)

    # -- idle leases --

    def fire_leases(self) -> LeaseReport:
        """One reaper pass: cascade every lease past its bound with cause ``deadline``; report
        the nearest remaining margin so the caller re-arms for exactly that long."""
        expired: list[str] = []
        nearest: float | None = None
        with self._lock:
            for node in self.tree.leased():
                if node.cancel_cause is not None or node.lease is None:
                    continue
                verdict = node.lease.fire(self.tree.clock())
                if isinstance(verdict, LeaseExpired):
                    node.lease = None  # spent: the cascade below ends it
                    expired.append(node.name)
                elif isinstance(verdict, LeaseRemaining):
                    nearest = verdict.margin if nearest is None else min(nearest, verdict.margin)
        for name in expired:
            self.cancel(name, DEADLINE)
        return LeaseReport(tuple(expired), nearest)

    def lease_changed(self) -> None:
        with self._lock:
            self._changed.notify_all()

    def wait_changed(self, timeout: float | None) -> None:
        with self._lock:
            self._changed.wait(timeout)

    # -- helpers --

    def _entry(self, node: SpawnNode) -> Entry:
        h = self._handles[node.name]
        return Entry(
            name=node.name,
            parent=node.parent_name,
            returns=node.returns,
            interactive=node.interactive,
            fuel=node.fuel,
            generation=node.generation,
            token=h.token,
            eval_root=h.eval_root,
            inbox=h.inbox,
            engaged=node.engaged,
            lease=None if node.lease is None else replace(node.lease),
            cancel_cause=node.cancel_cause,
        )
