"""The Registry actor: the fleet's spawn tree, its cancellation cascade and its idle leases
(docs/architecture.md, Cancellation: the cascade reaches both the agents and their shells).

Two doors onto one lock-protected state, :class:`FleetRegistry`:

- the **actor** (:class:`Registry`, a :class:`actors.mailbox.QuotaActor`) serialises mutations
  from other actors; ``cancel``, ``cancel_descendants``, ``clear_subtree`` and ``interrupt`` are
  control methods, so they are never quota-checked, jump queued work, and trip every token in
  the *caller's* thread the moment they are put;
- the **core** (:attr:`Registry.core`, also returned by :func:`start_registry`) answers the
  park verdict's reads (``is_live``, ``engaged``, ``live_descendants``) and the spawn site's
  ``deliver`` synchronously, so a busy registry mailbox can never stall a parked agent.

The cascade travels hop by hop down the spawn tree: each node it reaches is sent an exit
signal on its mailbox's control lane (never quota-refused, ahead of queued turns), whose
arrival trips the node's own scope -- its cooperative token and its shell's eval root -- before
the node's children are sent theirs, so a node busy in a long handler or an in-flight ral
evaluation is reached at its next poll point (:mod:`runtime.fleet.registry`).

The core and its value types live in :mod:`runtime.fleet.registry`; this module holds the actor,
its lease-reaper thread and :func:`start_registry`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import pykka
from pykka import messages as pykka_messages

from exarch_actors.actors.mailbox import QuotaActor
from exarch_actors.runtime.fleet.inbox import AgentMessage, AgentResult, PushEffect, Surface
from exarch_actors.runtime.fleet.registry import (
    Entry,
    FleetRegistry,
    HopRecorder,
    LeaseReport,
    RejectionRecorder,
)
from exarch_actors.runtime.fleet.spawn_tree import IDLE_LEASE_SECS, Clock


class _LeaseReaper:
    """A thread that fires leases and re-arms for the remaining margin (real time)."""

    def __init__(self, core: FleetRegistry, *, max_wait: float = 60.0) -> None:
        self.core = core
        self.max_wait = max_wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            report = self.core.fire_leases()
            wait = (
                self.max_wait if report.next_fire is None else min(report.next_fire, self.max_wait)
            )
            # a register arms a new lease: wake on any change rather than sleeping past it
            self.core.wait_changed(max(wait, 0.001))

    def stop(self) -> None:
        self._stop.set()
        self.core.lease_changed()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


_CONTROL_OPS = ("cancel", "cancel_descendants", "clear_subtree", "interrupt")


class Registry(QuotaActor):
    """The registry actor. Methods mirror :class:`FleetRegistry`; see the module docstring."""

    control_methods: ClassVar[frozenset[str]] = frozenset(_CONTROL_OPS)

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        lease_bound: float = IDLE_LEASE_SECS,
        on_dropped: RejectionRecorder | None = None,
        lease_timer: bool = True,
        core: FleetRegistry | None = None,
    ) -> None:
        self.core = core or FleetRegistry(
            clock=clock, lease_bound=lease_bound, on_dropped=on_dropped
        )
        self._arrived_lock = threading.Lock()
        self._arrived: dict[int, tuple[Any, tuple[bool, Any]]] = {}
        super().__init__()
        self._reaper = _LeaseReaper(self.core) if lease_timer else None

    def mailbox_recipient(self) -> str:
        return "registry"

    def on_start(self) -> None:
        if self._reaper is not None:
            self._reaper.start()

    def on_stop(self) -> None:
        if self._reaper is not None:
            self._reaper.stop()

    def on_failure(self, *exc: Any) -> None:
        self.on_stop()

    def on_control_arrival(self, message: Any) -> None:
        """Run a control call (cancel, cancel_descendants, clear_subtree, interrupt) in the
        caller's thread the moment it is put; the actor thread only hands back the outcome,
        in mailbox order, when it serves the queued call. Each runs exactly once."""
        if (
            isinstance(message, pykka_messages.ProxyCall)
            and message.attr_path
            and message.attr_path[-1] in _CONTROL_OPS
        ):
            op = getattr(self.core, message.attr_path[-1])
            try:
                outcome: tuple[bool, Any] = (True, op(*message.args, **message.kwargs))
            except Exception as e:  # handed to the caller when the call is served
                outcome = (False, e)
            with self._arrived_lock:
                self._arrived[id(message)] = (message, outcome)
            return
        super().on_control_arrival(message)

    def _handle_receive(self, message: Any) -> Any:
        if isinstance(message, pykka_messages.ProxyCall):
            with self._arrived_lock:
                held = self._arrived.pop(id(message), None)
            if held is not None and held[0] is message:
                ok, value = held[1]
                if ok:
                    return value
                raise value
        return super()._handle_receive(message)

    # -- mutations --

    def register(self, name: str, parent: str | None = None, **kw: Any) -> Entry:
        return self.core.register(name, parent, **kw)

    def attach(self, name: str, **kw: Any) -> None:
        self.core.attach(name, **kw)

    def deregister(self, name: str) -> bool:
        return self.core.deregister(name)

    def cancel(self, name: str, cause: str = "cancelled") -> list[str]:
        return self.core.cancel(name, cause)

    def cancel_descendants(self, root: str, cause: str = "cancelled") -> list[str]:
        return self.core.cancel_descendants(root, cause)

    def clear_subtree(self, root: str, cause: str = "clear", *, include_root: bool = False) -> int:
        return self.core.clear_subtree(root, cause, include_root=include_root)

    def interrupt(self, name: str, reason: str = "interrupt") -> None:
        self.core.interrupt(name, reason)

    def steer(self, name: str, text: str) -> PushEffect:
        return self.core.steer(name, text)

    def message(self, sender: str, name: str, text: str | AgentMessage) -> PushEffect:
        return self.core.message(sender, name, text)

    def record_exchange(self, name: str) -> None:
        self.core.record_exchange(name)

    def deliver(self, recipient: str, msg: AgentResult | Surface, **kw: Any) -> str:
        return self.core.deliver(recipient, msg, **kw)

    def fire_leases(self) -> LeaseReport:
        return self.core.fire_leases()

    # -- reads (prefer the core for these; they are here for actor-only callers) --

    def lookup(self, name: str) -> Entry | None:
        return self.core.lookup(name)

    def is_live(self, name: str) -> bool:
        return self.core.is_live(name)

    def live_descendants(self, name: str) -> list[str]:
        return self.core.live_descendants(name)

    def is_descendant(self, ancestor: str, name: str) -> bool:
        return self.core.is_descendant(ancestor, name)

    def engaged(self, name: str) -> bool:
        return self.core.engaged(name)

    def lease_figures(self, name: str) -> dict[str, float | None]:
        return self.core.lease_figures(name)

    def child_fuel(self, parent: str) -> int:
        return self.core.child_fuel(parent)

    def is_empty(self) -> bool:
        return self.core.is_empty()


@dataclass(frozen=True)
class RegistryHandle:
    """What :func:`start_registry` returns: the actor ref, its proxy, and the core for reads."""

    ref: pykka.ActorRef[Registry]
    core: FleetRegistry

    @property
    def proxy(self) -> pykka.ActorProxy[Registry]:
        return self.ref.proxy()

    def stop(self, timeout: float | None = 5.0) -> None:
        self.ref.stop(block=True, timeout=timeout)


def start_registry(
    *,
    clock: Clock = time.monotonic,
    lease_bound: float = IDLE_LEASE_SECS,
    on_dropped: RejectionRecorder | None = None,
    on_hop: HopRecorder | None = None,
    lease_timer: bool = True,
) -> RegistryHandle:
    """Start a Registry actor; the caller stops it with ``handle.stop()``."""
    core = FleetRegistry(clock=clock, lease_bound=lease_bound, on_dropped=on_dropped, on_hop=on_hop)
    ref = Registry.start(core=core, lease_timer=lease_timer)
    return RegistryHandle(ref, core)
