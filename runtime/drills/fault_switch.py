"""The fault switch: whether a new ral shell binds the ``fault`` native (docs/language.md).

``fault crash|panic|hang|spin`` breaks the shell on purpose; drills and tests need it, a real run
must never have it. A shell is built with an explicit ``faults=`` when its builder knows; when
it does not (``faults=None``), :func:`faults_enabled` decides, and it is on only

- inside :func:`injecting_faults` -- a scoped switch: the drill turns it on for the rounds it
  runs in its own process and it is off again when the drill returns, whatever happened; or
- when the process was *started* with ``EXARCH_FAULTS=1`` in its environment (the user's
  switch; read here and nowhere else, never set by this repository for itself: a drill gives it
  to the ``exarch-actors run`` child it starts, in that child's environment alone).

The switch is read when a shell is built, so a shell keeps the answer it was built with; the
shell host and ral workers get it explicitly from their shell.

A **crash point** (:func:`crash_point`) is a named window in the control process where a drill
or a test needs a SIGKILL to land exactly: with the switch on and ``EXARCH_CRASH_AT`` naming it,
the process SIGKILLs itself there (a timed kill rarely lands in a window microseconds wide).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

FAULTS_ENV = "EXARCH_FAULTS"
CRASH_AT_ENV = "EXARCH_CRASH_AT"

CRASH_POINTS = frozenset({"settled-before-delivery", "delivered-before-died"})
"""The named windows (:func:`crash_point`): a child's settlement record written and its result
not yet delivered to its parent; delivered, and its ``Died`` not yet on the bus."""

_lock = threading.Lock()
_scopes = 0


def faults_enabled() -> bool:
    """Whether a shell built now without an explicit ``faults=`` binds ``fault``."""
    with _lock:
        if _scopes > 0:
            return True
    return os.environ.get(FAULTS_ENV) == "1"


@contextmanager
def injecting_faults() -> Iterator[None]:
    """Fault injection on for every shell built inside the block (nests; thread-safe)."""
    global _scopes
    with _lock:
        _scopes += 1
    try:
        yield
    finally:
        with _lock:
            _scopes -= 1


def crash_point(name: str) -> None:
    """SIGKILL this process here if fault injection is on and ``EXARCH_CRASH_AT`` is ``name``
    (one of :data:`CRASH_POINTS`): the window's far side never runs, as in a control process
    killed there. Off (one environment read) in a real run."""
    assert name in CRASH_POINTS, name
    if os.environ.get(CRASH_AT_ENV) == name and faults_enabled():
        os.kill(os.getpid(), signal.SIGKILL)
