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
A **pause point** (:func:`pause_point`) is a named moment where a test needs the control
process (or an agent process) stopped while the rest of the system goes on (an agent process
logs what it was answered): with ``EXARCH_PAUSE_AT`` naming it, the process stops itself
(``SIGSTOP``) there, and the test SIGKILLs it once what it waits for has happened.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

FAULTS_ENV = "EXARCH_FAULTS"
CRASH_AT_ENV = "EXARCH_CRASH_AT"

CRASH_POINTS = frozenset(
    {"settled-before-delivery", "delivered-before-died", "message-sent-before-logged"}
)
"""The named windows (:func:`crash_point`): a child's settlement record written and its result
not yet delivered to its parent; delivered, and its ``Died`` not yet on the bus; an agent
``message`` taken by its recipient's inbox and recorded (``MessageSent``), its sender's call not
yet returned, the recipient's log not yet holding it (a recipient busy in a call logs it only
after)."""

PAUSE_ENV = "EXARCH_PAUSE_AT"
"""With the switch on: the name of the :func:`pause_point` at which the process stops."""

PAUSE_POINTS = frozenset(
    {
        "run-spec-written",
        "birth-before-admission",
        "admitted-before-launch",
        "ended-before-settlement",
        "drive-ended-before-report",
        "trunk-ended-before-died",
    }
)
"""Every pause point there is: ``run-spec-written`` -- ``run.json`` written, nothing else of
the run yet (no transcript, no journal, no agent): a kill there is a kill during start-up;
``birth-before-admission`` -- an agent process's child was spawned (its parent has its
receipt) and reported ``Born``, and the fleet has not yet admitted it in the journal;
``admitted-before-launch`` -- such a child admitted (``dispatched``), not launched: its prompt
is in no log yet; ``ended-before-settlement`` -- a child's drive ended (a reply's call logged
in its event log), its settlement not yet written: a disk filled there refuses it
(``tests/durability/test_disk_full.py``); ``drive-ended-before-report`` -- in an agent
process: its agent's drive ended, its ``Ended`` report not yet sent: a kill there is a crash
the supervisor restarts (``tests/agent_host/test_restart_delivery.py``);
``trunk-ended-before-died`` -- the trunk's drive ended (its reply logged), its ``Died`` and
``result.json`` not yet written (``tests/drills/test_reply_kill.py``)."""

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


def pause_point(name: str) -> None:
    """Stop this process (``SIGSTOP``) here if fault injection is on and ``EXARCH_PAUSE_AT`` is
    ``name`` (one of :data:`PAUSE_POINTS`), so whoever started it can SIGKILL it at exactly
    this moment (``tests/drills/test_startup_kill.py``, ``tests/drills/test_birth_kill.py``), or
    SIGCONT it once it changed the world under it (a disk filled meanwhile); off (one
    environment read) in a real run."""
    assert name in PAUSE_POINTS, name
    if os.environ.get(PAUSE_ENV) == name and faults_enabled():
        # sent to this thread: it stops on the way out of the call, before its next step (a
        # signal sent to the process may be taken by another thread, and this one ran on for
        # a few milliseconds -- far enough to pass the moment)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
