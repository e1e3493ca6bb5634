"""The supervisor's restart rule for agent hosts, OTP style: restart intensity over a window.

When an agent host ends unexpectedly (its channel reaches end of file without a ``Died`` frame:
SIGKILL, an exception escaping its drive loop, a crash in a C extension), the supervisor asks
this rule what to do: restart the agent from its durable event log and snapshot, or, once the
agent has crashed too often, settle it ``down`` with the cause (its parent is told as for any
other terminal status).

The rule (Erlang/OTP's ``intensity`` and ``period``): a crash is answered with a restart when
fewer than :data:`MAX_RESTARTS` restarts happened within the last :data:`RESTART_WINDOW`
seconds; otherwise the agent settles ``down``. Counting restarts in a sliding window (not
crashes since boot) lets a long-lived agent that crashes rarely keep recovering, while a crash
loop -- a poisoned snapshot, a provider bug hit at every turn -- stops after three attempts
instead of burning the machine.

Invariants (checked by Hypothesis over random crash timelines in
``tests/agent_host/test_supervision.py``):

- within any window of ``window`` seconds at most ``max_restarts`` restarts are granted;
- a crash is refused only when ``max_restarts`` restarts already lie in the window before it;
- once ``down`` the agent stays down: every later crash report is answered ``down`` again with
  the original cause, and nothing restarts it;
- the clock is injected (``now`` arguments), so the rule never reads time itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

MAX_RESTARTS = 3
"""Restarts granted per agent within :data:`RESTART_WINDOW` (OTP's ``intensity``)."""

RESTART_WINDOW = 60.0
"""Seconds over which restarts are counted (OTP's ``period``)."""


class Action(StrEnum):
    RESTART = "restart"
    DOWN = "down"


@dataclass(frozen=True)
class Decision:
    """What the supervisor does about one crash."""

    action: Action
    cause: str
    """The crash's cause; for ``down``, the crash that exhausted the intensity."""
    restarts_in_window: int
    """Restarts within the window *after* this decision (a restart counts itself)."""

    @property
    def detail(self) -> str:
        if self.action is Action.RESTART:
            return (
                f"restart {self.restarts_in_window} of {MAX_RESTARTS} in the window: {self.cause}"
            )
        return f"down: crashed past its restart intensity: {self.cause}"


@dataclass
class RestartIntensity:
    """One agent's restart history under the rule; pure, not thread-safe."""

    max_restarts: int = MAX_RESTARTS
    window: float = RESTART_WINDOW
    _restarts: deque[float] = field(default_factory=deque)
    _down: Decision | None = None

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window <= 0:
            raise ValueError("max_restarts must be >= 0 and window > 0")

    @property
    def down(self) -> Decision | None:
        """The decision that settled the agent ``down``, or None while it may still restart."""
        return self._down

    def crashed(self, now: float, cause: str) -> Decision:
        """Record a crash at ``now`` (monotonic seconds, non-decreasing) and decide."""
        if self._down is not None:
            return self._down
        while self._restarts and self._restarts[0] <= now - self.window:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            self._down = Decision(Action.DOWN, cause, len(self._restarts))
            return self._down
        self._restarts.append(now)
        return Decision(Action.RESTART, cause, len(self._restarts))
