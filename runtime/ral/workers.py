"""Detached workers: the REPL's thread-based backend (the protocol is
:class:`runtime.ral.context.WorkerBackend`).

A worker runs one parameterless closure with a copy of the spawning context, under a cancel
scope that is a child of the session's root scope (so cancelling the root cancels every worker).
The shell host swaps in OS-process workers behind the same protocol.

The thread backend keeps each result until it is claimed by one ``await``; a second ``await``
of the same handle is a ral error (the registry upstream decides retention, not this backend).
A worker's stdout/stderr are buffered and handed to the awaiting run (``take_output``).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.cancel import POLL_INTERVAL, Cancelled, CancelScope
from exarch_actors.runtime.ral.calls import call_closure
from exarch_actors.runtime.ral.context import Desk, DynamicContext
from exarch_actors.runtime.ral.errors import RalError
from exarch_actors.runtime.ral.interp import Interp
from exarch_actors.runtime.ral.natives import build_sigma
from exarch_actors.runtime.ral.values import Closure, WorkerHandle, cancellable_walks


@dataclass
class _Entry:
    scope: CancelScope
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: RalError | None = None
    cancelled: bool = False
    out: str = ""
    err: str = ""


_ids = itertools.count(1)


class ThreadWorkers:
    """Workers as daemon threads in this process (the REPL default)."""

    def __init__(self, *, desk: Desk | None = None, faults: bool = False) -> None:
        self.desk = desk
        self.faults = faults
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._claimed_output: tuple[str, str, str] | None = None

    def configure(self, *, desk: Desk | None, faults: bool) -> None:
        """Called by the owning session so workers see the same Σ as the session."""
        self.desk = desk
        self.faults = faults

    def spawn(self, closure: Closure, ctx: DynamicContext, scope: CancelScope) -> WorkerHandle:
        handle = WorkerHandle(f"w{next(_ids)}")
        entry = _Entry(scope)
        t = threading.Thread(
            target=self._run, args=(entry, closure, ctx), name=f"ral-{handle.id}", daemon=True
        )
        entry.thread = t
        with self._lock:
            self._entries[handle.id] = entry
        t.start()
        return handle

    def _run(self, entry: _Entry, closure: Closure, ctx: DynamicContext) -> None:
        it = Interp(
            ctx=ctx,
            scope=entry.scope,
            sigma=build_sigma(self.desk, self.faults),
            workers=self,
            desk=self.desk,
            # nested workers are detached siblings under the same root, not children of this
            # worker, so they outlive it (its scope is retired when it settles)
            worker_scope=entry.scope.parent or entry.scope,
        )
        try:
            with cancellable_walks(it.poll):
                entry.value = call_closure(it, closure, [], closure.line, closure.col, "worker")
        except RalError as e:
            entry.error = e
        except Cancelled:
            entry.cancelled = True
        except RecursionError:
            entry.error = RalError("recursion limit", closure.line, closure.col)
        except BaseException as e:  # an internal fault in a worker settles it as an error
            entry.error = RalError(f"worker failed: {type(e).__name__}: {e}")
        finally:
            entry.out = "".join(it.out)
            entry.err = "".join(it.err)
            entry.done.set()
            entry.scope.cancel("worker finished")  # retire it so the parent scope prunes it

    def _entry(self, handle: WorkerHandle, who: str) -> _Entry:
        with self._lock:
            e = self._entries.get(handle.id)
        if e is None:
            raise RalError(f"{who}: no worker {handle.id} (already claimed, or never spawned here)")
        return e

    def await_(self, handle: WorkerHandle, scope: CancelScope) -> Any:
        e = self._entry(handle, "await")
        while not e.done.wait(POLL_INTERVAL):
            if scope.cancelled:
                raise Cancelled(scope.reason or "cancelled")
        with self._lock:
            self._entries.pop(handle.id, None)
            self._claimed_output = (handle.id, e.out, e.err)
        if e.cancelled:
            raise RalError(f"worker {handle.id} was cancelled")
        if e.error is not None:
            raise RalError(e.error.message, e.error.line, e.error.col)
        return e.value

    def take_output(self, handle: WorkerHandle) -> tuple[str, str]:
        """The buffered stdout/stderr of a worker just claimed by ``await_`` (once)."""
        with self._lock:
            claimed = self._claimed_output
            if claimed is None or claimed[0] != handle.id:
                return "", ""
            self._claimed_output = None
        return claimed[1], claimed[2]

    def settled(self, handle: WorkerHandle) -> bool:
        return self._entry(handle, "settled").done.is_set()

    def cancel(self, handle: WorkerHandle) -> None:
        self._entry(handle, "cancel").scope.cancel("cancelled")

    def running(self) -> list[WorkerHandle]:
        with self._lock:
            return [WorkerHandle(k) for k, e in self._entries.items() if not e.done.is_set()]

    def shutdown(self, timeout: float = 1.0) -> None:
        """Cancel every worker and wait (bounded) for their threads to end."""
        with self._lock:
            entries = list(self._entries.values())
        for e in entries:
            e.scope.cancel("shutdown")
        for e in entries:
            if e.thread is not None:
                e.thread.join(timeout)
