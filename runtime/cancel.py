"""Cancel scopes: the one cooperative cancellation primitive of the runtime.

A :class:`CancelScope` is a tree node. Cancelling a scope cancels every scope below it, because
``cancelled`` walks the ancestors (a scope is cancelled when any ancestor is): a worker's scope
is a child of its shell's durable root, so tripping the root reaches every worker with no edge
of its own. Cancelling is thread-safe and idempotent, and a cancelled scope stays cancelled:
there is no way back. Whoever needs a fresh scope after a cancel (an agent's next turn after an
interrupt, a shell's root after ``clear``) makes a new one, and drops the old one from its
parent with :meth:`detach`.

Waiters block on :meth:`wait` (an Event per scope, set on the whole subtree when an ancestor is
cancelled), so poll points that sleep or wait on a process wake within one poll interval.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

POLL_INTERVAL = 0.01
"""Seconds between cancellation checks while waiting on a program or a worker.

10 ms keeps docs/language.md's 100 ms cancellation bound with a 10x margin; measured cost of the
poll
loop is below 1% of one core.
"""


class Cancelled(BaseException):
    """Raised at a poll point of a cancelled scope.

    A ``BaseException`` on purpose: ``try``/``catch`` in ral and ordinary ``except Exception``
    handlers in the runtime must not swallow cancellation.
    """

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class CancelScope:
    """A node in the cancellation tree.

    The :class:`threading.Event` that :meth:`wait` blocks on is made on the first ``wait``, not
    with the scope: most scopes (one per ral run) are never waited on, and making and setting an
    Event cost ~3 us of a ~10 us trivial run. ``_done`` is the truth; the Event, once it exists,
    is set under the same lock whenever ``_done`` is."""

    __slots__ = ("_callbacks", "_children", "_done", "_event", "_lock", "_reason", "parent")

    def __init__(self, parent: CancelScope | None = None) -> None:
        self.parent = parent
        self._done = False
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._children: list[CancelScope] = []
        self._callbacks: list[Callable[[], None]] = []
        self._reason: str | None = None
        if parent is not None:
            parent._adopt(self)

    def _adopt(self, child: CancelScope) -> None:
        with self._lock:
            self._children = [c for c in self._children if not c._done]
            self._children.append(child)
            already = self._done
            reason = self._reason
        if already:
            child.cancel(reason or "cancelled")

    def child(self) -> CancelScope:
        """A new scope that is cancelled whenever this one is."""
        return CancelScope(self)

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel this scope and its whole subtree; run registered callbacks once."""
        with self._lock:
            if self._done:
                return
            self._reason = reason
            self._done = True
            if self._event is not None:
                self._event.set()
            children = self._children
            self._children = []
            callbacks = self._callbacks
            self._callbacks = []
        for cb in callbacks:
            try:
                cb()
            except Exception:  # a callback failing must not stop the cascade
                pass
        for c in children:
            c.cancel(reason)

    @property
    def cancelled(self) -> bool:
        scope: CancelScope | None = self
        while scope is not None:
            if scope._done:
                return True
            scope = scope.parent
        return False

    @property
    def reason(self) -> str | None:
        scope: CancelScope | None = self
        while scope is not None:
            if scope._done:
                return scope._reason
            scope = scope.parent
        return None

    def check(self) -> None:
        """A poll point: raise :class:`Cancelled` if this scope or an ancestor is cancelled."""
        if self.cancelled:
            raise Cancelled(self.reason or "cancelled")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` passes; return whether cancelled."""
        with self._lock:
            event = self._event
            if event is None:
                event = self._event = threading.Event()
                if self._done:
                    event.set()
        return event.wait(timeout) or self.cancelled

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once when this scope is cancelled (at once if it already is)."""
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback()

    def discard_callback(self, callback: Callable[[], None]) -> None:
        """Forget ``callback`` if it has not run (a watcher that stopped watching): a scope that
        lives across many waits keeps no callback per wait."""
        with self._lock:
            self._callbacks = [cb for cb in self._callbacks if cb is not callback]

    def detach(self) -> None:
        """Leave the parent's list of children (a scope its owner replaced with a fresh one):
        a long-lived parent keeps no child per replaced scope. The scope is still cancelled
        whenever its parent is, since ``cancelled`` walks the ancestors."""
        parent = self.parent
        if parent is None:
            return
        with parent._lock:
            parent._children = [c for c in parent._children if c is not self]
