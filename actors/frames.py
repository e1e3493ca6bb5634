"""Length-prefixed msgpack frames between the control process and a shell host or worker process.

Transport choice (measured on the 2-core dev box, 3,000 round trips of a ~40-byte msgpack echo
to a forkserver child, median): ``multiprocessing`` duplex ``Connection`` (a socketpair;
``send_bytes`` writes a 4-byte big-endian length then the body) **15.8 us**; two one-way
``Connection`` pipes 41.1 us; hand-rolled 4-byte framing over two ``os.pipe`` 43.4 us. The duplex
Connection is both the fastest and the one that travels to a forkserver child by fd passing, so
every channel here is one. :class:`Channel` keeps its wire format but reads and writes its socket
itself: one ``write(2)`` a frame and, when the frame is all there, one ``read(2)`` (measured
side by side, a ~40-byte echo: 15.6 us against 20.0 us through ``Connection.recv_bytes``).

A frame is the msgpack array ``[kind, fields]`` where ``fields`` is a map of plain msgpack values
(binding encodings travel as ``bytes``, already encoded by the ral codec). Kinds:

- control -> host: ``run``, ``restore``, ``shutdown``, ``answer`` (to an enquiry), ``probe``
- host -> control: ``result`` (with the run's ``snapshot`` delta: changed binding encodings,
  removed names, context, ledger changes, epoch), ``snapshot`` (after a restore: the whole
  ledger), ``enquiry`` (agent verbs, worker spawn/await/cancel), ``abandon`` (the host
  stopped waiting on an enquiry because its run was cancelled), ``panic`` (internal, non-ral
  error; the host exits after sending it), ``notice``, ``ready`` (boot/restore finished)
- control path (second channel, read by a thread of the host or worker): ``cancel``

Invariant: one reader and one writer per channel end at any time. The actor thread owns the
control end of the data channel; the host's main thread owns the other end; the cancel channel
is written under a lock by any thread and read by the host's cancel thread only.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import msgpack

from exarch_actors.runtime.errors import ExarchError

KINDS = frozenset(
    {
        "run",
        "result",
        "snapshot",
        "harvest",
        "restore",
        "shutdown",
        "enquiry",
        "answer",
        "abandon",
        "panic",
        "notice",
        "ready",
        "probe",
        "cancel",
    }
)


class FrameError(ExarchError):
    """A frame could not be decoded, or named an unknown kind."""


class UnencodableFrame(FrameError):
    """A frame's fields hold text that is not valid Unicode (a lone surrogate): msgpack's UTF-8
    cannot carry it, so the frame is refused before anything is sent."""


class ChannelClosed(FrameError):
    """The peer closed its end (normally: the process exited or was killed)."""

    def __init__(self, detail: str = "peer closed the channel") -> None:
        super().__init__(detail)


@dataclass(frozen=True)
class Frame:
    """One message. ``fields`` holds only msgpack-native values."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def encode_frame(frame: Frame) -> bytes:
    return encode_fields(frame.kind, dict(frame.fields))


def encode_fields(kind: str, fields: dict[str, Any]) -> bytes:
    """The frame ``[kind, fields]`` as bytes (``fields`` is not copied: a caller's own dict)."""
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    try:
        return msgpack.packb([kind, fields], use_bin_type=True)
    except UnicodeEncodeError as e:
        raise _unencodable(kind, e) from None


def _unencodable(kind: str, e: UnicodeEncodeError) -> UnencodableFrame:
    bad = e.object[e.start] if isinstance(e.object, str) else "?"
    return UnencodableFrame(
        f"a {kind!r} frame cannot be sent: its text holds U+{ord(bad):04X}, a lone "
        "surrogate, which is not a character"
    )


def decode_frame(data: bytes) -> Frame:
    return Frame(*decode_fields(data))


