"""The registry's state: :class:`FleetRegistry`, the fleet's spawn tree plus each entry's live
cancel handles and inbox, behind one lock (docs/architecture.md, Cancellation). Pure state and
rules, no actor: ``actors/registry.py`` puts an actor and a lease-reaper thread in front of it.

Invariants:

- Every method may be called from any thread; the :class:`actors.registry.Registry` actor and
  the park verdict's synchronous reads share this one state.
- A cancel travels down the spawn tree hop by hop, as OTP's exit signals travel links: the
  cancelled node is marked (its first cause kept) and sent an :class:`ExitSignal` on its
  mailbox's control lane (:meth:`Inbox.signal`: never quota-refused, ahead of every queued
  turn); the signal's arrival trips the node's own scope -- its ``ending`` hook, its token,
  its shell's eval root, its ``on_cancel`` hook -- and only then are its live children, read
  at that hop, each sent a signal in turn. Each hop is recorded (``on_hop``: a
  :class:`CancelHop` ``sent``, and ``received`` where the node's mailbox is in this process;
  an agent process records its own), and once every node a cancel reached has deregistered,
  a ``CancelHop`` ``ended`` for the cancelled node. Nothing is tripped under the lock (a
  CancelScope callback may call back into the registry); a node busy in a long handler or an
  in-flight ral evaluation is reached at its next poll point.
- One broken cancel handle never stops the rest of the cascade (:func:`_trip` logs it).
- Reads (``lookup``, ``is_live``, ``engaged``, ``live_descendants``, ``lease_figures``) are
  probes: they never mutate and never renew a lease.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol
from uuid import uuid4

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import InboxFull
from exarch_actors.runtime.events import CancelHop, InboxRejected
from exarch_actors.runtime.fleet.inbox import (
    AgentMessage,
    AgentResult,
    ExitSignal,
    InboxMsg,
    PushEffect,
    Surface,
    UserSteering,
)
from exarch_actors.runtime.fleet.inbox import Inbox as AgentInbox
from exarch_actors.runtime.fleet.spawn_tree import (
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
HopRecorder = Callable[[CancelHop], None]


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
    name: str
    token: CancelScope
    eval_root: CancelHandle | None
    inbox: AgentInbox
    interrupt: Callable[[str], None] | None
    on_cancel: Callable[[str], None] | None = None
    ending: Callable[[], None] | None = None
    """Run before the node's token trips: the node learns it is ending before anything
    watching its token can act on the trip (an in-process agent's eval root made terminal)."""
    ends: list[_SubtreeEnd] | None = None
    """The cancels that reached this node and wait for their subtree to end (only while
    someone records hops)."""


class _SubtreeEnd:
    """One cancel's subtree: the nodes it reached that are still registered. Empty and armed
    (the cascade is done), it is reported ended once (a ``CancelHop`` ``ended``)."""

    __slots__ = ("armed", "cause", "live", "root", "signalled")

    def __init__(self, root: str, cause: str) -> None:
        self.root = root
        self.cause = cause
        self.live: set[str] = set()
        self.armed = False
        self.signalled = False
        """Whether it signalled any node (one that reached none new reports nothing)."""


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
        on_hop: HopRecorder | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        """Notified when a lease is armed (a register) or re-timed (``lease_changed``)."""
        self.tree = SpawnTree(clock=clock, lease_bound=lease_bound)
        self._handles: dict[str, _Handles] = {}
        self.on_dropped = on_dropped
        self.on_hop = on_hop
        """Where each :class:`CancelHop` is recorded (None: hops are not recorded)."""
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
                name,
                token if token is not None else CancelScope(),
                eval_root,
                inbox if inbox is not None else AgentInbox(recipient=name),
                interrupt,
                on_cancel,
            )
            self._handles[name] = handles
            self._bind(handles)
            above = self._handles.get(parent) if parent is not None else None
            if node.cancel_cause is not None and above is not None and above.ends:
                handles.ends = list(above.ends)  # its subtree's end waits for it too
                for end in handles.ends:
                    end.live.add(name)
            self.empty.clear()
            self._changed.notify_all()
            entry = self._entry(node)
        if node.cancel_cause is not None:  # its parent's hop passed before it existed
            handles.inbox.signal(ExitSignal(node.parent_name, node.cancel_cause))
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
                self._bind(h)
            if interrupt is not None:
                h.interrupt = interrupt
            if on_cancel is not None:
                h.on_cancel = on_cancel
            if ending is not None:
                h.ending = ending
            cause = node.cancel_cause
        if cause is not None:  # the hop came before these handles: it is sent again to them
            h.inbox.signal(ExitSignal(node.parent_name, cause))

    def deregister(self, name: str) -> bool:
        """The agent ended. Idempotent: ``False`` when it was not registered."""
        with self._lock:
            if not self.tree.is_live(name):
                return False
            node = self.tree.deregister(name)
            h = self._handles.pop(name, None)
            ended = self._ended(name, h)
            parent = self._handles.get(node.parent_name) if node.parent_name else None
            if self.tree.is_empty():
                self.empty.set()
            # no lease wake: an end arms no lease and brings none closer (leases arm at
            # register), and a cascade's 100 ends woke the lease reaper 100 times for nothing
        if parent is not None:  # a parent HeldByChildren re-reads its verdict at once
            parent.inbox.wake()
        for end in ended:
            self._record(CancelHop(end.root, sender=end.root, phase="ended", cause=end.cause))
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

        Idempotent: an agent that already ended yields ``[]``; one already cancelled is sent no
        second signal (a cancelled scope stays cancelled, with its first cause); a name never
        registered raises UnknownAgent.
        """
        return self._cascade(name, cause, include_root=True)

    def cancel_descendants(self, root: str, cause: str = "cancelled") -> list[str]:
        """Abandon ``root``'s children (a returning agent replied); the generation stays."""
        return self._cascade(root, cause, include_root=False)

    def _cascade(self, name: str, cause: str, *, include_root: bool) -> list[str]:
        """Send the first hops (to ``name``, or to each of its live children) and follow the
        hops each reached node sends on to its children, depth first, on this thread: a hop
        is a put on a mailbox's control lane, whose arrival acts at once (module docstring).

        One hop: the recipient marked cancelled (the first cause kept) and sent its exit
        signal, then its live children as of that hop pushed to be signalled next. A node an
        earlier cancel reached is sent nothing and signals no child: that cancel signalled its
        children then, and a child born since was cancelled at its birth; it stays cancelled,
        with its first cause. The loop is written out (no call per hop): a hop costs ~3 us of
        the 1,000-node cascade's per-node budget (docs/benchmarks.md)."""
        tree, lock, handles, on_hop = self.tree, self._lock, self._handles, self.on_hop
        with lock:
            if tree.has_ended(name):
                return []
            top = tree.get(name)  # UnknownAgent for a name never registered
            end = _SubtreeEnd(name, cause) if on_hop is not None else None
            if include_root:
                stack: list[tuple[str | None, SpawnNode]] = [(None, top)]
            else:
                stack = [(name, c) for c in reversed(tree.live_children(name))]
        reached: list[str] = []
        signals: dict[str | None, ExitSignal] = {}
        while stack:
            sender, node = stack.pop()
            recipient = node.name
            with lock:
                reached.append(recipient)
                if not tree.is_live(recipient):
                    # ended before its hop came (a cancel by its parent's end, racing this
                    # one): nothing to signal, but its children are still this cancel's
                    for child in reversed(tree.children_of(node)):
                        stack.append((recipient, child))
                    continue
                if node.cancel_cause is not None:
                    # an earlier cancel signalled it and its subtree (or is doing so on its
                    # own thread: an ending parent's ``cancel_descendants`` racing this one):
                    # nothing is sent again, but its subtree is reached all the same
                    stack.extend((recipient, c) for c in reversed(tree.children_of(node)))
                    continue
                node.cancel_cause = cause
                h = handles[recipient]
                if end is not None:
                    end.signalled = True
                    end.live.add(recipient)
                    if h.ends is None:
                        h.ends = []
                    h.ends.append(end)
                children = tree.children_of(node)
            if on_hop is not None:
                self._record(CancelHop(recipient, sender=sender, phase="sent", cause=cause))
            sig = signals.get(sender)
            if sig is None:
                sig = signals[sender] = ExitSignal(sender, cause)
            h.inbox.signal(sig)
            for child in reversed(children):
                stack.append((recipient, child))
        if end is not None and end.signalled:
            with lock:
                end.armed = True
                done = not end.live
            if done:
                self._record(CancelHop(name, sender=name, phase="ended", cause=cause))
        return reached

    def _bind(self, h: _Handles) -> None:
        """Make ``h``'s mailbox act on an exit signal's arrival (:meth:`_arrive`)."""
        bind = getattr(h.inbox, "bind_signal", None)
        if bind is not None:
            bind(functools.partial(self._arrive, h))

    def _arrive(self, h: _Handles, sig: ExitSignal) -> None:
        """An exit signal arrived on a node's mailbox: its ``ending`` hook, then its token (the
        ``ending`` hook first because a token's trip wakes whoever watches it: an in-process
        agent's shell, busy in a call, re-sent the trip to its host as a plain interrupt when it
        woke before the eval root was made terminal, and the host unwound the call instead of
        being killed with the cascade's cause), then its shell's eval root and its
        ``on_cancel`` hook, which is handed the first cause the registry recorded for the node,
        read under the lock at the hop (a hook that forwards it, a remote scope's frame, needs
        no registry read of its own). ``received`` is recorded here, before the trip, unless the
        node's mailbox records its own arrival (an agent process's)."""
        cause = sig.cause
        if self.on_hop is not None and not getattr(h.inbox, "records_arrival", False):
            # first: the trip may end the node before this thread goes on
            self._record(CancelHop(h.name, sender=sig.sender, phase="received", cause=cause))
        if h.ending is not None:
            try:
                h.ending()
            except Exception:  # one broken hook must not stop the rest of the cascade
                log.exception("ending hook %r failed", h.ending)
        h.token.cancel(cause)
        _trip(h.eval_root, cause)
        if h.on_cancel is not None:
            _trip(h.on_cancel, cause)

    def _ended(self, name: str, h: _Handles | None) -> list[_SubtreeEnd]:
        """Under the lock, at ``name``'s deregistration: the cancels whose subtree it closes."""
        if h is None or not h.ends:
            return []
        done = []
        for end in h.ends:
            end.live.discard(name)
            if end.armed and not end.live:
                end.armed = False  # reported once
                done.append(end)
        return done

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

        Uses the agent's interrupt hook (which trips its current turn's scope); an entry with
        none has no turn to stop, and is only woken. Never its token: that is the node's scope
        for life, and a cancelled scope stays cancelled.
        """
        with self._lock:
            self.tree.get(name)
            h = self._handles[name]
        if h.interrupt is not None:
            h.interrupt(reason)
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
        msg = text if isinstance(text, AgentMessage) else AgentMessage(sender, text, uuid4().hex)
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

    def _record(self, event: InboxRejected | CancelHop) -> None:
        if isinstance(event, CancelHop):
            recorder: Callable[[Any], None] | None = self.on_hop
        else:
            recorder = self.on_dropped
        if recorder is None:
            log.warning("unrecorded: %s", event.to_record())
            return
        try:
            recorder(event)
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
