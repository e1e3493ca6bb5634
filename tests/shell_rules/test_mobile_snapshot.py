"""MobileSnapshot: round trip, and refusal of corrupt, foreign and undecodable files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from exarch_actors.runtime.errors import SnapshotRefused
from exarch_actors.runtime.ral.context import DynamicContext, Grants
from exarch_actors.runtime.shell.ledger import BindingLedger
from exarch_actors.runtime.shell.worker_retention import WorkerRegistry
from exarch_actors.runtime.state.snapshot import (
    FORMAT,
    FORMAT_VERSION,
    MobileSnapshot,
    SnapshotMissing,
)


class PlainCodec:
    """A plain-msgpack value codec (stands in for the ral codec, whose own tests cover value
    fidelity; tests/shell_rules/test_snapshot_with_ral.py uses the real one)."""

    @staticmethod
    def encode(value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)

    @staticmethod
    def decode(data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False)


def context() -> DynamicContext:
    return DynamicContext(cwd="/work", env={"A": "1"}, grants=Grants.granting(exec=["ls"]))


def make_snapshot(codec: PlainCodec) -> MobileSnapshot:
    """Built as the shell's SnapshotKeeper builds one: a map of names to encodings."""
    ledger = BindingLedger()
    ledger.arm(["lib"])
    ledger.note_define("x", ledger.tick(), 9)
    workers = WorkerRegistry()
    workers.register("w1", 1, 1.5)
    values: dict[str, Any] = {"x": 41, "xs": [1, "two", {"m": 3}]}
    return MobileSnapshot(
        agent="alice",
        epoch=7,
        bindings={name: codec.encode(value) for name, value in values.items()},
        context=context().to_dict(),
        ledger=ledger.to_state(),
        workers=workers.to_state(),
    )


def test_a_snapshot_round_trips_through_its_file(tmp_path: Path) -> None:
    codec = PlainCodec()
    snap = make_snapshot(codec)
    path = tmp_path / "agents" / "alice" / "snapshot.msgpack"
    snap.write_atomic(path)
    back = MobileSnapshot.load(path)
    assert back == snap
    assert (back.agent, back.epoch, back.names()) == ("alice", 7, {"x", "xs"})
    assert back.decoded_bindings(codec.decode) == {"x": 41, "xs": [1, "two", {"m": 3}]}
    assert DynamicContext.from_dict(dict(back.context)) == context()
    assert BindingLedger.from_state(back.ledger).to_state() == snap.ledger
    assert WorkerRegistry.from_state(back.workers).to_state() == snap.workers
    assert back.encode() == snap.encode()  # a reloaded snapshot re-writes byte for byte


def test_the_file_is_one_msgpack_map_any_reader_can_inspect(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.msgpack"
    make_snapshot(PlainCodec()).write_atomic(path)
    envelope = msgpack.unpackb(path.read_bytes())
    assert (envelope["format"], envelope["version"]) == (FORMAT, FORMAT_VERSION)
    assert msgpack.unpackb(envelope["body"])["agent"] == "alice"


def _good_file(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "snapshot.msgpack"
    make_snapshot(PlainCodec()).write_atomic(path)
    return path, path.read_bytes()


@pytest.mark.parametrize(
    ("mangle", "says"),
    [
        (lambda b: b[: len(b) // 2], "corrupt"),  # torn write
        (lambda b: b[:-5] + bytes([b[-5] ^ 0xFF]) + b[-4:], "checksum mismatch"),  # flipped byte
        (lambda b: b"", "corrupt"),
        (lambda b: b"\x00garbage" * 10, "corrupt"),
    ],
)
def test_a_corrupt_file_is_refused_naming_the_file_and_the_fault(
    tmp_path: Path, mangle: Any, says: str
) -> None:
    path, data = _good_file(tmp_path)
    path.write_bytes(mangle(data))
    with pytest.raises(SnapshotRefused) as err:
        MobileSnapshot.load(path)
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_refused_file_leaves_the_caller_with_its_previous_durable_snapshot(
    tmp_path: Path,
) -> None:
    path, data = _good_file(tmp_path)
    previous = MobileSnapshot.load(path)
    path.write_bytes(data[:100])
    kept, refusal = MobileSnapshot.load_or_keep(path, previous)
    assert kept is previous
    assert isinstance(refusal, SnapshotRefused)
    assert path.read_bytes() == data[:100]  # the refused file is not touched either


def test_a_foreign_version_is_refused_as_foreign_not_as_corrupt(tmp_path: Path) -> None:
    path, data = _good_file(tmp_path)
    envelope = msgpack.unpackb(data)
    envelope["version"] = FORMAT_VERSION + 1
    path.write_bytes(msgpack.packb(envelope))
    with pytest.raises(SnapshotRefused, match=r"format version 2 is foreign.*reads version 1"):
        MobileSnapshot.load(path)


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.msgpack"
    path.write_bytes(msgpack.packb({"hello": "world"}))
    with pytest.raises(SnapshotRefused, match="not an exarch MobileSnapshot"):
        MobileSnapshot.load(path)


def test_a_missing_file_is_refused_as_missing(tmp_path: Path) -> None:
    with pytest.raises(SnapshotMissing, match="no such file"):
        MobileSnapshot.load(tmp_path / "nope.msgpack")


def test_a_body_with_a_malformed_field_is_refused(tmp_path: Path) -> None:
    snap = make_snapshot(PlainCodec())
    bad = MobileSnapshot(snap.agent, snap.epoch, {"x": "not bytes"}, {}, {}, {})  # type: ignore[dict-item]
    with pytest.raises(SnapshotRefused, match="'bindings'"):
        MobileSnapshot.decode(bad.encode())


def test_a_binding_the_codec_cannot_decode_refuses_the_snapshot_by_name() -> None:
    snap = make_snapshot(PlainCodec())

    def broken(data: bytes) -> Any:
        raise ValueError("bad ext type")

    with pytest.raises(SnapshotRefused, match="binding 'x'"):
        snap.decoded_bindings(broken)
