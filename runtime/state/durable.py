"""Durable files: append-only JSON lines, torn-tail tolerant reads, and atomic whole-file
replacement, each kept under the session's durability policy (:mod:`runtime.state.durability`).

Invariants:
- :func:`append_jsonl` writes one complete line and returns once it is acknowledged under the
  policy of the directory it lies in: under ``process`` once it is written (``write(2)`` into
  the page cache, which survives a SIGKILL of the writer or of any process: the kernel writes
  it back), under ``machine`` once a group-commit fsync covers it (which survives a kernel
  crash or power loss too). An fsync protects only against the latter; it is not what makes a
  record survive the death of a process.
- Every append starts on a fresh line. A file that does not end in a newline was torn by a crash
  mid-append: a last line that is a whole record (only its newline lost) is completed; any other
  fragment is *set aside* — copied to ``<file>.torn`` (:data:`TORN_SUFFIX`) with its offset —
  and only then cut from the file. The fragment was never acknowledged (its append never
  returned), so cutting it loses no record, and its bytes are kept.
- :func:`read_jsonl` never raises on a torn or corrupt line: it returns the readable records and
  reports each damaged line (a torn *last* line is the expected shape of a crash mid-write).
- :func:`atomic_write_bytes` replaces a file with write-to-temp, rename, so a reader sees
  either the old bytes or the new ones, never a mixture; under ``machine`` the temp file is
  fsync'd before the rename and the directory after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.checksum import (
    ChecksumMismatch,
    open_document,
    open_line,
    seal_document,
    seal_line,
)
from exarch_actors.runtime.state.durability import TORN_SUFFIX, set_aside_torn, torn_path, write_all
from exarch_actors.runtime.state.private import FILE_MODE, private_dirs

__all__ = [
    "TORN_SUFFIX",
    "Damage",
    "JsonlRead",
    "ListOf",
    "Shape",
    "append_jsonl",
    "atomic_write_bytes",
    "jsonl_line",
    "now_iso",
    "read_json_document",
    "read_jsonl",
    "set_aside_torn",
    "stamped_line",
    "torn_path",
    "write_json_document",
    "write_jsonl",
]


_second: tuple[int, str] = (-1, "")
"""The last whole second :func:`now_iso` formatted, and its text (an immutable pair: threads
read and replace it whole)."""


def now_iso() -> str:
    """UTC ISO-8601 timestamp with milliseconds, the ``"at"`` of every record (what
    ``datetime.isoformat(timespec="milliseconds")`` writes, with ``Z``). The second is formatted
    once: a record's stamp took ~3 us through ``datetime``, four or five per ral call."""
    global _second
    now = time.time()
    sec = int(now)
    cached = _second
    if cached[0] != sec:
        cached = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return f"{cached[1]}.{int((now - sec) * 1000):03d}Z"


