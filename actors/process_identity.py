"""Which process a pid names, read from ``/proc``: its start time (in clock ticks, and as
psutil's create time), its direct children, and a SIGKILL that never reaches a process that
reused a pid.

Read straight from ``/proc/PID/stat`` rather than through ``psutil.Process``, which reads the
file twice and costs up to 0.3 ms in a freshly forked agent process: these run on an agent's
end, inside the 100-agent cancel cascade (docs/benchmarks.md). Off Linux (no ``/proc``) each
falls back to psutil.
"""

from __future__ import annotations

import contextlib
import os
import signal

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
