"""The host reaper: settled agents' processes told to exit and collected, off the settlement path.

An agent process that reported its end (``Ended``) has its slot settled at once; only its exit
is left, and that is this module's. :class:`HostReaper` holds such hosts until the ends stop
arriving, then tells them all to exit together and collects each on a thread of its own, so neither
a settlement nor a cascade's later ends wait on an exit (``actors/agent_process.py`` hands
hosts over in :meth:`actors.agent_process.ProcessAgent.release`).

Invariants:
- Every host handed over is told to exit and collected, by the reaper or -- once it is closed --
  by the caller at once: nothing outlives the fleet that started it.
- One host's failure to be collected is logged and never stops the others'.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

log = logging.getLogger(__name__)


class Reapable(Protocol):
    """What the reaper asks of a host: to exit, then to be collected (its process joined and
    reaped, its shell's too)."""

    def ask_to_exit(self, reason: str) -> None: ...

    def collect(self) -> None: ...


RELEASE_QUIET = 0.1
"""Seconds without another agent's end before the settled hosts held by :class:`HostReaper`
are told to exit. An agent process's exit costs ~2 ms of CPU (perf's task-clock, from its
``Shutdown`` to its reaping) and its shell's ~0.5 ms: told at once, the first agents of a
100-agent cascade exited on the same two cores as the cancels still in flight."""

RELEASE_LATEST = 1.0
"""Seconds a settled host may be held at most, however many ends keep following it (a steady
stream of ends must not hold every finished process)."""


class HostReaper:
    """Tells the hosts of settled agents to exit and collects them, off the settlement path.

    A host handed over (:meth:`ProcessAgent.release`) has ended and its slot is settled: only
    its exit is left. The reaper holds it until no other end has arrived for
    :data:`RELEASE_QUIET` (at most :data:`RELEASE_LATEST`), then tells every host it holds to
    exit, so they exit in parallel, and hands them to its collector thread, which waits for
    each and reaps it and its shell, in order. So a cascade's ends are not slowed by the exits
    of the agents that ended before them, and a later batch is told without waiting for an
    earlier one's collection. :meth:`close` tells whatever it still holds at once and returns once
    every host handed over is collected, so nothing outlives the fleet that started it."""

    def __init__(self, quiet: float = RELEASE_QUIET, latest: float = RELEASE_LATEST) -> None:
        self._quiet, self._latest = quiet, latest
        self._held: list[Reapable] = []
        self._last = 0.0
        self._cond = threading.Condition()
        self._closed = False
        self._collecting: list[Reapable] = []
        self._told = threading.Condition()
        self._done_telling = False
        self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
        self._collector = threading.Thread(target=self._collect_all, name="collector", daemon=True)
        self._thread.start()
        self._collector.start()

    def reap(self, host: Reapable) -> None:
        with self._cond:
            if not self._closed:
                # the thread waits for a deadline it re-reads from ``_last`` when it wakes:
                # only an empty reaper needs waking (a wake per end of a cascade was ~100
                # futex round trips and re-computed deadlines)
                idle = not self._held
                self._held.append(host)
                self._last = time.monotonic()
                if idle:
                    self._cond.notify()
                return
        host.ask_to_exit("shutdown")  # closed: the caller collects it itself
        _collect(host)

    def held(self) -> int:
        """Hosts handed over and not yet told to exit."""
        with self._cond:
            return len(self._held)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._held and not self._closed:
                        self._cond.wait()
                    if not self._held:
                        return
                    first = time.monotonic()
                    while not self._closed:
                        due = min(self._last + self._quiet, first + self._latest)
                        now = time.monotonic()
                        if now >= due:
                            break
                        self._cond.wait(due - now)
                    batch, self._held = self._held, []
                for host in batch:
                    host.ask_to_exit("shutdown")
                with self._told:
                    self._collecting.extend(batch)
                    self._told.notify()
        finally:
            with self._told:
                self._done_telling = True
                self._told.notify()

    def _collect_all(self) -> None:
        """The collector's thread: every host told to exit, collected in the order told. Apart
        from the telling, so a batch that comes due while an earlier one is still being
        collected (each host waited for in turn, its exit in the idle class) is told at once:
        a 300-agent cascade's last tenth of hosts was told ~0.9 s after the rest, once the
        first batch had all exited (docs/benchmarks.md)."""
        while True:
            with self._told:
                while not self._collecting and not self._done_telling:
                    self._told.wait()
                if not self._collecting:
                    return
                batch, self._collecting = self._collecting, []
            for host in batch:
                _collect(host)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._collector.join()


def _collect(host: Reapable) -> None:
    try:
        host.collect()
    except Exception:  # one host's failure must not stop the others' collection
        log.exception("collecting an agent process failed")
