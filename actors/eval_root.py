"""The shell's cancel root: :class:`EvalRoot`, a thread-safe handle on the shell's root scope.

Invariants:

- Its agent's scope trips it when a cancel's exit signal arrives on the agent's mailbox (the
  arrival runs in the sender's thread, ``runtime/fleet/registry.py``); it writes to the host's
  control path -- the one frame that bridges the scope into the host process -- and cancels
  every worker (their scopes are its children). A cancelled root stays cancelled: ``clear``
  makes a fresh one; ``interrupt`` stops only the run in flight. A host that does not stop within
  :data:`actors.shell.CANCEL_GRACE` is killed and the call rolled back (the shell actor's pump
  enforces it from :meth:`EvalRoot._cancel_requested_at`).
- Once :meth:`EvalRoot.make_terminal` was called (its agent is ending), a cancel of the run in
  flight SIGKILLs its host instead of asking it to stop: nothing will run on that host again,
  so its cancelled answer (the interpreter's unwind, the boundary snapshot, the checkpoint of
  it) is work nobody reads. The shell actor's pump sees :meth:`EvalRoot.killed` and answers
  the call as cancelled without waiting for the host's exit (which includes the kernel's
  reclaim of its memory: for an agent process's host, behind the living, its main thread in
  the idle class, :func:`actors.priority.to_idle_class`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from exarch_actors.actors.process import ChildProcess
from exarch_actors.runtime.cancel import CancelScope

KILL_RECORD_WAIT = 5.0
"""Seconds a pump that saw its host die waits for a terminal cancel's kill of it, under way,
to be recorded (a SIGKILL and a read of the host's children from /proc: microseconds, unless
the killing thread is preempted)."""


class EvalRoot:
    """The shell's durable cancel root: a thread-safe handle its agent's scope trips.

    ``cancel`` is sticky (the registry's cascade): it cancels the run in flight through the
    host's control path, cancels every worker (each worker's scope is a child of :attr:`scope`),
    and refuses later runs as cancelled until ``clear`` re-chains a fresh root. ``interrupt``
    stops only the run in flight (a per-tab Esc) and leaves the workers running.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.scope = CancelScope()
        self._host: ChildProcess | None = None
        self._run_id: int | None = None
        self._cancel_at: float | None = None
        self._wake: Callable[[], None] | None = None
        self._terminal = False
        self._behind = False
        self._after_kill: Callable[[], None] | None = None
        self._killing: ChildProcess | None = None
        """The host a terminal cancel is killing (one thread kills it, once)."""
        self._killed: ChildProcess | None = None
        """That host once its SIGKILL was sent: what :meth:`killed` reads."""
        self._kill_recorded = threading.Event()
        """Set once the kill of :attr:`_killing` is recorded (:meth:`killed_when_dead`)."""
        self._kill_reason = "cancelled"
        self.killed_at: float | None = None
        """When (``time.time``) a terminal cancel's SIGKILL reached the run in flight: the
        instant the cascade stopped this shell's evaluation (None: it stopped none)."""
        self.scope.on_cancel(self._on_root_cancelled)

    def cancel(self, reason: str = "cancelled") -> None:
        self.scope.cancel(reason)

    def interrupt(self, reason: str = "interrupt") -> None:
        self._cancel_run(reason)

    def make_terminal(
        self, *, behind: bool = False, after_kill: Callable[[], None] | None = None
    ) -> None:
        """From now on a cancel of the run in flight kills its host (see the module docstring).
        Set before the agent's token is cancelled, so that an interrupt the agent re-sends on
        seeing its token (``await_run``) already kills rather than asks. Never undone: only an
        agent that is ending is made terminal.

        ``behind``: the host is killed behind the living (:meth:`ChildProcess.kill_behind`,
        its reclaim in the idle class), for an owner that reaps it once its end is reported
        (an agent process). Without it the host exits at its own nice: an in-process agent's
        end closes its shell and waits for that exit, which behind the living on a busy box
        took seconds.
        ``after_kill``: called on the thread that killed, once the SIGKILL is sent (an agent
        process stands back there: not before, which demoted a kill in progress)."""
        with self._lock:
            self._terminal = True
            self._behind = behind
            self._after_kill = after_kill

    def end(self, reason: str = "cancelled") -> None:
        """A terminal cancel: :meth:`make_terminal`, then :meth:`cancel` (the registry's
        cascade into an in-process agent, which ends it)."""
        self.make_terminal()
        self.cancel(reason)

    def killed(self, host: ChildProcess) -> str | None:
        """Why ``host`` was killed by a terminal cancel (it runs no instruction more): the
        cause the cancel carried, which the root's own reason may not hold yet (the agent's
        re-sent interrupt can kill before the cascade trips the root); None if it was not."""
        # read on every turn of the pump's loop: no lock (the reason is set before the host)
        return self._kill_reason if self._killed is host else None

    def killed_when_dead(self, host: ChildProcess) -> str | None:
        """:meth:`killed`, for a pump that saw ``host`` die: the SIGKILL of a terminal cancel
        is recorded only once sent, so the pump can see the death first, and answered a
        cancelled call as a panic (rolled back; 1 run in 40 of a `/bin/sleep` so cancelled,
        its program killed before the host). While that kill is under way this waits for its
        record (at most :data:`KILL_RECORD_WAIT`)."""
        with self._lock:
            underway = self._killing is host and self._killed is not host
            recorded = self._kill_recorded
        if underway:
            recorded.wait(KILL_RECORD_WAIT)
        return self.killed(host)

    @property
    def cancelled(self) -> bool:
        return self.scope.cancelled

    @property
    def reason(self) -> str | None:
        return self.scope.reason

    @property
    def busy(self) -> bool:
        """Whether a run is in flight on the host (a cancel now reaches it)."""
        with self._lock:
            return self._run_id is not None

    def _on_root_cancelled(self) -> None:
        self._cancel_run(self.scope.reason or "cancelled")

    def _cancel_run(self, reason: str) -> None:
        with self._lock:
            host, run_id = self._host, self._run_id
            if host is None or run_id is None:
                return
            if self._cancel_at is None:
                self._cancel_at = time.monotonic()
            wake, after = self._wake, None
            kill = self._terminal and self._killing is not host
            if kill:
                self._killing = host
                self._kill_recorded = threading.Event()
        if kill:
            if self._behind:
                host.kill_behind()
            else:
                host.kill()
            with self._lock:  # only now: the pump answers once the SIGKILL is sent
                self._kill_reason = reason
                self._killed = host
                self.killed_at = time.time()
                after = self._after_kill
                self._kill_recorded.set()
        elif self._killing is not host:
            host.ctl.try_send("cancel", run=run_id, reason=reason)
        if kill and after is not None:
            after()
        if wake is not None:
            # The pump blocks on the host's data pipe; a host spinning in C code never writes
            # to it, so the pump must be woken to start counting the cancellation grace.
            wake()

    def _attach(
        self, host: ChildProcess, run_id: int, wake: Callable[[], None] | None = None
    ) -> None:
        with self._lock:
            self._host, self._run_id, self._cancel_at = host, run_id, None
            self._wake = wake
        if self.scope.cancelled:  # tripped while the run frame was on its way
            self._cancel_run(self.scope.reason or "cancelled")

    def _detach(self) -> None:
        with self._lock:
            self._run_id, self._cancel_at, self._wake = None, None, None

    def _cancel_requested_at(self) -> float | None:
        with self._lock:
            return self._cancel_at

    def _rechain(self) -> None:
        """``clear``: a fresh scope, so no cancellation residue is carried forward."""
        scope = CancelScope()
        scope.on_cancel(self._on_root_cancelled)
        with self._lock:
            self.scope = scope
