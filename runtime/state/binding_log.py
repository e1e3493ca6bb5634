"""The binding log: an append-only file of checksummed msgpack frames beside a snapshot base.

A shell's durable snapshot is a **base** (``snapshot.msgpack``, a whole :class:`MobileSnapshot`
written atomically) plus this **log** (``snapshot.msgpack.log``) of what changed since: each
frame names the bindings set and removed at one checkpoint, and the context, worker registry and
ledger changes with them. A checkpoint then costs what changed, not the scope's size.

Frame layout (big-endian)::

    length: u32 | crc32(payload): u32 | payload: msgpack map (length bytes)

The first frame of every log is its header, ``{"log": FORMAT, "version": 1, "base": [crc,
length]}``: the identity of the base body it extends. A log whose header names another
base is *stale* -- what a crash between a compaction's two renames leaves: the new base already
folds it in -- and is ignored whole (:data:`STALE`).

Reading rules (the damage rules of ``runtime/state/session_read.py``):

- a torn or corrupt **last** frame is what a crash mid-append leaves (a SIGKILLed writer whose
  ``write(2)`` was cut short, or a machine crash that lost the tail of the page cache): it was
  never acknowledged, so it is ignored (the next writer starts from a compaction, which drops
  it);
- a corrupt frame with whole frames after it is no crash's doing: :class:`BindingLogDamaged`
  (a :class:`SnapshotRefused`) names the file and the frame's offset, and nothing is guessed.

Durability: :meth:`BindingLogWriter.append` is one ``write(2)`` of a whole frame, not fsync'd
unless the writer was opened with ``fsync=True``. A ``write(2)`` lands in the page cache, which
survives the death of any process (the shell host's, the control process's, a SIGKILL included),
so a frame appended before a call returned is read back by ``resume``. Only a kernel crash or a
power loss can lose unsynced frames; ``fsync=True`` is for a policy that promises to survive
those. A shell's rollback does not read this file at all: it restores the control side's
in-memory committed state, which is exactly what the log's frames were appended from.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from exarch_actors.runtime.errors import SnapshotRefused
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.disk_full import NO_SPACE, disk_full
from exarch_actors.runtime.state.private import FILE_MODE, private_dirs

FORMAT = "exarch-binding-log"
VERSION = 1
LOG_SUFFIX = ".log"
"""``<base>.log``: the binding log of the snapshot base at ``<base>``."""

_HEAD = struct.Struct(">II")
MAX_FRAME = 1 << 32
"""A frame's payload length is a u32; a frame must fit (one binding is capped far below)."""


class BindingLogDamaged(SnapshotRefused):
    """A frame in the middle of a binding log is corrupt: frames after it cannot be trusted
    to follow it, so the whole snapshot is refused rather than guessed past."""


def log_path(base: str | os.PathLike[str]) -> Path:
    """The binding log that extends the snapshot base at ``base``."""
    p = Path(base)
    return p.with_name(p.name + LOG_SUFFIX)


def encode_log_frame(record: dict[str, Any]) -> bytes:
    payload = msgpack.packb(record, use_bin_type=True)
    if len(payload) >= MAX_FRAME:
        raise ValueError(f"a binding-log frame of {len(payload)} bytes exceeds the u32 length")
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


BaseId = tuple[int, int]
"""``(crc32, length)`` of a snapshot base's body."""


def header(base: BaseId) -> dict[str, Any]:
    return {"log": FORMAT, "version": VERSION, "base": list(base)}


@dataclass(frozen=True)
class LogRead:
    """What :func:`read_log` found: the records after the header, in order."""

    records: list[dict[str, Any]]
    stale: bool = False
    """The header names another base: the log is folded into the base already; ignore it."""
    torn_at: int | None = None
    """Offset of a torn or corrupt last frame that was ignored (None: the log ended whole)."""
    end: int = 0
    """Offset just past the last whole frame (where the next append goes)."""


STALE = LogRead([], stale=True)


