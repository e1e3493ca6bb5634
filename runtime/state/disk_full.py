"""A session file that cannot be written: the typed error, the process-wide latch, the probe.

A full disk (``ENOSPC``), an exhausted quota (``EDQUOT``) or a device that fails a write
(``EIO``) on any session file is not something a run can work around: every agent's next
record would fail the same way. So the first such failure *trips* this process's latch and
stops the run, the way a control process's death does -- every acknowledged record intact,
nothing settled that did not end on its own -- so that ``resume``, once space is back, carries
on from the last record that reached the disk (docs/drills.md, "A full disk").

Invariants:

- A write that fails with one of :data:`NO_SPACE` leaves no fragment: its writer cuts the file
  back to where the write began (``runtime/state/durability.py``) and raises
  :class:`DiskFull` -- so a record is either wholly in the file or not at all, and a retry of
  the same records never duplicates a line.
- :func:`disk_full` trips the latch once per process (the first failure is the one named);
  every listener (:func:`on_trip`) runs once, on the failing thread, before the error is
  raised -- a listener must not wait on anything (the failing thread may hold a writer's lock).
- :func:`probe` is what ``resume`` asks before it touches a session: it writes and removes a
  small file beside the session's own, and raises the same :class:`DiskFull` a run would.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.fleet.diskwarn import human_bytes

NO_SPACE: frozenset[int] = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
"""The write errors that stop a run: no space, no quota, a failing device."""

EXIT_DISK_FULL = 75
"""How a process the latch stopped exits (``EX_TEMPFAIL``: try again once space is back)."""

PROBE_BYTES = 64 * 1024
"""What :func:`probe` writes: a resumed run's first records (its notes, the journal's heals,
each agent's resume note) take a few KiB; a disk with less than this free is full."""


class DiskFull(ExarchError, OSError):
    """A session file could not be written: the disk (or quota, or device) refused it. An
    ``OSError`` still, so what caught the write's own error catches this one."""

    def __init__(self, path: str, reason: str, free_bytes: int | None) -> None:
        self.path = path
        self.reason = reason
        self.free_bytes = free_bytes
        free = "unknown" if free_bytes is None else human_bytes(free_bytes)
        super().__init__(
            f"disk full: cannot write {path} ({reason}); {free} free on its file system. "
            "The run is stopped with every record written so far intact: free space, "
            "then `exarch-actors resume` carries it on"
        )


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a write refused for lack of space, quota or a working device."""
    return isinstance(e, DiskFull) or (isinstance(e, OSError) and e.errno in NO_SPACE)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system (its nearest
    existing ancestor's), or None if that cannot be read."""
    p = Path(os.path.abspath(path))
    for candidate in (p, *p.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


_lock = threading.Lock()
_tripped: DiskFull | None = None
_listeners: list[Callable[[DiskFull], None]] = []


def disk_full(path: str | os.PathLike[str], e: OSError) -> DiskFull:
    """The :class:`DiskFull` for ``e`` (one of :data:`NO_SPACE`) on ``path``, the latch tripped
    first: the caller raises it. The first failure in this process trips the latch and runs the
    listeners; a later one is returned as itself but changes nothing."""
    err = DiskFull(os.fspath(path), e.strerror or str(e), free_bytes(path))
    trip(err)
    return err


def trip(err: DiskFull) -> None:
    """Trip the latch with ``err`` (a failure of this process's, or one an agent process
    reported) unless it has tripped; run the listeners if this trips it."""
    global _tripped
    with _lock:
        first = _tripped is None
        if first:
            _tripped = err
        listeners = list(_listeners) if first else []
    for listener in listeners:
        listener(err)


def tripped() -> DiskFull | None:
    """The first session write this process could not make, if any."""
    return _tripped


def on_trip(listener: Callable[[DiskFull], None]) -> Callable[[], None]:
    """Run ``listener`` once when the latch next trips; returns its removal."""
    with _lock:
        _listeners.append(listener)

    def remove() -> None:
        with _lock, contextlib.suppress(ValueError):
            _listeners.remove(listener)

    return remove


def reset() -> None:
    """Untrip the latch (a long-lived process that runs another session; tests)."""
    global _tripped
    with _lock:
        _tripped = None


def probe(root: str | os.PathLike[str], size: int = PROBE_BYTES) -> None:
    """Raise :class:`DiskFull` if ``size`` bytes cannot be written beside ``root``'s files
    (written to a hidden file in ``root`` and removed). Trips nothing: a refusal before the
    run starts stops nothing."""
    path = Path(root) / f".space-probe.{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        if e.errno in NO_SPACE:
            raise DiskFull(str(root), e.strerror or str(e), free_bytes(root)) from None
        raise
    try:
        view = memoryview(bytes(size))
        while view:
            view = view[os.write(fd, view) :]
    except OSError as e:
        if e.errno in NO_SPACE:
            raise DiskFull(str(root), e.strerror or str(e), free_bytes(root)) from None
        raise
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
