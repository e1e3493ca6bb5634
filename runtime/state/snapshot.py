"""The MobileSnapshot: everything needed to rebuild an agent's shell after its process died.

Contents: the session bindings (each value pre-encoded by ``runtime.ral.codec.encode_value``;
the binding's *name* is its elaboration seed, since our elaborator's session seed is exactly
"this name is in the bound set", which :meth:`Session.restore` re-adds), the dynamic context
(``DynamicContext.to_dict()``: cwd, env, grants), the binding-ledger state, the worker registry
state (worker references), the agent's ral-call epoch and the agent name.

File layout (one msgpack map, so any msgpack reader can inspect it)::

    {"format": "exarch-mobile-snapshot", "version": 1, "crc32": <crc of body>, "body": <bin>}
    body = {"agent", "epoch", "context", "ledger", "workers", "bindings": {name: <bin>}}

A base is extended by its **binding log** (``<file>.log``, :mod:`runtime.state.binding_log`):
frames of the bindings set and removed, and the context, ledger and worker changes, at each
checkpoint since the base was written. :meth:`MobileSnapshot.load` reads base plus log; a log
whose header names another base (its identity is the body's CRC and length) is already folded
into this one and is ignored; a torn last frame is ignored; a corrupt middle frame refuses the
snapshot.

The envelope never changes between versions, so a foreign-version file is named as such rather
than misread as corrupt; the CRC catches a flipped byte that msgpack would happily decode.
A corrupt, foreign or foreign-version file is refused with :class:`SnapshotRefused` naming the
file and the fault; the caller keeps its previous durable snapshot (:meth:`MobileSnapshot.
load_or_keep`), and nothing here ever modifies a file it refused.

A snapshot is built straight from encodings: the shell keeps each binding as its
``encode_value`` bytes from the moment it is bound (``actors.shell_host.encode_binding``), and
``actors.shell_snapshot.SnapshotKeeper`` passes its maps of those to the constructor. A
checkpoint appends a frame to the binding log instead of re-writing this file (cost:
``benchmarks/checkpoint_per_call.py``). A snapshot decoded from bytes keeps its packed bindings
section, so writing it again unchanged (:func:`folded_bytes` of a base with no log) does not
re-pack the bindings.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from exarch_actors.runtime.errors import SnapshotRefused
from exarch_actors.runtime.shell.ledger import apply_delta
from exarch_actors.runtime.state.binding_log import log_path, read_log
from exarch_actors.runtime.state.durable import atomic_write_bytes

FORMAT = "exarch-mobile-snapshot"
FORMAT_VERSION = 1

Decoder = Callable[[bytes], Any]


class SnapshotMissing(SnapshotRefused):
    """There is no snapshot file at the path (a shell that never checkpointed)."""


_BODY_FIELDS = ("agent", "epoch", "context", "ledger", "workers", "bindings")


def _default_decoder() -> Decoder:
    from exarch_actors.runtime.ral.codec import decode_value

    return decode_value


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@dataclass(frozen=True)
class MobileSnapshot:
    """One durable checkpoint of a shell. Immutable; bindings hold encoded bytes, not values."""

    agent: str
    epoch: int
    bindings: Mapping[str, bytes]
    """name -> encoded value (``runtime.ral.codec.encode_value``)."""
    context: Mapping[str, Any]
    ledger: Mapping[str, Any]
    workers: Mapping[str, Any]
    packed_bindings: bytes | None = field(default=None, compare=False, repr=False)
    """The bindings section already packed as a msgpack map (kept by :meth:`decode`; else
    derived from ``bindings``)."""
    base_id: tuple[int, int] | None = field(default=None, compare=False, repr=False)
    """``(crc32, length)`` of the body this snapshot was decoded from: the identity a binding
    log's header names (None for a snapshot not read from bytes)."""

    # -- views -----------------------------------------------------------------------------------

    def names(self) -> frozenset[str]:
        """The session names to re-seed into the elaborator's bound set on restore."""
        return frozenset(self.bindings)

    def decoded_bindings(self, decode: Decoder | None = None) -> dict[str, Any]:
        """Decode every binding's value; a binding that cannot be decoded refuses the snapshot."""
        dec = decode or _default_decoder()
        out: dict[str, Any] = {}
        for name, blob in self.bindings.items():
            try:
                out[name] = dec(blob)
            except Exception as e:
                raise SnapshotRefused(
                    f"snapshot of agent {self.agent!r} refused: binding {name!r} cannot be "
                    f"decoded ({e}); keep the previous durable snapshot"
                ) from e
        return out

    # -- encoding --------------------------------------------------------------------------------

    def encode(self) -> bytes:
        return self.encode_base()[0]

    def encode_base(self) -> tuple[bytes, tuple[int, int]]:
        """The file's bytes and the body's identity ``(crc32, length)`` (a log's header)."""
        section = self.packed_bindings
        if section is None:
            section = _pack_section({n: _pack(n) + _pack(b) for n, b in self.bindings.items()})
        body_parts = (
            _pack_map_header(len(_BODY_FIELDS)),
            _pack("agent"),
            _pack(self.agent),
            _pack("epoch"),
            _pack(self.epoch),
            _pack("context"),
            _pack(dict(self.context)),
            _pack("ledger"),
            _pack(dict(self.ledger)),
            _pack("workers"),
            _pack(dict(self.workers)),
            _pack("bindings"),
            section,
        )
        # CRC and length over the parts, then one join: the body is copied once, not twice.
        crc = 0
        for part in body_parts:
            crc = zlib.crc32(part, crc)
        length = sum(map(len, body_parts))
        envelope = (
            _pack_map_header(4),
            _pack("format"),
            _pack(FORMAT),
            _pack("version"),
            _pack(FORMAT_VERSION),
            _pack("crc32"),
            _pack(crc),
            _pack("body"),
            _bin_header(length),
        )
        return b"".join(envelope + body_parts), (crc, length)

    @classmethod
    def decode(cls, data: bytes, *, source: str = "<bytes>") -> MobileSnapshot:
        """Parse a snapshot file's bytes; anything wrong raises SnapshotRefused naming
        ``source``."""

        def refuse(what: str) -> SnapshotRefused:
            return SnapshotRefused(
                f"snapshot {source} refused: {what}; keeping the previous durable snapshot"
            )

        try:
            envelope = msgpack.unpackb(data, raw=False)
        except Exception as e:
            raise refuse(
                f"not readable msgpack ({type(e).__name__}: {e}); the file is corrupt"
            ) from None
        if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
            raise refuse(f"not an exarch MobileSnapshot (no {FORMAT!r} envelope); foreign file")
        version = envelope.get("version")
        if version != FORMAT_VERSION:
            raise refuse(
                f"format version {version!r} is foreign; this build reads version {FORMAT_VERSION}"
            )
        body = envelope.get("body")
        crc = envelope.get("crc32")
        if not isinstance(body, bytes) or not isinstance(crc, int):
            raise refuse("the envelope lacks its body or checksum; the file is corrupt")
        if zlib.crc32(body) != crc:
            raise refuse("checksum mismatch; the file is corrupt")
        try:
            fields = msgpack.unpackb(body, raw=False)
        except Exception as e:
            raise refuse(f"body is not readable msgpack ({e}); the file is corrupt") from None
        if not isinstance(fields, dict):
            raise refuse("body is not a map")
        missing = [f for f in _BODY_FIELDS if f not in fields]
        if missing:
            raise refuse(f"body lacks {', '.join(missing)}")
        agent, epoch, bindings = fields["agent"], fields["epoch"], fields["bindings"]
        if not isinstance(agent, str):
            raise refuse("'agent' is not a string")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise refuse(f"'epoch' is not a non-negative integer: {epoch!r}")
        for name in ("context", "ledger", "workers"):
            if not isinstance(fields[name], dict):
                raise refuse(f"{name!r} is not a map")
        if not isinstance(bindings, dict) or not all(
            isinstance(k, str) and isinstance(v, bytes) for k, v in bindings.items()
        ):
            raise refuse("'bindings' is not a map of names to encoded values")
        return cls(
            agent,
            epoch,
            bindings,
            fields["context"],
            fields["ledger"],
            fields["workers"],
            packed_bindings=_raw_field(body, "bindings"),
            base_id=(crc, len(body)),
        )

    def folded(self, records: list[dict[str, Any]], *, source: str = "<log>") -> MobileSnapshot:
        """This base with binding-log ``records`` applied in order (each frame's fields are
        absolute values, so re-applying frames already folded in changes nothing)."""
        bindings = dict(self.bindings)
        context, workers = dict(self.context), dict(self.workers)
        ledger = _own_ledger(self.ledger)
        epoch = self.epoch
        for i, r in enumerate(records):
            problem = _record_problem(r)
            if problem is not None:
                raise SnapshotRefused(
                    f"snapshot log {source} refused: record {i + 1} {problem}; the file is corrupt"
                )
            epoch = r["epoch"]
            for name in r.get("removed") or ():
                bindings.pop(name, None)
            bindings.update(r.get("set") or {})
            if "context" in r:
                context = r["context"]
            if "workers" in r:
                workers = r["workers"]
            if "ledger" in r:
                ledger = _own_ledger(r["ledger"])
            elif "ledger_delta" in r:
                try:
                    apply_delta(ledger, r["ledger_delta"])
                except (KeyError, TypeError, AttributeError, ValueError) as e:
                    raise SnapshotRefused(
                        f"snapshot log {source} refused: record {i + 1} has an unreadable "
                        f"ledger change ({type(e).__name__}: {e}); the file is corrupt"
                    ) from None
        return MobileSnapshot(self.agent, epoch, bindings, context, ledger, workers)

    # -- files -----------------------------------------------------------------------------------

    def write_atomic(self, path: str | Path) -> int:
        """Replace ``path`` atomically and durably; returns the bytes written."""
        data = self.encode()
        atomic_write_bytes(path, data)
        return len(data)

    @classmethod
    def load(cls, path: str | Path) -> MobileSnapshot:
        """The snapshot at ``path``: its base plus its binding log (see the module docstring)."""
        base = cls.load_base(path)
        assert base.base_id is not None
        log = log_path(path)
        read = read_log(log, base.base_id)
        if not read.records:
            return base
        return base.folded(read.records, source=str(log))

    @classmethod
    def load_base(cls, path: str | Path) -> MobileSnapshot:
        """The base file at ``path`` alone, without its binding log."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise SnapshotMissing(f"snapshot {p} refused: no such file") from None
        except OSError as e:
            raise SnapshotRefused(f"snapshot {p} refused: cannot read it ({e})") from e
        return cls.decode(data, source=str(p))

    @classmethod
    def load_or_keep(
        cls, path: str | Path, previous: MobileSnapshot | None
    ) -> tuple[MobileSnapshot | None, SnapshotRefused | None]:
        """Load ``path``; on refusal return ``previous`` unchanged together with the refusal."""
        try:
            return cls.load(path), None
        except SnapshotRefused as e:
            return previous, e


def folded_bytes(path: str | Path) -> bytes:
    """The snapshot at ``path`` (base plus binding log) as one base file's bytes, for a copy
    that must stand alone; a snapshot that is refused is copied as its base bytes, unread."""
    try:
        return MobileSnapshot.load(path).encode()
    except SnapshotRefused:
        return Path(path).read_bytes()


def _own_ledger(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ledger state whose lease maps are this caller's to change in place."""
    out = dict(state)
    for key in ("last_use", "sizes"):
        if isinstance(out.get(key), Mapping):
            out[key] = dict(out[key])
    return out


_RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "set": dict,
    "removed": list,
    "context": dict,
    "workers": dict,
    "ledger": dict,
    "ledger_delta": dict,
}


def _record_problem(r: dict[str, Any]) -> str | None:
    epoch = r.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return f"has no valid epoch ({epoch!r})"
    for key, types in _RECORD_TYPES.items():
        if key in r and not isinstance(r[key], types):
            return f"has a {key!r} that is a {type(r[key]).__name__}"
    if not all(
        isinstance(k, str) and isinstance(v, bytes) for k, v in (r.get("set") or {}).items()
    ):
        return "sets a binding that is not a name and an encoded value"
    if not all(isinstance(n, str) for n in r.get("removed") or ()):
        return "removes a binding that is not a name"
    return None


def _raw_field(body: bytes, key: str) -> bytes | None:
    """The raw msgpack bytes of one top-level field of ``body`` (kept so re-writing a loaded
    snapshot does not re-pack its bindings)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(body)
    for _ in range(unpacker.read_map_header()):
        name = unpacker.unpack()
        start = unpacker.tell()
        unpacker.skip()
        if name == key:
            return body[start : unpacker.tell()]
    return None


def _pack_map_header(n: int) -> bytes:
    return msgpack.Packer(use_bin_type=True).pack_map_header(n)


def _bin_header(n: int) -> bytes:
    """msgpack ``bin`` header (msgpack-python's Packer has none), so a body is never re-copied
    into a packer just to be wrapped."""
    if n < 1 << 8:
        return struct.pack(">BB", 0xC4, n)
    if n < 1 << 16:
        return struct.pack(">BH", 0xC5, n)
    if n < 1 << 32:
        return struct.pack(">BI", 0xC6, n)
    raise ValueError(f"snapshot body of {n} bytes exceeds msgpack's 4 GiB bin limit")


def _pack_section(chunks: Mapping[str, bytes]) -> bytes:
    return _pack_map_header(len(chunks)) + b"".join(chunks.values())
