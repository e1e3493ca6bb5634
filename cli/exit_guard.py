"""A command exits promptly once it is done, whatever its threads and children still do.

Python joins every non-daemon thread before it exits, however long that takes. A pykka actor's
thread is one: an actor that its owner lost (a shell never stopped) kept a drill's process
waiting on a futex for more than 5 minutes after its report, its shell host blocked reading a
pipe nobody would close (issue 34). The guard runs at the start of the interpreter's shutdown,
before that join (``threading._register_atexit``, as ``concurrent.futures`` does):

1. every pykka actor still running is named on stderr and stopped -- its ``on_stop`` closes
   what it owns (a shell reaps its host);
2. the non-daemon threads get :data:`EXIT_GRACE` seconds in all to end;
3. any still running are named on stderr and the process exits at once (``os._exit``) with the
   command's own exit status, its output flushed.

A full disk ends a command at once too (:func:`_stop_for_a_full_disk`, the listener of
``runtime/state/disk_full.py``'s latch): the first session write refused for lack of space is
named with the space left (one message, ``outcome: failed``; under ``--json`` the command's
JSON object on stdout instead: :func:`stop_report`) and the process exits 1 on the
failing thread, as a control process's death would end it -- every record written so far
intact, the agent processes and shells going with their fork server -- so ``resume`` carries
the run on once space is back. Settling the tree first would need the disk it lacks: a bus
that could not write its transcript died, the fleet waited for it forever and SIGTERM was
ignored (issue 34).

Installed only for a command run as a process (:func:`install`, from the entry point with
``sys.argv``): in a test runner the process is not the command's to end.
"""

from __future__ import annotations

import os
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from exarch_actors.runtime.state import disk_full
from exarch_actors.runtime.state.disk_full import DiskFull

EXIT_GRACE = 10.0
"""Seconds the non-daemon threads left at exit get to end (a hang guard: an actor stopped here
closes its shell within its own 1 s grace)."""

_state: dict[str, Any] = {"installed": False, "code": 0}


def install() -> None:
    """Run :func:`_at_exit` before the interpreter joins its threads. Idempotent."""
    if _state["installed"]:
        return
    _state["installed"] = True
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]
    disk_full.on_trip(_stop_for_a_full_disk)
    _state["tty"] = _terminal_mode()


def _terminal_mode() -> list[Any] | None:
    """The terminal's mode as the command found it (None: stdin is no terminal)."""
    try:
        return termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
    except (OSError, ValueError, termios.error):
        return None


def _give_the_terminal_back() -> None:
    """Before an exit that skips every ``finally``: a full-screen UI (``chat``) that changed
    the terminal's mode gets it back as the command found it, its screen left and its cursor
    shown -- else the shell it returns to echoes nothing."""
    found = _state.get("tty")
    if found is None or _terminal_mode() == found:
        return
    try:
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, found)
        tty = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY)
        try:  # mouse reports off, the main screen back, the cursor shown
            os.write(tty, b"\x1b[?1000l\x1b[?1003l\x1b[?1006l\x1b[?1049l\x1b[?25h")
        finally:
            os.close(tty)
    except (OSError, ValueError, termios.error):
        pass


def installed() -> bool:
    """Whether this process is a command run as a process (the guard is installed)."""
    return bool(_state["installed"])


def stop_report(render: Callable[[DiskFull], str] | None) -> None:
    """Have a full-disk stop print ``render(err)`` on stdout instead of ``outcome: failed`` on
    stderr: ``run --json`` and ``resume --json`` print their one JSON object there, as their
    normal end does (before, the stop printed nothing on stdout: a script reading it got no
    outcome at all). ``render`` runs on the failing thread, which may hold a writer's lock:
    it must read nothing that waits. None: the outcome line again."""
    _state["stop_report"] = render


def _stop_for_a_full_disk(err: DiskFull) -> None:
    """The latch tripped (on the thread whose write failed, or the channel reader an agent
    process's report came on): say why, and end the process now (see the module docstring)."""
    _give_the_terminal_back()
    _warn(str(err))
    render = _state.get("stop_report")
    try:
        text = None if render is None else render(err)
    except Exception:  # the stop must end the process whatever the report does
        text = None
    if text is None:
        _say("outcome: failed")
    else:
        _out(text)
    end_now(1)


def end_now(code: int, why: str | None = None) -> None:
    """End the process at once with ``code``, ``why`` on stderr and the output flushed: its
    agent processes and shells end with their fork server, as at a control process's death."""
    _give_the_terminal_back()
    if why is not None:
        _warn(why)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def exiting_with(code: object) -> None:
    """The status the command exits with (``SystemExit.code``), for :func:`_at_exit`."""
    if code is None:
        _state["code"] = 0
    elif isinstance(code, int):
        _state["code"] = code
    else:
        _state["code"] = 1  # a message: sys.exit printed it and exits 1


def _at_exit() -> None:
    if "pykka" in sys.modules:  # never imported (``ral -c``): no actor to stop
        _stop_actors()
    deadline = time.monotonic() + EXIT_GRACE
    for t in _non_daemon():
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in _non_daemon() if t.is_alive()]
    if not stuck:
        return
    end_now(
        _state["code"],
        f"{len(stuck)} thread(s) still running {EXIT_GRACE:g} s after the command ended "
        f"({', '.join(stuck)}); exiting without them",
    )


def _stop_actors() -> None:
    import pykka

    for ref in pykka.ActorRegistry.get_all():
        _warn(f"{ref} was still running at exit; stopping it")
        try:
            ref.stop(block=False)
        except pykka.ActorDeadError:
            pass


def _non_daemon() -> list[threading.Thread]:
    me = threading.current_thread()
    return [t for t in threading.enumerate() if not t.daemon and t is not me and t.is_alive()]


def _warn(text: str) -> None:
    _say(f"exarch-actors: {text}")


def _out(line: str) -> None:
    """``line`` on the process's real stdout (fd 1), after what its streams hold."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.write(1, f"{line}\n".encode())
    except OSError:
        pass


def _say(line: str) -> None:
    """``line`` on the process's real stderr (fd 2), after what its streams hold: a
    full-screen UI (``chat``) has ``sys.stderr`` captured while it runs."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.write(2, f"{line}\n".encode())
    except OSError:
        pass
