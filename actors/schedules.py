"""Self-wakeups: the ``schedule ID SECONDS PROMPT`` / ``unschedule ID`` verbs.

A schedule is periodic: every ``SECONDS`` it pushes a :class:`ScheduledWakeup` into the agent's
inbox until it is disarmed. The inbox coalesces a still-queued wakeup of the same id (newest
wins), so a slow agent never accumulates a backlog of wakeups. While any schedule is armed the
agent parks ``UntilCancelled``; ``clear``, the agent's end and cancellation disarm every one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from exarch_actors.runtime.fleet.inbox import ScheduledWakeup

MIN_PERIOD = 0.05
"""Seconds. A shorter period would turn a schedule into a busy loop of turns."""


class Schedules:
    """The armed schedules of one agent. Thread-safe."""

    def __init__(self, push: Callable[[ScheduledWakeup], object]) -> None:
        self._push = push
        self._lock = threading.Lock()
        self._timers: dict[str, threading.Timer] = {}
        self._closed = False

    def armed(self) -> bool:
        with self._lock:
            return bool(self._timers)

    def ids(self) -> list[str]:
        with self._lock:
            return sorted(self._timers)

    def arm(self, schedule_id: str, seconds: float, prompt: str) -> None:
        period = max(seconds, MIN_PERIOD)
        with self._lock:
            if self._closed:
                return
            old = self._timers.pop(schedule_id, None)
            if old is not None:
                old.cancel()
            self._start(schedule_id, period, prompt)

    def _start(self, schedule_id: str, period: float, prompt: str) -> None:
        def fire() -> None:
            with self._lock:
                if self._timers.get(schedule_id) is not timer or self._closed:
                    return
                self._start(schedule_id, period, prompt)
            try:
                self._push(ScheduledWakeup(schedule_id, prompt))
            except Exception:  # the schedule source always succeeds; a closed inbox is the end
                pass

        timer = threading.Timer(period, fire)
        timer.daemon = True
        self._timers[schedule_id] = timer
        timer.start()

    def disarm(self, schedule_id: str) -> bool:
        with self._lock:
            timer = self._timers.pop(schedule_id, None)
        if timer is None:
            return False
        timer.cancel()
        return True

    def clear(self, *, close: bool = False) -> None:
        """Disarm everything; with ``close`` no schedule can be armed again."""
        with self._lock:
            timers = list(self._timers.values())
            self._timers.clear()
            if close:
                self._closed = True
        for t in timers:
            t.cancel()
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout=1.0)
