"""One owner per session directory: the control process that writes a session holds an
exclusive ``flock`` on its ``owner.lock`` for the run's whole life.

Why a lock and not a marker file: a second command pointed at a live session (``resume`` on a
run still going, a second ``run --session-dir`` on it) once took the hint "carry it on with
`exarch-actors resume`", rebuilt the trunk's shell beside the live one and SIGKILLed the live
run's host. Liveness is the kernel's word: the lock is held by an open file description, which
the kernel releases however the holder ends (``SIGKILL`` included), so ``resume`` of a dead run
is never refused by a stale lock. The file is opened ``O_CLOEXEC`` and every process the
control process starts is exec'd (the fork server, subprocesses), so no child holds it past
its parent.

The holder's pid, its process start time, the command and when it took the lock are written
into the file for the refusal's message only; the lock alone decides.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.state.disk_full import NO_SPACE, disk_full
from exarch_actors.runtime.state.private import FILE_MODE

LOCK_NAME = "owner.lock"

_RETRIES = 10
_RETRY_SECS = 0.03
"""A lock found held whose file names no live holder yet (its holder took it an instant ago,
or a ``sessions`` listing probes it) is tried again this often before the refusal."""


@dataclass(frozen=True)
class Owner:
    """Who holds a session's lock, as the holder wrote it (for messages)."""

    pid: int | None
    started: str | None
    """The holder process's start time (ISO, UTC): with the pid it names one process."""
    command: str | None
    since: str | None
    host: str | None

    @classmethod
    def of_this_process(cls, command: str) -> Owner:
        started = _dt.datetime.fromtimestamp(psutil.Process().create_time(), _dt.UTC)
        return cls(
            pid=os.getpid(),
            started=started.isoformat(timespec="seconds"),
            command=command,
            since=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            host=socket.gethostname(),
        )

    @classmethod
    def read(cls, path: Path) -> Owner:
        try:
            data: Any = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        pid = data.get("pid")
        return cls(
            pid=pid if isinstance(pid, int) else None,
            started=_str(data.get("started")),
            command=_str(data.get("command")),
            since=_str(data.get("since")),
            host=_str(data.get("host")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "started": self.started,
            "command": self.command,
            "since": self.since,
            "host": self.host,
        }

    def describe(self) -> str:
        parts = [f"pid {self.pid}" if self.pid is not None else "pid unknown"]
        if self.command:
            parts.append(f"`{self.command}`")
        if self.since:
            parts.append(f"since {self.since}")
        if self.host and self.host != socket.gethostname():
            parts.append(f"on {self.host}")
        return ", ".join(parts)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


class SessionLive(ExarchError):
    """A command that writes a session was pointed at one whose owner is still running."""

    def __init__(self, root: Path, owner: Owner) -> None:
        self.root = root
        self.owner = owner
        kill = f"kill -INT {owner.pid}" if owner.pid is not None else "Ctrl-C in its terminal"
        super().__init__(
            f"session is live: a run is still running in {root} ({owner.describe()}); "
            f"wait for it to end, or stop it ({kill}) and then `exarch-actors resume {root}`, "
            "or use another directory"
        )


class SessionLock:
    """The held lock of one session directory; :meth:`release` (or the process's end) frees
    it. Not thread-shared: one control process, one holder object."""

    def __init__(self, root: Path, fd: int) -> None:
        self.root = root
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, root: Path, command: str | None = None) -> SessionLock:
        """Take the lock file ``path`` of session ``root`` (which must exist), or raise
        :class:`SessionLive`."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            for attempt in range(_RETRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    owner = Owner.read(path)
                    if (owner.pid is not None and psutil.pid_exists(owner.pid)) or (
                        attempt == _RETRIES - 1
                    ):
                        raise SessionLive(root, owner) from None
                    time.sleep(_RETRY_SECS)
            me = Owner.of_this_process(command or _command_line())
            os.ftruncate(fd, 0)
            try:
                os.pwrite(fd, json.dumps(me.to_json()).encode(), 0)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                raise disk_full(path, e) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(root, fd)

    def release(self) -> None:
        """Free the lock (idempotent); the file stays, empty, for the next owner."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def live_owner(path: Path) -> Owner | None:
    """Who holds the lock file ``path`` now, or None when nobody does (probed with a shared
    lock taken and dropped at once: a listing never keeps a run from starting but for that
    instant, and a run's acquire retries past it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return Owner.read(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _command_line() -> str:
    """``exarch-actors run ...`` as this process was started (for the refusal's message)."""
    args = sys.argv[1:]
    return " ".join(["exarch-actors", *args]) if args else "exarch-actors"
