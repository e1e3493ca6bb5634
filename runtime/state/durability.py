"""The durability policy of a session's files, and the append writer that keeps it.

One knob, ``--durability process|machine`` (default ``process``), persisted in ``run.json`` so
``resume`` keeps the run's policy. What each promises about an *acknowledged* record (its
append returned; for the bus, its ``publish`` returned and subscribers were handed it):

- ``process``: the record was written (``write(2)`` into the kernel's page cache) before it was
  acknowledged. It survives a SIGKILL, OOM kill or crash of **any process**, this one included:
  the page cache belongs to the kernel, which writes it back whether or not the writer lives.
  It is not promised to survive the kernel crashing or the machine losing power. No fsync per
  record.
- ``machine``: the record was also on stable storage (``fsync``) before it was acknowledged, so
  it survives a kernel crash or a power loss too. Group commit, as databases do it: the first
  appender that finds no fsync running becomes the file's leader and fsyncs once for every
  record written so far; appenders that arrive while that fsync runs write their records and
  wait; when it ends, one of them leads the next fsync, which covers all of them. So N
  concurrent appenders cost far fewer than N fsyncs (:attr:`AppendFile.fsyncs` counts them).

Both policies: every append starts on a fresh line (:func:`start_on_a_fresh_line`: a torn tail
left by a crash mid-append is completed or set aside to ``<file>.torn``, never silently lost;
the check and the append hold the file's ``flock``, so a line another process is still writing
is never taken for a torn one),
and a file is opened once and stays open while its directory is bound (:func:`bind`), instead
of an ``open``/``close`` per record. The writer's own lock serialises ``write(2)`` calls; **no
lock is held across an fsync** — the leader fsyncs with only a ``syncing`` flag set, so
another appender's ``write(2)`` proceeds while an fsync is in progress (and a caller's lock,
such as the bus's, need not be held across one: write under it, :meth:`AppendFile.wait` after).

**One commit per call** (:func:`one_commit`): under ``machine``, the records a thread appends
inside the block are written at once and their fsyncs awaited together when it ends -- one
fsync per file, the files' fsyncs issued concurrently (measured on this box's ext4: one fsync
~1.05 ms; four files one after another ~2.9 ms, concurrently ~1.4 ms). Nothing in the block is
acknowledged before the block ends, so a caller that acknowledges its records only after it (the
agent answers the model after its call's records) keeps the promise exactly. What the block
must acknowledge on its own (a spawn's journal record, before the child runs) goes inside
:func:`each_acknowledged`. The order of the block's records *between* files is then not kept
across a power loss (all or any of them may be lost; none was acknowledged): a record that must
reach the disk before another is written (a binding-log frame before its ``Commit``) is written
outside the block.

Routing: :func:`bind` registers a directory (a session root) with its policy; :func:`append`
sends a path under a bound directory to that directory's open :class:`AppendFile`, and any other
path to a one-shot open/append/close under :data:`DEFAULT`. A path whose file was renamed or
deleted since it was opened (``/clear`` archives ``events.jsonl``) is reopened on the next
append, after the old file's written records are made durable under the policy.

Shipping: a directory bound with a ``ship`` sink (an agent host on a Ray node,
``runtime/state/record_mirror.py``) hands every durable write under it to that sink as a
:class:`ShippedRecord`, right after the local write and before the writer returns: its appends
here, and through :func:`shipped` the whole-file writes, binding-log frames and renames of the
modules that make them.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Literal

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.state.checksum import ChecksumMismatch, open_line, seal_line
from exarch_actors.runtime.state.disk_full import NO_SPACE, disk_full
from exarch_actors.runtime.state.private import FILE_MODE, private_dirs

log = logging.getLogger(__name__)


class Durability(StrEnum):
    """What an acknowledged record survives (see the module docstring)."""

    PROCESS = "process"
    MACHINE = "machine"


DEFAULT = Durability.PROCESS

PROMISES = {
    Durability.PROCESS: "an acknowledged record was written (page cache) before it was "
    "acknowledged: it survives the death of any process, not a kernel crash or power loss",
    Durability.MACHINE: "an acknowledged record was fsync'd (group commit) before it was "
    "acknowledged: it survives the death of any process, a kernel crash and a power loss",
}
"""One line per policy: what ``--help``, ``check`` and the docs say it promises."""

FsyncFn = Callable[[int], None]

TORN_SUFFIX = ".torn"
"""``<file>.torn``: JSON lines, one per torn tail set aside (offset, length, bytes in base64)."""

_SCAN = 64 * 1024

ShipOp = Literal["lines", "bytes", "replace", "rename"]
"""``lines``: append whole JSON lines; ``bytes``: append raw bytes (binding-log frames);
``replace``: the file's whole new content (written atomically); ``rename``: ``path`` to ``to``."""

