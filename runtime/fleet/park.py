"""``park_mode``: the should-park verdict of an agent with an empty inbox.

The verdict is a pure function of explicit inputs so the drive loop can re-evaluate it on every
inbox wake (``Inbox.next_or_idle``) and tests can cover the whole table. Rows, first match wins::

    Quiesce         if conversing ∧ ¬listed        # /clear or /close reaped it: parking = zombie
    Held            if conversing                   # parks for its human, immune to cancellation
    Engaged         if has_parent ∧ returns ∧ engaged  # parks; a terminate cause still ends it
    HeldByChildren  if live_descendants
    HeldByWorkers   if live_workers                 # its workers' results will wake it
    UntilCancelled  if schedules_armed
    Quiesce         otherwise                       # the one-shot contract

``conversing(a) = a.interactive ∧ ¬returns(a)``; ``returns`` is fixed at construction (fork
true, branch false, trunk ``¬interactive``) — see :func:`returns_for`.

``live_workers``: the agent ended its turn while ral workers it spawned were still running (or
their results were being surfaced). Their completions arrive in its inbox as ``Surface`` items,
so waiting for them is the same wait as for live descendants: ending instead would throw away
the work the agent delegated to them.
"""

from __future__ import annotations

import enum


class ParkMode(enum.Enum):
    QUIESCE = "Quiesce"
    HELD = "Held"
    ENGAGED = "Engaged"
    HELD_BY_CHILDREN = "HeldByChildren"
    HELD_BY_WORKERS = "HeldByWorkers"
    UNTIL_CANCELLED = "UntilCancelled"

    @property
    def parks(self) -> bool:
        return self is not ParkMode.QUIESCE


class Construction(enum.Enum):
    """How an agent was built; the only input of :func:`returns_for`."""

    TRUNK = "trunk"
    FORK = "fork"
    BRANCH = "branch"


def returns_for(construction: Construction, *, interactive: bool) -> bool:
    """``returns`` fixed at construction: fork true, branch false, trunk ``¬interactive``."""
    if construction is Construction.FORK:
        return True
    if construction is Construction.BRANCH:
        return False
    return not interactive


def conversing(*, interactive: bool, returns: bool) -> bool:
    """A node built to converse with its human: interactive and not returning."""
    return interactive and not returns


def park_mode(
    *,
    interactive: bool,
    returns: bool,
    has_parent: bool,
    listed: bool,
    engaged: bool,
    live_descendants: bool,
    schedules_armed: bool,
    live_workers: bool = False,
) -> ParkMode:
    """The table in the module docstring: first matching row wins."""
    if conversing(interactive=interactive, returns=returns):
        return ParkMode.HELD if listed else ParkMode.QUIESCE
    if has_parent and returns and engaged:
        return ParkMode.ENGAGED
    if live_descendants:
        return ParkMode.HELD_BY_CHILDREN
    if live_workers:
        return ParkMode.HELD_BY_WORKERS
    if schedules_armed:
        return ParkMode.UNTIL_CANCELLED
    return ParkMode.QUIESCE