def decode_fields(data: bytes) -> tuple[str, dict[str, Any]]:
    """A frame's ``(kind, fields)``, checked as :func:`decode_frame` checks it, with no
    :class:`Frame` made: the per-call paths read the map itself (a frozen dataclass and its
    ``get`` calls were ~1 us of each side of a trivial round trip)."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types on bad bytes
        raise FrameError(f"undecodable frame ({len(data)} bytes): {e}") from None
    if not (type(obj) is list and len(obj) == 2 and type(obj[1]) is dict):
        raise FrameError(f"malformed frame: expected [kind, fields], got {type(obj).__name__}")
    kind = obj[0]
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    return kind, obj[1]


_LENGTH = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_JOIN_UPTO = 1 << 16
"""A body up to this many bytes is written with its length in one ``write(2)``."""
_READ = 1 << 16
"""Bytes asked of one ``read(2)`` (more when the frame in hand needs more)."""


def _frame_in(buf: bytearray) -> tuple[int, int] | None:
    """(start, end) of the body of the whole frame at the front of ``buf``, or None."""
    if len(buf) < 4:
        return None
    (n,) = _LENGTH.unpack_from(buf)
    start = 4
    if n == -1:
        if len(buf) < 12:
            return None
        (n,) = _LONG.unpack_from(buf, 4)
        start = 12
    end = start + n
    return (start, end) if len(buf) >= end else None


def _take_frame(buf: bytearray) -> bytes | None:
    """Remove the whole frame at the front of ``buf`` and return its body; None if partial."""
    got = _frame_in(buf)
    if got is None:
        return None
    start, end = got
    body = bytes(buf[start:end])
    del buf[:end]
    return body


def _needed(buf: bytearray) -> int:
    """Bytes still missing from the frame at the front of ``buf`` (at least its header)."""
    if len(buf) < 4:
        return 4 - len(buf)
    (n,) = _LENGTH.unpack_from(buf)
    if n == -1:
        if len(buf) < 12:
            return 12 - len(buf)
        return 12 + _LONG.unpack_from(buf, 4)[0] - len(buf)
    return 4 + n - len(buf)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Channel:
    """A frame channel over one duplex ``Connection``. ``send`` is safe from any thread.

    The wire is ``Connection``'s (a 4-byte big-endian length, or -1 and an 8-byte one, then the
    body), read and written here with ``os.read``/``os.write`` on its socket: a frame is one
    ``write(2)`` and, when it is all there, one ``read(2)`` -- ``Connection.recv_bytes`` reads
    the length and the body apart, through a ``BytesIO`` each (~0.5 us and a system call of a
    ~15 us round trip, on each side). What a read brought beyond the frame is kept for the
    next: :meth:`has_frame` says a whole one is already here, so a reader polls the socket only
    when it is not (:meth:`poll`, ``ChildProcess.wait_frame``)."""

    __slots__ = ("_buf", "_closed", "_fd", "_lock", "_packer", "conn")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._fd = conn.fileno()
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._closed = False
        self._packer = msgpack.Packer(use_bin_type=True)
        """Used under ``_lock`` only (a Packer is not thread-safe): ``packb`` makes one per
        call, ~0.45 us of each frame. A pack that raises leaves it empty (msgpack resets it)."""

    def send(self, kind: str, **fields: Any) -> None:
        self.send_fields(kind, fields)

    def send_fields(self, kind: str, fields: dict[str, Any]) -> None:
        """Send the frame ``[kind, fields]`` (``fields``: the caller's own map, not copied),
        packed and written in one go under the channel's lock."""
        if kind not in KINDS:
            raise FrameError(f"unknown frame kind {kind!r}")
        with self._lock:
            if self._closed:
                raise ChannelClosed("channel closed locally")
            try:
                body = self._packer.pack([kind, fields])
            except UnicodeEncodeError as e:
                raise _unencodable(kind, e) from None
            n = len(body)
            try:
                if n <= _JOIN_UPTO:
                    data = _LENGTH.pack(n) + body
                    sent = os.write(self._fd, data)  # all of it, bar a full socket buffer
                    if sent < len(data):
                        _write_all(self._fd, data[sent:])
                elif n < 0x7FFFFFFF:
                    _write_all(self._fd, _LENGTH.pack(n))
                    _write_all(self._fd, body)
                else:
                    _write_all(self._fd, _LENGTH.pack(-1) + _LONG.pack(n))
                    _write_all(self._fd, body)
            except (OSError, ValueError) as e:
                raise ChannelClosed(f"send failed: {e}") from None

    def send_bytes(self, data: bytes) -> None:
        """Send one already-encoded frame body (the agent-host channel's codec is its own)."""
        n = len(data)
        header = _LENGTH.pack(n) if n < 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG.pack(n)
        with self._lock:
            if self._closed:
                raise ChannelClosed("channel closed locally")
            try:
                if n <= _JOIN_UPTO:
                    _write_all(self._fd, header + data)
                else:  # no copy of a large body
                    _write_all(self._fd, header)
                    _write_all(self._fd, data)
            except (OSError, ValueError) as e:
                raise ChannelClosed(f"send failed: {e}") from None

    def try_send(self, kind: str, **fields: Any) -> bool:
        """Send, reporting a closed peer as False instead of raising (cancel paths)."""
        try:
            self.send(kind, **fields)
        except ChannelClosed:
            return False
        return True

    def recv(self) -> Frame:
        return decode_frame(self.recv_bytes())

    def recv_fields(self) -> tuple[str, dict[str, Any]]:
        """The next frame as ``(kind, fields)`` (:func:`decode_fields`)."""
        return decode_fields(self.recv_bytes())

    def recv_bytes(self) -> bytes:
        """One frame body, undecoded; :class:`ChannelClosed` at end of file."""
        buf = self._buf
        if not buf:  # the usual case: one read(2) brings exactly one whole frame
            if self._closed:  # its fd number may name another file by now
                raise ChannelClosed("channel closed locally")
            try:
                chunk = os.read(self._fd, _READ)
            except (OSError, ValueError) as e:
                raise ChannelClosed(f"receive failed: {e}") from None
            if not chunk:
                raise ChannelClosed("receive failed: end of file")
            if len(chunk) > 4 and _LENGTH.unpack_from(chunk)[0] == len(chunk) - 4:
                return chunk[4:]
            buf += chunk
        while True:
            body = _take_frame(buf)
            if body is not None:
                return body
            need = _needed(buf)
            if self._closed:  # its fd number may name another file by now
                raise ChannelClosed("channel closed locally")
            try:
                chunk = os.read(self._fd, max(_READ, need))
            except (OSError, ValueError) as e:
                raise ChannelClosed(f"receive failed: {e}") from None
            if not chunk:
                raise ChannelClosed("receive failed: end of file")
            buf += chunk

    def recv_ready(self) -> list[bytes]:
        """The frame bodies one ``read(2)`` completes, for a reader that knows the socket is
        readable (a selector said so): the read does not block. A frame still partial stays
        buffered for the next call ([] then); :class:`ChannelClosed` at end of file."""
        if self._closed:
            raise ChannelClosed("channel closed locally")
        buf = self._buf
        try:
            chunk = os.read(self._fd, max(_READ, _needed(buf)) if buf else _READ)
        except BlockingIOError:
            return []
        except (OSError, ValueError) as e:
            raise ChannelClosed(f"receive failed: {e}") from None
        if not chunk:
            raise ChannelClosed("receive failed: end of file")
        buf += chunk
        bodies: list[bytes] = []
        while (body := _take_frame(buf)) is not None:
            bodies.append(body)
        return bodies

    def has_frame(self) -> bool:
        """A whole frame is already read (the next :meth:`recv` takes no system call)."""
        buf = self._buf
        return len(buf) >= 4 and _frame_in(buf) is not None

    def poll(self, timeout: float | None = 0.0) -> bool:
        if _frame_in(self._buf) is not None:
            return True
        try:
            return self.conn.poll(timeout)
        except (EOFError, OSError, ValueError):
            return True  # readable-at-EOF: the next recv reports ChannelClosed

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.conn.close()
        except OSError:
            pass

    @property
    def closed(self) -> bool:
        return self._closed
