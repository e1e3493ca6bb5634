"""What a shell actor hands its callers: the :class:`ToolResult` of a call, the read-only
:class:`ShellProbe`, the thread-safe :class:`EvalRoot` cancel handle, and the shell's errors.

Invariants:

- **Cancel.** :class:`EvalRoot` bypasses the mailbox: it writes to the host's control path and
  cancels every worker (their scopes are its children). ``cancel`` is sticky until ``clear``
  re-chains a fresh root; ``interrupt`` stops only the run in flight. A host that does not stop
  within :data:`actors.shell.CANCEL_GRACE` is killed and the call rolled back (the shell
  actor's pump enforces it from :meth:`EvalRoot._cancel_requested_at`).
- Every value here is frozen except the handle itself and the pump's private :class:`_Run`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.frames import Frame
from actors.process import ChildProcess
from runtime.cancel import CancelScope
from runtime.errors import ExarchError
from runtime.events import Notice


class ShellBootFailed(ExarchError):
    """A shell host process could not be started or could not restore its snapshot."""


class ShellClosed(ExarchError):
    """The shell was closed; start a new one."""


@dataclass(frozen=True)
class ToolResult:
    """What one ral tool call returned, as the agent sees it."""

    value: str
    """The value's display rendering (``render``)."""
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    """``line:col message`` of the ral error, the cancellation, or the panic; None on success."""
    error_kind: str | None = None
    """``syntax`` | ``elaboration`` | ``runtime`` | ``cancelled`` | ``panic``."""
    referenced: frozenset[str] = frozenset()
    defined: tuple[str, ...] = ()
    compiled: bool = True
    rolled_back: bool = False
    epoch: int = 0
    notices: tuple[Notice, ...] = ()
    """Notices this call produced (also delivered to the ``notice_sink`` when one is installed)."""
    host_pid: int | None = None
    """The shell host that holds the state after this call (a new one after a rollback)."""


@dataclass(frozen=True)
class ShellProbe:
    """Read-only figures for the /resources card; taking them renews nothing."""

    epoch: int
    running_workers: int
    settled_workers: int
    nearest_worker_reap_calls: int | None
    nearest_worker_backstop_secs: float | None
    live_bindings: int
    baseline_bindings: int
    pinned_bindings: int
    nearest_binding_expiry_calls: int | None
    bytes_held: int
    """Encoded bytes of the leased (model-written) bindings."""
    snapshot_bindings_bytes: int
    """Encoded bytes of every session binding in the durable snapshot."""
    host_pid: int | None = None


class EvalRoot:
    """The shell's durable cancel root: a thread-safe handle the registry trips directly.

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
        self.scope.on_cancel(self._on_root_cancelled)

    def cancel(self, reason: str = "cancelled") -> None:
        self.scope.cancel(reason)

    def interrupt(self, reason: str = "interrupt") -> None:
        self._cancel_run(reason)

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
            wake = self._wake
        host.ctl.try_send("cancel", run=run_id, reason=reason)
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


@dataclass
class _Run:
    """What the pump collected for one run."""

    result: Frame | None = None
    snapshot: Frame | None = None
    panic: str | None = None
    awaits: dict[int, str] = field(default_factory=dict)
    harvested: set[str] = field(default_factory=set)
    """Names the run's ``use`` compiles referenced (``harvest`` frames): renewed even if it
    panics, with the script's own."""
