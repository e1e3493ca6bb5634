"""Deadlines of agent processes started but not yet born.

A spawn of a batch returns once its child's process is started and its boot sent; the child is
admitted and launched when its ``Born`` arrives (``Fleet.spawn``). What the synchronous spawn
got from its wait's timeout -- a process that stalls before ``Born`` is killed, so its spawn
fails and nobody waits for it for ever -- this watch gives the deferred births: one thread for
every pending birth of the fleet, sleeping until the nearest deadline (no poll), started with
the first.

Invariants:
- Each watched birth is either :meth:`BootWatch.done` (its ``Born`` or end of file came) or
  overdue once, when its ``overdue`` callback runs (on the watch's thread; it must not wait:
  killing the process is enough, its end of file then fails the birth).
- :meth:`BootWatch.close` stops the thread; a watch closed calls nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class BootWatch:
    """Births pending, by name, each with its deadline (see the module docstring)."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._pending: dict[str, tuple[float, Callable[[], None]]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, name: str, overdue: Callable[[], None]) -> None:
        """Call ``overdue`` if ``name`` is not :meth:`done` within the timeout."""
        with self._cond:
            if self._closed:
                return
            self._pending[name] = (time.monotonic() + self._timeout, overdue)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="boot-watch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def done(self, name: str) -> None:
        with self._cond:
            self._pending.pop(name, None)

    def __len__(self) -> int:
        with self._cond:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                late = [n for n, (at, _) in self._pending.items() if at <= now]
                fns = [self._pending.pop(n)[1] for n in late]
                if not fns:
                    nearest = min((at for at, _ in self._pending.values()), default=None)
                    self._cond.wait(None if nearest is None else nearest - now)
                    continue
            for fn in fns:
                try:
                    fn()
                except Exception:
                    log.exception("ending an agent process that was not born in time failed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