def _frames(data: bytes, source: str) -> Iterator[tuple[int, dict[str, Any] | None, int]]:
    """``(offset, record, end)`` per whole frame; a torn tail yields ``(offset, None, offset)``
    and stops; a corrupt middle frame raises :class:`BindingLogDamaged`."""
    pos, size = 0, len(data)
    while pos < size:
        if size - pos < _HEAD.size:
            yield pos, None, pos
            return
        length, crc = _HEAD.unpack_from(data, pos)
        start, end = pos + _HEAD.size, pos + _HEAD.size + length
        if end > size:  # cut short: only the last frame can be
            yield pos, None, pos
            return
        payload = data[start:end]
        record: Any = None
        if zlib.crc32(payload) == crc:
            try:
                record = msgpack.unpackb(payload, raw=False)
            except Exception:
                record = None
        if not isinstance(record, dict):
            if end == size:  # the last frame: a crash's torn tail
                yield pos, None, pos
                return
            raise BindingLogDamaged(
                f"snapshot log {source} refused: the frame at byte {pos} is corrupt and "
                f"{size - end} bytes of frames follow it; no crash leaves that"
            )
        yield pos, record, end
        pos = end


def read_log(path: str | os.PathLike[str], base: BaseId) -> LogRead:
    """The records of the log at ``path`` that extend the base whose identity is ``base``.

    A missing or empty log, or one whose header was torn, holds no records. Raises
    :class:`BindingLogDamaged` for a corrupt middle frame or a header of a foreign format.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return LogRead([])
    except OSError as e:
        raise SnapshotRefused(f"snapshot log {p} refused: cannot read it ({e})") from e
    records: list[dict[str, Any]] = []
    torn: int | None = None
    end = 0
    first = True
    for offset, record, frame_end in _frames(data, str(p)):
        if record is None:
            torn = offset
            break
        if first:
            first = False
            if record.get("log") != FORMAT or record.get("version") != VERSION:
                raise BindingLogDamaged(
                    f"snapshot log {p} refused: its header is not an {FORMAT} version {VERSION}"
                )
            if record.get("base") != list(base):
                return STALE
        else:
            records.append(record)
        end = frame_end
    return LogRead(records, torn_at=torn, end=end)


class BindingLogWriter:
    """Appends frames to one binding log, kept open; one writer per log (the shell actor).

    :meth:`start` creates a fresh log (header only) atomically: temp file, optional fsync,
    rename, so a reader sees the old log or the new one; appends then go to the open file.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd: int | None = None
        self.size = 0
        """Bytes in the log (header included): the compaction bound reads it."""

    def start(self, base: BaseId) -> None:
        """Replace the log with a fresh one extending the base whose identity is ``base``."""
        self.close()
        private_dirs(self.path.parent)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        frame = encode_log_frame(header(base))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            _write_all(fd, frame)
            if self.fsync:
                os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException as e:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, OSError) and e.errno in NO_SPACE:
                raise disk_full(self.path, e) from None
            raise
        if self.fsync:
            _fsync_dir(self.path.parent)
        self._fd = fd  # the renamed file: appends go on from the header
        os.lseek(fd, 0, os.SEEK_END)
        self.size = len(frame)
        durability.shipped(self.path, "replace", frame)

    def append(self, record: dict[str, Any]) -> int:
        """Append one frame (one ``write(2)``; fsync'd only when the writer was opened with
        ``fsync=True``); returns its size. Raises ``OSError`` if the write fails, after cutting
        any partial frame off again (:class:`DiskFull` for a full disk, the latch tripped)."""
        if self._fd is None:
            raise OSError(f"binding log {self.path} is not open")
        frame = encode_log_frame(record)
        try:
            _write_all(self._fd, frame)
            if self.fsync:
                os.fsync(self._fd)
        except OSError as e:
            try:
                os.ftruncate(self._fd, self.size)
                os.lseek(self._fd, self.size, os.SEEK_SET)
            except OSError:
                pass
            if e.errno in NO_SPACE:
                raise disk_full(self.path, e) from None
            raise
        self.size += len(frame)
        durability.shipped(self.path, "bytes", frame)
        return len(frame)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def is_open(self) -> bool:
        return self._fd is not None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
