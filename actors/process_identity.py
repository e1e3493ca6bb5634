"""Which process a pid names, read from ``/proc``: its start time (in clock ticks, and as
psutil's create time), its direct children, a SIGKILL that never reaches a process that
reused a pid, and the SIGKILL of processes that are not this one's children followed by a
wait until they are gone (:func:`kill_and_wait`).

Read straight from ``/proc/PID/stat`` rather than through ``psutil.Process``, which reads the
file twice and costs up to 0.3 ms in a freshly forked agent process: these run on an agent's
end, inside the 100-agent cancel cascade (docs/benchmarks.md). Off Linux (no ``/proc``) each
falls back to psutil.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Sequence

import psutil

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

HAS_PROC = os.path.isdir("/proc/self")


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (its state first); None if
    it cannot be read (the process is gone, or there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie (its memory reclaimed, not yet reaped).
    One read of its ``/proc`` state (``psutil.Process(pid).status()`` read it twice, with the
    boot time)."""
    fields = stat_fields(pid)
    return not fields or fields[0] in (b"Z", b"X")


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``'s ``starttime``);
    None if it is gone or there is no ``/proc``. With the pid, an identity no later process
    shares, unmoved by clock changes: the one psutil checks (``is_running``) before it signals
    a process, read without building a ``psutil.Process`` (~60 us of each sleeper's reap in
    the 100-agent cascade, for the ``sleep`` it had adopted)."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def kill_program(pid: int, identity: int | psutil.Process) -> None:
    """SIGKILL an adopted program if ``pid`` still names it (never a process that reused it)."""
    if isinstance(identity, int):
        if start_ticks(pid) == identity:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        if identity.is_running():  # psutil checks the create time: never a reused pid
            identity.kill()
    except psutil.Error:
        pass


def create_time(pid: int) -> float | None:
    """``psutil.Process(pid).create_time()``, equal to the bit (``tests/shell/
    test_process_reap.py`` checks it): the same ``starttime`` field of ``/proc/PID/stat`` over
    the same clock ticks, plus ``psutil.boot_time()``, as psutil's Linux code computes it --
    without building a ``psutil.Process``, which reads the stat file twice (~18 us warm, up to
    0.3 ms in a freshly forked process). None if the process is gone; psutil's answer where
    there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # /proc is there: the process is gone
    except OSError:
        return None
    else:
        try:
            ticks = float(data[data.rindex(b")") + 2 :].split()[19])
        except (ValueError, IndexError):
            return None
        return ticks / _CLOCK_TICKS + psutil.boot_time()
    try:
        started: float = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return started


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc`` (cheap: no scan of every process)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return out


def kill_and_wait(targets: Sequence[tuple[int, Callable[[], bool]]], timeout: float) -> list[int]:
    """SIGKILL each ``(pid, is_it)`` whose ``is_it()`` still holds, then wait until every one
    killed has exited (a zombie counts: only its parent can reap it), at most ``timeout``
    seconds in all; the pids still running after that.

    The processes need not be this one's children (``resume`` kills a dead run's, adopted by
    init). A kill is not an exit: a SIGKILLed process with many threads or a large address
    space under CPU load still ran for a second or more, where ``check`` found it (issue 34).
    Each pid is pinned by a pidfd before ``is_it`` is asked, so the signal cannot reach a
    process that reused the pid, and the wait is the pidfd's readability (the kernel's exit
    notification), not a timed poll. Without ``pidfd_open`` (not Linux) the pid is signalled
    if ``is_it`` holds and its ``/proc`` state polled."""
    deadline = time.monotonic() + timeout
    if not hasattr(os, "pidfd_open"):
        return _kill_and_poll(targets, deadline)
    pending: dict[int, int] = {}
    try:
        for pid, is_it in targets:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            if not is_it():
                os.close(fd)
                continue
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                os.close(fd)
                continue  # exited between the two (ESRCH)
            pending[fd] = pid
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                os.close(fd)
                del pending[fd]
        return sorted(pending.values())
    finally:
        for fd in pending:
            os.close(fd)


def _kill_and_poll(targets: Sequence[tuple[int, Callable[[], bool]]], deadline: float) -> list[int]:
    killed = []
    for pid, is_it in targets:
        if is_it():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    while True:
        left = [pid for pid in killed if not exited(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)