def jsonl_line(record: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``record`` (with ``"at"`` added if absent) and its sealed JSON line (its checksum the
    last member, :mod:`runtime.state.checksum`): every JSON line of a session is made here or
    in :func:`stamped_line`."""
    if "at" not in record:
        record = {**record, "at": now_iso()}
    return record, seal_line(_encoder.encode(record).encode())


def stamped_line(record: dict[str, Any]) -> tuple[bytes, int]:
    """The JSON line of ``record`` (a non-empty object) with a fresh ``"at"`` last, and the size
    of ``record``'s own JSON (without any ``"at"``) plus its newline -- what an event log counts
    (``runtime/state/eventlog.py``), from one encoding instead of two."""
    if "at" in record:  # replaced, never written twice
        record = {k: v for k, v in record.items() if k != "at"}
    body = _encoder.encode(record)
    line = f'{body[:-1]}, "at": "{now_iso()}"}}'.encode()
    return seal_line(line), len(body.encode()) + 1


def write_jsonl(
    path: str | os.PathLike[str], record: dict[str, Any]
) -> tuple[dict[str, Any], Callable[[], None]]:
    """Write ``record`` now (``write(2)``, in the file's order) and return it with the wait for
    its acknowledgement under ``path``'s policy -- for a caller that orders its writes under a
    lock of its own and must not hold that lock across an fsync: write under it, wait after."""
    record, line = jsonl_line(record)
    writer = durability.writer_for(path)
    if writer is None:
        durability.append(path, line)
        return record, _acknowledged
    ticket = writer.write(line)
    if writer.ship is not None:
        writer.ship(line)
    return record, lambda: writer.wait(ticket)


def _acknowledged() -> None:
    return None


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any]) -> dict[str, Any]:
    """Append ``record`` as one JSON line; add ``"at"`` if absent. Returns the written record
    once it is acknowledged under ``path``'s durability policy.

    Appends from threads of one process to one path are serialised by its one writer;
    ``O_APPEND`` keeps whole lines from separate processes from interleaving for lines under
    the pipe-atomic size."""
    record, line = jsonl_line(record)
    durability.append(path, line)
    return record


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.decode("utf-8", "replace")
    if isinstance(o, set | frozenset):
        return sorted(o)
    if hasattr(o, "__dict__"):
        return {k: v for k, v in vars(o).items() if not k.startswith("_")}
    return repr(o)


_encoder = json.JSONEncoder(ensure_ascii=False, default=_json_default)
"""One encoder for every line: ``json.dumps`` with these options builds a new encoder per call
(~2 us of a ~5 us line)."""


@dataclass(frozen=True)
class Damage:
    """One line of a JSON-lines file that no reader may use."""

    line: int  # 1-based; 0 when the file as a whole could not be read
    torn_tail: bool  # the last line, without its newline: a crash mid-append
    text: str
    reason: str = "not a JSON object"

    def where(self, name: str) -> str:
        """``name:line: reason 'text'`` -- how refusals and the checker name it."""
        return f"{name}:{self.line}: {self.reason} {self.text[:60]!r}"


@dataclass(frozen=True)
class ListOf:
    """A field type: a list whose items are all of ``item``."""

    item: type


FieldTypes = tuple[Any, ...]  # classes, None, or ListOf(...)


@dataclass(frozen=True)
class Shape:
    """What the readers of one JSON-lines format rely on, so a record that breaks it is
    reported as damage (by file and line) instead of failing a reader far away.

    Every record has a string ``kind``. ``fields[kind]`` maps a field to its allowed types; a
    name ending in ``?`` may be absent. ``checks[kind]`` is a further test returning the problem
    (or None). Kinds not listed need only the ``kind``. ``bool`` is never an ``int`` here.
    """

    fields: dict[str, dict[str, FieldTypes]] = field(default_factory=dict)
    checks: dict[str, Callable[[dict[str, Any]], str | None]] = field(default_factory=dict)

    def problem(self, record: dict[str, Any]) -> str | None:
        kind = record.get("kind")
        if not isinstance(kind, str):
            return "no string kind"
        for spec, types in self.fields.get(kind, {}).items():
            name = spec.rstrip("?")
            if name not in record:
                if spec.endswith("?"):
                    continue
                return f"{kind} without {name}"
            if not _has_type(record[name], types):
                return f"{kind} {name} is {type(record[name]).__name__}"
        check = self.checks.get(kind)
        return check(record) if check is not None else None


def _has_type(value: Any, types: FieldTypes) -> bool:
    for t in types:
        if t is None:
            if value is None:
                return True
        elif isinstance(t, ListOf):
            if isinstance(value, list) and all(_has_type(v, (t.item,)) for v in value):
                return True
        elif isinstance(value, bool) and t is not bool:
            continue
        elif isinstance(value, t):
            return True
    return False


@dataclass
class JsonlRead:
    """What :func:`read_jsonl` could read, and what it could not."""

    records: list[dict[str, Any]] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # the line of each record
    sealed: int = 0  # records that carried a checksum (and matched it)
    bare: int = 0  # records without a checksum: written before checksums, or by hand

    @property
    def torn(self) -> bool:
        return any(d.torn_tail for d in self.damage)

    @property
    def inner_damage(self) -> list[Damage]:
        """Damage that is not a torn last line: something no crash leaves behind."""
        return [d for d in self.damage if not d.torn_tail]


def read_jsonl(path: str | os.PathLike[str], shape: Shape | None = None) -> JsonlRead:
    """Read every usable record; report the rest. A missing file reads as empty.

    A line whose checksum does not match (:mod:`runtime.state.checksum`), a line that is not a
    JSON object, or (with ``shape``) a record that breaks the shape, is damage; a file that
    cannot be read at all is one damage at line 0. A line without a checksum (written before
    checksums, or repaired by hand without its ``crc`` member) reads as before, counted in
    ``bare``. Never raises for what the file holds."""
    out = JsonlRead()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    except OSError as e:
        out.damage.append(Damage(0, False, "", f"unreadable file ({e.strerror or e})"))
        return out
    lines = data.split(b"\n")
    ends_clean = data.endswith(b"\n")
    if ends_clean:
        lines = lines[:-1]
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        torn = i == len(lines) and not ends_clean
        text = raw[:200].decode("utf-8", "replace")
        try:
            covered, sealed = open_line(raw)
        except ChecksumMismatch as e:
            out.damage.append(Damage(i, torn, text, str(e)))
            continue
        try:
            obj = json.loads(covered)
        except (ValueError, UnicodeDecodeError, RecursionError):
            out.damage.append(Damage(i, torn, text, "not JSON"))
            continue
        if not isinstance(obj, dict):
            out.damage.append(Damage(i, torn, text, "not a JSON object"))
            continue
        if sealed:
            out.sealed += 1
        elif "crc" in obj:
            out.damage.append(Damage(i, torn, text, "damaged checksum member"))
            continue
        else:
            out.bare += 1
        problem = shape.problem(obj) if shape is not None else None
        if problem is not None:
            out.damage.append(Damage(i, False, text, problem))
            continue
        out.records.append(obj)
        out.lines.append(i)
    return out


def write_json_document(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Replace ``path`` with ``doc`` as an indented JSON document sealed with its checksum
    (``run.json``, ``result.json``), atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, seal_document(doc))


def read_json_document(path: str | os.PathLike[str]) -> tuple[Any, bool]:
    """The JSON document at ``path`` and whether it carried a checksum (one written before
    checksums did not). Raises ``OSError`` (``FileNotFoundError``), ``ValueError`` for what is
    not JSON, and :class:`ChecksumMismatch` (a ``ValueError``) for a changed byte."""
    covered, sealed = open_document(Path(path).read_bytes())
    doc = json.loads(covered)
    if not sealed and isinstance(doc, dict) and "crc" in doc:
        raise ChecksumMismatch("damaged checksum member")
    return doc, sealed


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, durable under ``path``'s policy."""
    p = Path(path)
    private_dirs(p.parent)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    sync = durability.sync_for(p)
    try:
        try:
            write_all(fd, data, p)
            sync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a failed replace leaves no temp file behind
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        sync(dfd)
    finally:
        os.close(dfd)
    durability.shipped(p, "replace", data)
