"""Every descendant of a shell host or worker dies with it, however it detached.

A program that double-forks and calls ``setsid`` leaves its own process group and session, so
neither the kill of the program's group (a cancel) nor ``PR_SET_PDEATHSIG`` (set on the
program, not inherited by its children) reaches it; the kernel re-parents it to the nearest
**child subreaper** above it, or to init. So:

- a host or worker is a child subreaper (:func:`become_subreaper`, ``PR_SET_CHILD_SUBREAPER``):
  whatever its programs leave behind becomes its own child, found by one read of its
  ``/proc/PID/task/*/children``;
- it reaps the ones that exited when it next starts a program (:func:`reap_adopted`: nothing
  on a ral call that runs no program), and kills them all when it ends on its own or when a
  call it runs is cancelled (:func:`end_descendants`);
- the side that SIGKILLs a live host (``ChildProcess.kill``) first stops every descendant
  (:func:`freeze_descendants`) and then kills them with it: a stopped process forks no more
  (a fork racing the SIGSTOP is restarted after it, which never comes), so one top-down walk
  finds them all.

Not covered here: a host SIGKILLed by someone else (the OOM killer, a user) or one that dies
with a SIGKILLed control process (its ``PR_SET_PDEATHSIG``) takes no action, and what it had
adopted moves on to init. Where a pids cgroup is writable, ``actors/pid_cgroup.py`` closes it
(the shell that sees its host die kills what is left in the host's leaf; the fleet's end and
``resume`` sweep the session's group); elsewhere ``check`` finds those by the
``EXARCH_SESSION`` variable they inherited (``runtime/drills/invariant_check.py``) and
``resume`` kills them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable

from exarch_actors.actors.process_identity import children_of, exited

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper(prctl: Callable[..., int] | None) -> bool:
    """Make this process a child subreaper (Linux 3.4+); False where it cannot be one."""
    if prctl is None:
        return False
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def freeze_descendants(pid: int) -> list[int]:
    """SIGSTOP every descendant of ``pid``, top-down, and return them (parents first).

    Each process is stopped before its children are read, so none can add a child the walk
    misses. A stopped parent cannot reap either, so every pid read stays its process's until
    it is killed. ``pid`` itself is not signalled."""
    found: list[int] = []
    seen: set[int] = {pid}
    queue = [c for c in children_of(pid) if c not in seen]
    while queue:
        child = queue.pop()
        if child in seen:
            continue
        seen.add(child)
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGSTOP)
        found.append(child)
        queue.extend(c for c in children_of(child) if c not in seen)
    return found


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each process and its process group (a group it leads: its own children that
    share it go too)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def end_descendants() -> None:
    """In a host or worker: kill every descendant of this process and reap its children.

    Called where the process ends on its own and where a cancelled call's programs were
    killed: whatever a program left running (detached or not) goes with it."""
    me = os.getpid()
    victims = freeze_descendants(me)
    if not victims:
        return
    kill_all(victims)
    for child in children_of(me):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(child, 0)


def reap_adopted(owned: set[int]) -> None:
    """Reap this subreaper's children that exited and that no ``Popen`` owns (``owned``: the
    programs it started itself, each reaped by its own ``Popen``; reaping one of those here
    would cost it its exit status). Entries of ``owned`` that are no child any more are
    dropped. Called before a program starts, never while one is being started."""
    children = children_of(os.getpid())
    owned.intersection_update(children)
    for child in children:
        if child not in owned and exited(child):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(child, os.WNOHANG)
