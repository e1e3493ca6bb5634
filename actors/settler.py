"""The settler: one thread that settles agent processes' ends in order, off their readers.

An agent process that ended in order (its shell stopped and reaped before ``Ended``) leaves a
settlement that waits on no host: journal records, the teardown receipt, the result sent to
its parent without waiting (``RemoteInbox.send_push``), ``Died``. It still takes the registry's
lock, so it must not run on a channel's reader: a steer or a message pushes into a host under
that lock and waits for the reply that host's reader reads. Handed to the fleet's pool, each
end cost a ``ThreadPoolExecutor.submit`` (a future, a lock, a semaphore) and a pool thread's
wake-up (the 100-agent cascade's pool threads, which also answer the hosts' site calls,
spent ~59 ms of the control process's CPU).
Here an end is a tuple on a :class:`queue.SimpleQueue` that one thread drains; while a
cascade's ends keep coming it never sleeps between them (docs/benchmarks.md).

Invariants:
- Ends are settled one at a time, in the order they were submitted.
- After :meth:`Settler.close` returns, every end submitted before it has been settled and the
  thread has ended; an end submitted after it is settled in the caller's thread.
- A settlement that raises is logged; the ends after it are still settled.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_Item = tuple[Callable[..., Any], tuple[Any, ...]]


class Settler:
    """The fleet's one settling thread (see the module docstring)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="settler", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Settle ``fn(*args)`` on the settler's thread, after every end submitted before."""
        with self._lock:
            if not self._closed:
                self._queue.put((fn, args))
                return
        fn(*args)  # the fleet is closing: no thread is left to hand it to

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:
                log.exception("settling an agent's end failed")

    def close(self) -> None:
        """Settle what was submitted, then end the thread. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()