OPS: frozenset[str] = frozenset({"lines", "bytes", "replace", "rename"})


@dataclass(frozen=True)
class ShippedRecord:
    """One durable write under a shipping root, by its path relative to that root (POSIX)."""

    op: ShipOp
    path: str
    data: bytes = b""
    to: str | None = None
    """The new path of a ``rename``."""


Sink = Callable[[ShippedRecord], None]


def parse_durability(value: str | None) -> Durability:
    """``run.json``'s ``durability`` (absent in sessions older than the knob: ``process``)."""
    return DEFAULT if value is None else Durability(value)


class AppendFile:
    """One open append-only file and its one writer, keeping ``policy``.

    Thread-safe. ``fsync`` is the function that makes the file durable (``os.fsync``; tests
    pass a counting or blocking one)."""

    def __init__(
        self, path: str | os.PathLike[str], policy: Durability, *, fsync: FsyncFn = os.fsync
    ) -> None:
        self.path = Path(path)
        self._spath = str(self.path)
        self.policy = policy
        self._fsync = fsync
        self._lock = threading.Lock()  # the writer's own: write(2) order, never across an fsync
        self._sync = threading.Condition(threading.Lock())  # guards the fields below it
        self._fd = -1
        self._ino = -1
        self._end = -1
        """The file's size right after this writer's last write, if that write ended a line
        (-1: unknown). A file still that size ends in that newline, so the torn-tail check
        (an ``fstat`` and a ``pread``) is skipped: ~3 us of an ~11 us append."""
        self._closed = False
        self._written = 0  # records whose write(2) completed, in this writer's order
        self._durable = 0  # records the last completed fsync covered
        self._syncing = False
        self.fsyncs = 0
        self.records = 0
        self.ship: Callable[[bytes], None] | None = None
        """Set by a shipping :class:`DurableFiles`: hands each append's bytes to its sink."""

    # --- appending -------------------------------------------------------------------------

    def append(self, data: bytes) -> None:
        """Append ``data`` (whole lines); return once it is acknowledged under the policy --
        or, inside :func:`one_commit` under ``machine``, once written (the block's end waits)."""
        ticket = self.write(data)
        if not defer(self, ticket):
            self.wait(ticket)
        if self.ship is not None:
            self.ship(data)

    def write(self, data: bytes) -> int:
        """``write(2)`` ``data`` now, under the writer's lock only; return its ticket for
        :meth:`wait`. Under ``process`` the record is acknowledged when this returns."""
        with self._lock:
            if self._closed:
                _one_shot(self.path, data, self._repair_sync)
                return 0
            try:
                fd, size = self._current_fd()
            except OSError as e:  # no inode, or no block for a new directory
                if e.errno not in NO_SPACE:
                    raise
                raise disk_full(self.path, e) from None
            try:  # the lock free, as it nearly always is: no context manager (~2 us an append)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with _file_lock(fd):
                    size = self._write_locked(fd, size, data)
            else:
                try:
                    size = self._write_locked(fd, size, data)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            if data.endswith(b"\n"):
                self._end = size + len(data)
            self._written += 1
            self.records += 1
            return self._written

    def _write_locked(self, fd: int, size: int, data: bytes) -> int:
        """Under the writer's lock and the file's: the torn-tail check when this writer's last
        write is not known to end the file, then the write; the file's size before it."""
        if size < 0 or size != self._end:  # another writer, a repair, or a fresh open
            start_on_a_fresh_line(self.path, fd, self._repair_sync)
            size = os.fstat(fd).st_size
        self._end = -1
        write_all(fd, data, self.path)
        return size

    def wait(self, ticket: int) -> None:
        """Return once record ``ticket`` is acknowledged: at once under ``process``; under
        ``machine`` once an fsync that began after its write completed (group commit)."""
        if self.policy is not Durability.MACHINE or ticket == 0:
            return
        while True:
            with self._sync:
                while self._syncing and self._durable < ticket:
                    self._sync.wait()
                if self._durable >= ticket:
                    return
                self._syncing = True  # this appender leads the next fsync
                fd, target = self._fd, self._written
            try:
                self._fsync(fd)  # no lock held: other appenders write meanwhile
            except BaseException as e:
                with self._sync:
                    self._syncing = False
                    self._sync.notify_all()
                if isinstance(e, OSError) and e.errno in NO_SPACE:  # write-back refused
                    raise disk_full(self.path, e) from None
                raise
            with self._sync:
                self.fsyncs += 1
                self._durable = max(self._durable, target)
                self._syncing = False
                self._sync.notify_all()

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the file (its written records durable under the policy first). Appends after
        this still work, one open/append/close each."""
        with self._lock:
            self._closed = True
            self._retire_fd()

    def _current_fd(self) -> tuple[int, int]:
        """The open fd and the file's size as the path's ``stat`` saw it (-1 after a fresh
        open), (re)opened if the path no longer names the file it had (renamed, deleted) -- so
        a ``/clear``'s archive never receives the next generation's records."""
        if self._fd >= 0:
            try:
                st = os.stat(self._spath)
                if st.st_ino == self._ino:
                    return self._fd, st.st_size
            except FileNotFoundError:
                pass
            self._retire_fd()
        private_dirs(self.path.parent)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._ino = os.fstat(self._fd).st_ino
        self._end = -1
        return self._fd, -1

    def _retire_fd(self) -> None:
        """Close the fd, under the writer's lock: wait out a running fsync (the one wait in
        which this writer's own lock is held across an fsync), make what was written on it
        durable under the policy, then close."""
        if self._fd < 0:
            return
        with self._sync:
            while self._syncing:
                self._sync.wait()
            try:
                if self.policy is Durability.MACHINE and self._durable < self._written:
                    self._fsync(self._fd)
                    self.fsyncs += 1
                    self._durable = self._written
            finally:
                os.close(self._fd)
                self._fd, self._ino = -1, -1

    def _repair_sync(self, fd: int) -> None:
        if self.policy is Durability.MACHINE:
            self._fsync(fd)
            self.fsyncs += 1


def _one_shot(path: Path, data: bytes, sync: FsyncFn) -> None:
    """Append to a file no bound directory holds open: open, append, ``sync``, close."""
    private_dirs(path.parent)
    with _one_shot_lock(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            with _file_lock(fd):
                start_on_a_fresh_line(path, fd, sync)
                write_all(fd, data, path)
            sync(fd)
        finally:
            os.close(fd)


FILE_LOCK_WAIT = 2.0
"""Seconds an append waits for another process's append to the same file (microseconds,
unless that process was preempted or stopped mid-write)."""


@contextlib.contextmanager
def _file_lock(fd: int) -> Iterator[None]:
    """The file's lock across processes (``flock``) for one torn-tail check and its append.

    Several processes append to one file (each agent process its shell's Rollback, Reap and
    Prune records to the session's ``record.jsonl``); ``O_APPEND`` keeps their lines whole,
    but a line still being written -- its writer preempted between two pages, the size
    already grown -- looks torn to another writer's check, which would cut it. Under the lock
    no line is in flight; a writer that dies mid-append releases it, so its torn tail is still
    repaired. Threads of one process share the open file (flock does not exclude them): the
    writer's own lock does.

    The wait is bounded (:data:`FILE_LOCK_WAIT`): a holder stopped mid-append (SIGSTOP) must
    not stall every other writer, so past the bound the append goes ahead as it did before
    the lock."""
    deadline = time.monotonic() + FILE_LOCK_WAIT
    pause = 0.0001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning(
                    "fd %d: appending without the file lock (held past %g s)", fd, FILE_LOCK_WAIT
                )
                yield
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _no_sync(_fd: int) -> None:
    return None


_one_shot_locks: dict[str, threading.Lock] = {}


def _one_shot_lock(path: Path) -> threading.Lock:
    with _registry_lock:
        return _one_shot_locks.setdefault(str(path), threading.Lock())


# --- torn tails ------------------------------------------------------------------------------


def start_on_a_fresh_line(path: Path, fd: int, sync: FsyncFn) -> None:
    """Make the file end in a newline before an append.

    A file that does not end in a newline was torn by a crash mid-append: a last line that is
    a whole record (only its newline lost) is completed; any other fragment is *set aside* --
    copied to ``<file>.torn`` (:data:`TORN_SUFFIX`) with its offset -- and only then cut from
    the file. The fragment was never acknowledged (its append never returned), so cutting it
    loses no record, and its bytes are kept. ``sync`` makes the repair durable under the
    policy before the append that follows it.

    Checked on every append, not once per open: another process (``resume`` after a crash) or
    a failed partial write can tear a file this writer holds open. The cost when the file is
    whole is an ``fstat`` and a one-byte ``pread`` on the open fd."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = _last_line_start(fd, size)
    tail = os.pread(fd, size - start, start)
    if _is_record(tail):
        write_all(fd, b"\n")
        log.warning("%s: completed a whole last record that had lost its newline", path)
    else:
        set_aside_torn(path, start, tail, sync)
        os.ftruncate(fd, start)
        log.warning("%s: set aside a torn tail of %d bytes to %s", path, len(tail), TORN_SUFFIX)
    sync(fd)


def torn_path(path: str | os.PathLike[str]) -> Path:
    """Where the torn tails of ``path`` are set aside."""
    p = Path(path)
    return p.with_name(p.name + TORN_SUFFIX)


def set_aside_torn(
    path: str | os.PathLike[str], offset: int, data: bytes, sync: FsyncFn | None = None
) -> None:
    """Record a torn fragment of ``path`` in its side file before it is cut (``sync``: how the
    side file is made durable first; by default as :func:`policy_for` says)."""
    record = {
        "file": Path(path).name,
        "offset": offset,
        "length": len(data),
        "bytes": base64.b64encode(data).decode("ascii"),
    }
    line = seal_line(json.dumps(record).encode())
    _one_shot(torn_path(path), line, sync_for(path) if sync is None else sync)


def _last_line_start(fd: int, size: int) -> int:
    """Offset just after the file's last newline (0 if it has none), scanning back by blocks."""
    end = size
    while end > 0:
        begin = max(0, end - _SCAN)
        cut = os.pread(fd, end - begin, begin).rfind(b"\n")
        if cut >= 0:
            return begin + cut + 1
        end = begin
    return 0


def _is_record(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(open_line(raw)[0]), dict)
    except (ValueError, UnicodeDecodeError, ChecksumMismatch):
        return False


def write_all(fd: int, data: bytes, path: str | os.PathLike[str] | None = None) -> None:
    """Write all of ``data`` to ``fd`` (an append-mode or fresh file the caller alone writes
    now). A write the disk refuses (:data:`~runtime.state.disk_full.NO_SPACE`) leaves nothing
    of ``data`` behind: the bytes already written are cut off again, so the file holds the
    record wholly or not at all and a retry never duplicates a line. With ``path`` that
    failure is raised as :class:`~runtime.state.disk_full.DiskFull` (the latch tripped)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            _cut_back(fd, len(data) - len(view))
            if path is None:
                raise
            raise disk_full(path, e) from None
        view = view[n:]


def _cut_back(fd: int, written: int) -> None:
    """Remove the last ``written`` bytes of ``fd``'s file: a refused write's fragment."""
    if written:
        with contextlib.suppress(OSError):  # a file that cannot shrink keeps a torn tail
            os.ftruncate(fd, os.fstat(fd).st_size - written)


# --- one commit per call ---------------------------------------------------------------------


class _Group:
    """The fsyncs one :func:`one_commit` block owes: each file's last ticket, and what to run
    once they are on disk."""

    def __init__(self) -> None:
        self.tickets: dict[AppendFile, int] = {}
        self.then: list[Callable[[], None]] = []

    def settle(self) -> None:
        """Wait for every file's fsync (concurrently when there are several), then run ``then``
        in order. Every wait is joined before an error is raised: no thread is left behind."""
        waits = list(self.tickets.items())
        errors: list[BaseException] = []

        def wait(f: AppendFile, ticket: int) -> None:
            try:
                f.wait(ticket)
            except BaseException as e:  # re-raised below, on the block's own thread
                errors.append(e)

        threads = [
            threading.Thread(target=wait, args=w, name="group-commit", daemon=True)
            for w in waits[1:]
        ]
        for t in threads:
            t.start()
        if waits:
            wait(*waits[0])
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        for fn in self.then:
            fn()


_local = threading.local()


def _current() -> _Group | None:
    group: _Group | None = getattr(_local, "group", None)
    return group


def defer(f: AppendFile, ticket: int, then: Callable[[], None] | None = None) -> bool:
    """Inside a :func:`one_commit` block on this thread, under ``machine``: leave record
    ``ticket`` of ``f`` (and ``then``, run once it is durable) to the block's end and return
    True. Otherwise False: the caller waits as usual."""
    group = _current()
    if group is None or f.policy is not Durability.MACHINE or ticket == 0:
        return False
    group.tickets[f] = max(group.tickets.get(f, 0), ticket)
    if then is not None:
        group.then.append(then)
    return True


class one_commit:  # a lower-case name: used as the function it was, ``with one_commit():``
    """Records this thread appends in the block share one group commit at its end (see the
    module docstring). A block inside another joins it; the block's end waits even when its
    body raised (what was written is made durable, then the error goes on). A class, not a
    generator: entered twice per ral call, the generator's machinery cost ~3 us each."""

    __slots__ = ("_group",)

    def __enter__(self) -> None:
        if _current() is not None:
            self._group: _Group | None = None
            return
        self._group = _local.group = _Group()

    def __exit__(self, *exc: object) -> None:
        group = self._group
        if group is not None:
            _local.group = None
            group.settle()


class each_acknowledged:  # a lower-case name: used as the function it was
    """Inside a :func:`one_commit` block: every append in this block is acknowledged on its
    own before it returns, as outside any block (what the block holds stays owed to it)."""

    __slots__ = ("_group",)

    def __enter__(self) -> None:
        self._group = _current()
        _local.group = None

    def __exit__(self, *exc: object) -> None:
        _local.group = self._group


# --- bound directories -----------------------------------------------------------------------


class DurableFiles:
    """The open append files under one directory, all kept under one policy."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        policy: Durability,
        *,
        fsync: FsyncFn = os.fsync,
        ship: Sink | None = None,
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.policy = policy
        self.fsync = fsync
        self.ship = ship
        """Where every durable write under :attr:`root` is also sent (None: nowhere)."""
        self._files: dict[str, AppendFile] = {}
        self._lock = threading.Lock()
        self._closed = False

    def file(self, path: str | os.PathLike[str]) -> AppendFile:
        """The one writer of ``path`` (opened on its first append)."""
        key = os.path.abspath(path)
        with self._lock:
            f = self._files.get(key)
            if f is None:
                f = self._files[key] = AppendFile(key, self.policy, fsync=self.fsync)
                if self._closed:
                    f._closed = True
                if self.ship is not None:
                    sink, rel = self.ship, Path(key).relative_to(self.root).as_posix()
                    f.ship = lambda data: sink(ShippedRecord("lines", rel, data))
            return f

    def shipped(
        self, path: str | os.PathLike[str], op: ShipOp, data: bytes, to: str | None
    ) -> None:
        """Hand one write under :attr:`root` to the sink (``to``: a rename's new path)."""
        if self.ship is None:
            return
        rel_to = None if to is None else self.relative(to)
        self.ship(ShippedRecord(op, self.relative(path), data, rel_to))

    def relative(self, path: str | os.PathLike[str]) -> str:
        """``path`` relative to :attr:`root`, POSIX separators (``ValueError`` if outside)."""
        return Path(os.path.abspath(path)).relative_to(self.root).as_posix()

    @property
    def fsyncs(self) -> int:
        """fsyncs of appended records (and torn-tail repairs) so far, over every file."""
        with self._lock:
            return sum(f.fsyncs for f in self._files.values())

    @property
    def records(self) -> int:
        with self._lock:
            return sum(f.records for f in self._files.values())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            files = list(self._files.values())
        for f in files:
            f.close()


_registry_lock = threading.Lock()
_bound: dict[Path, tuple[DurableFiles, int]] = {}
_routes: dict[str, AppendFile] = {}
_given: dict[str | os.PathLike[str], AppendFile] = {}
_bound_of: dict[str, DurableFiles | None] = {}
"""An absolute path :func:`bound` was asked about -> its answer; emptied by every :func:`bind`
and :func:`unbind`. The walk up the parents took ~40 us (``sync_for`` of each binding-log
frame the driver writes for a Ray host, on the channel's reader)."""
_BOUND_OF_MAX = 4096
_UNKNOWN = object()
_ship_routes: dict[str, tuple[DurableFiles, str]] = {}
"""An absolute path :func:`shipped` was given -> its bound directory (one with a sink) and the
path relative to that directory's root; emptied by every :func:`bind` and :func:`unbind` (a
bind can make another directory the innermost). :func:`bound`'s walk up the parents and
``relative_to`` took ~49 us of each binding-log frame a Ray host ships, on its drive thread
(measured in one process); a host ships the same few paths all run long."""
"""The same routes by the absolute path as a caller gave it (a ``str`` or ``Path``): a lookup
without ``os.path.abspath``, ~2 us of each of the three or four appends of a ral call."""
_shipping = 0
"""Bound directories with a sink: while none is, :func:`shipped` returns at once."""


def bind(
    root: str | os.PathLike[str],
    policy: Durability,
    *,
    fsync: FsyncFn = os.fsync,
    ship: Sink | None = None,
) -> DurableFiles:
    """Keep the files under ``root`` open, under ``policy``, until :func:`unbind`; with
    ``ship``, hand every durable write under it to that sink too.

    Binding a bound root again with the same policy shares its files (counted: each bind needs
    its unbind; the first bind's sink stays); with another policy it is refused
    (:class:`DurabilityConflict`)."""
    global _shipping
    files = DurableFiles(root, policy, fsync=fsync, ship=ship)
    with _registry_lock:
        held = _bound.get(files.root)
        if held is not None:
            if held[0].policy is not policy:
                raise DurabilityConflict(files.root, held[0].policy, policy)
            _bound[files.root] = (held[0], held[1] + 1)
            return held[0]
        _bound[files.root] = (files, 1)
        _bound_of.clear()
        _ship_routes.clear()
        if ship is not None:
            _shipping += 1
        return files


@contextlib.contextmanager
def bound_to(root: str | os.PathLike[str], policy: Durability) -> Iterator[DurableFiles]:
    """:func:`bind` for the length of a ``with`` block (a write before or after a fleet's
    lifetime: ``run.json``, ``result.json``)."""
    files = bind(root, policy)
    try:
        yield files
    finally:
        unbind(files)


def unbind(files: DurableFiles) -> None:
    """Release one :func:`bind`; the last one closes the files (durable under the policy)."""
    global _shipping
    with _registry_lock:
        held = _bound.get(files.root)
        if held is None or held[0] is not files:
            return
        if held[1] > 1:
            _bound[files.root] = (files, held[1] - 1)
            return
        del _bound[files.root]
        _bound_of.clear()
        _ship_routes.clear()
        if files.ship is not None:
            _shipping -= 1
        for key in [k for k, f in _routes.items() if f in files._files.values()]:
            del _routes[key]
        for given in [k for k, f in _given.items() if f in files._files.values()]:
            del _given[given]
    files.close()


def bound(path: str | os.PathLike[str]) -> DurableFiles | None:
    """The bound directory ``path`` lies under (the innermost), if any."""
    key = os.fspath(path)
    absolute = os.path.isabs(key)
    if absolute:
        known = _bound_of.get(key, _UNKNOWN)  # one lookup: a bind may empty it meanwhile
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
    p = Path(os.path.abspath(key))
    with _registry_lock:
        found = None
        for parent in (p, *p.parents):
            held = _bound.get(parent)
            if held is not None:
                found = held[0]
                break
        if absolute:  # (a relative one names another file after a chdir)
            if len(_bound_of) >= _BOUND_OF_MAX:
                _bound_of.clear()
            _bound_of[key] = found
    return found


def policy_for(path: str | os.PathLike[str]) -> Durability:
    """The policy ``path``'s writes keep: its bound directory's, else :data:`DEFAULT`."""
    files = bound(path)
    return files.policy if files is not None else DEFAULT


def writer_for(path: str | os.PathLike[str]) -> AppendFile | None:
    """The open writer of ``path`` when it lies under a bound directory."""
    given = isinstance(path, str | PurePath)
    if given:
        f = _given.get(path)
        if f is not None:
            return f
    key = os.path.abspath(path)
    f = _routes.get(key)
    if f is None:
        files = bound(path)
        if files is None:
            return None
        f = files.file(path)
        with _registry_lock:
            if _bound.get(files.root, (None, 0))[0] is files:
                _routes[key] = f
    if given and os.path.isabs(path):  # a relative one names another file after a chdir
        with _registry_lock:
            if _routes.get(key) is f:  # still bound (unbind removes both routes)
                _given[path] = f
    return f


def append(path: str | os.PathLike[str], data: bytes) -> None:
    """Append ``data`` to ``path``; return once it is acknowledged under ``path``'s policy."""
    f = writer_for(path)
    if f is None:
        _one_shot(Path(path), data, sync_for(path))
    else:
        f.append(data)


def shipped(
    path: str | os.PathLike[str],
    op: ShipOp,
    data: bytes = b"",
    to: str | os.PathLike[str] | None = None,
) -> None:
    """Hand a write just made to ``path`` to its bound directory's sink, if it has one (a
    whole-file write, a binding-log frame, a rename to ``to``). Appends made through
    :func:`append` and :func:`write_jsonl`'s writer are shipped by their writer."""
    if not _shipping:
        return
    key = os.fspath(path)
    route = _ship_routes.get(key)
    if route is None:
        files = bound(key)
        if files is None or files.ship is None:
            return
        route = (files, files.relative(key))
        if os.path.isabs(key):  # a relative one names another file after a chdir
            with _registry_lock:
                if _bound.get(files.root, (None, 0))[0] is files:  # still bound
                    _ship_routes[key] = route
    files, rel = route
    sink = files.ship
    if sink is not None:
        sink(ShippedRecord(op, rel, data, None if to is None else files.relative(to)))


def sync_for(path: str | os.PathLike[str]) -> FsyncFn:
    """The fsync a whole-file write of ``path`` needs under its policy (a no-op under
    ``process``: a rename after ``write(2)`` already survives the death of any process)."""
    files = bound(path)
    if files is None or files.policy is Durability.PROCESS:
        return _no_sync
    return files.fsync


class DurabilityConflict(ExarchError):
    """A directory already bound under one policy was bound again under another."""

    def __init__(self, root: Path, held: Durability, wanted: Durability) -> None:
        super().__init__(f"{root} is already written under durability {held}, not {wanted}")
