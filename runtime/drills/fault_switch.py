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

The same switch guards the *pause points* (:func:`pause_point`): named moments of a run where a
test kills the control process for real, at exactly that moment rather than at a guessed time.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

FAULTS_ENV = "EXARCH_FAULTS"
PAUSE_ENV = "EXARCH_PAUSE_AT"
"""With ``EXARCH_FAULTS=1``: the name of the :func:`pause_point` at which the process stops."""

PAUSE_POINTS = ("run-spec-written", "birth-before-admission", "admitted-before-launch")
"""Every pause point there is: ``run-spec-written`` -- ``run.json`` written, nothing else of
the run yet (no transcript, no journal, no agent): a kill there is a kill during start-up;
``birth-before-admission`` -- an agent process's child was spawned (its parent has its
receipt) and reported ``Born``, and the fleet has not yet admitted it in the journal;
``admitted-before-launch`` -- such a child admitted (``dispatched``), not launched: its prompt
is in no log yet."""

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


def pause_point(name: str) -> None:
    """Stop this process (``SIGSTOP``) here when it was started with ``EXARCH_FAULTS=1`` and
    ``EXARCH_PAUSE_AT=name``, so whoever started it can SIGKILL it at exactly this moment
    (``tests/drills/test_startup_kill.py``, ``tests/drills/test_birth_kill.py``); otherwise
    nothing but an environment read."""
    assert name in PAUSE_POINTS, name
    if os.environ.get(PAUSE_ENV) == name and os.environ.get(FAULTS_ENV) == "1":
        # sent to this thread: it stops on the way out of the call, before its next step (a
        # signal sent to the process may be taken by another thread, and this one ran on for
        # a few milliseconds -- far enough to pass the moment)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
