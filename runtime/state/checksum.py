"""The checksum of every durable record: CRC32C (Castagnoli), as LevelDB/RocksDB logs and etcd's
WAL carry one per record, so a flipped byte anywhere in a session file is found by whoever reads
it instead of being believed.

On disk a record stays one readable JSON object. Its checksum is the object's **last member**,
``"crc": "xxxxxxxx"`` (8 lower-case hex digits), computed over the object *without* that member
exactly as it was encoded -- for a JSON line ``{..., "at": "..."}`` the crc covers those bytes,
and the line written is ``{..., "at": "...", "crc": "xxxxxxxx"}``. So a reader needs no second
encoding: it checks the fixed-size tail (20 bytes), rebuilds the covered bytes by cutting it off
(closing the brace) and compares; what it parses is the covered object, so no
reader ever sees a ``crc`` key. A JSON document (``run.json``, ``result.json``) is sealed the
same way, its crc member the last line before the closing brace.

Invariants:
- :func:`seal_line` / :func:`seal_document` output reads back through :func:`open_line` /
  :func:`open_document` to exactly the bytes that were sealed.
- Any single changed byte of a sealed record is reported (:class:`ChecksumMismatch`): inside the
  covered bytes the crc differs; inside the crc member the tail no longer matches its template
  in exactly one byte, which is told from a record that never had a checksum (written before
  checksums, a *bare* record: accepted as it is) because a bare record's tail -- a timestamp or
  a value and a brace -- differs from the template in many bytes. A bare record that parses to
  an object with a ``crc`` key is damage too (a flip after the brace of a sealed document).
- The crc is over bytes, not over a re-encoding: what was written is what is checked.

Why a trailing member and not a ``crc<TAB>json`` prefix: every line stays JSON that ``jq`` and
any log tool read, the records' readers are unchanged (the member is cut before parsing), and
the hot path is one ``crc32c`` of the line it already encoded plus 20 bytes.
"""

from __future__ import annotations

import json
from typing import Any, Final

import google_crc32c

from exarch_actors.runtime.errors import ExarchError

__all__ = [
    "ChecksumMismatch",
    "open_document",
    "open_line",
    "seal_document",
    "seal_line",
]

_LINE_HEAD: Final = b', "crc": "'
_LINE_END: Final = b'"}'

_DOC_HEAD: Final = b',\n  "crc": "'
_DOC_END: Final = b'"\n}'

_HEX: Final = b"0123456789abcdef"


class ChecksumMismatch(ExarchError, ValueError):
    """A record's bytes are not the ones its checksum was computed over (or its checksum member
    itself is damaged): something changed it after it was written, and no crash does that. A
    ``ValueError`` too, so a reader that refuses unreadable JSON refuses it the same way."""


def seal_line(body: bytes) -> bytes:
    """The line (with its newline) that carries ``body`` -- one encoded JSON object, no newline
    -- and its checksum as its last member."""
    return b'%s, "crc": "%08x"}\n' % (body[:-1], google_crc32c.value(body))


def seal_document(doc: dict[str, Any]) -> bytes:
    """``doc`` as an indented JSON document with its checksum as its last member, and a
    newline. ``doc`` must be a non-empty object without a ``crc`` key."""
    if not doc or "crc" in doc:
        raise ValueError("a sealed document is a non-empty object without a crc key")
    body = json.dumps(doc, indent=2, ensure_ascii=False).encode()
    return b'%s,\n  "crc": "%08x"\n}\n' % (body[:-2], google_crc32c.value(body))


def open_line(raw: bytes) -> tuple[bytes, bool]:
    """The covered bytes of one line (without its newline) and whether it carried a checksum;
    raises :class:`ChecksumMismatch` when it is damaged. A bare line comes back as it is."""
    return _open(raw, _LINE_HEAD, _LINE_END, b"}")


def open_document(data: bytes) -> tuple[bytes, bool]:
    """As :func:`open_line`, for a document :func:`seal_document` wrote (its final newline is
    not covered: a document that lost it reads the same)."""
    if data.endswith(b"\n"):
        data = data[:-1]
    return _open(data, _DOC_HEAD, _DOC_END, b"\n}")


def _open(raw: bytes, head: bytes, end: bytes, close: bytes) -> tuple[bytes, bool]:
    size = len(head) + 8 + len(end)
    if raw[-size : len(head) - size] == head and raw[-len(end) :] == end:
        covered = raw[:-size] + close
        if b"%08x" % google_crc32c.value(covered) != raw[len(head) - size : -len(end)]:
            raise ChecksumMismatch("checksum mismatch: the record changed after it was written")
        return covered, True
    if _one_off(raw[-size:], head, end):
        raise ChecksumMismatch("damaged checksum member")
    return raw, False


def _one_off(tail: bytes, head: bytes, end: bytes) -> bool:
    """Whether ``tail`` differs from a checksum member's template in at most one byte (the
    eight digits may be any hex digit)."""
    size = len(head) + 8 + len(end)
    if len(tail) != size:
        return False
    wrong = sum(a != b for a, b in zip(tail[: len(head)], head, strict=True))
    wrong += len(tail[len(head) : len(head) + 8].translate(None, _HEX))
    wrong += sum(a != b for a, b in zip(tail[-len(end) :], end, strict=True))
    return wrong <= 1
