"""MobileSnapshot: round trip, refusal of corrupt and foreign files, and incremental encoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from runtime.errors import SnapshotRefused
from runtime.ral.context import DynamicContext, Grants
from runtime.shell.ledger import BindingLedger
from runtime.shell.worker_retention import WorkerRegistry
from runtime.state.snapshot import (
    FORMAT,
    FORMAT_VERSION,
    BindingEncodingCache,
    MobileSnapshot,
    SnapshotBuilder,
    SnapshotMissing,
)


class CountingCodec:
    """A plain-msgpack value codec that counts how often it encodes (stands in for the ral
    codec, whose own tests cover value fidelity; here only *how often* matters)."""

    def __init__(self) -> None:
        self.calls = 0
        self.encoded: list[Any] = []

    def encode(self, value: Any) -> bytes:
        self.calls += 1
        self.encoded.append(value)
        return msgpack.packb(value, use_bin_type=True)

    @staticmethod
    def decode(data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False)


def context() -> DynamicContext:
    return DynamicContext(cwd="/work", env={"A": "1"}, grants=Grants.granting(exec=["ls"]))


def make_snapshot(codec: CountingCodec, bindings: dict[str, Any] | None = None) -> MobileSnapshot:
    ledger = BindingLedger()
    ledger.arm(["lib"])
    ledger.note_define("x", ledger.tick(), 9)
    workers = WorkerRegistry()
    workers.register("w1", 1, 1.5)
    builder = SnapshotBuilder("alice", encode=codec.encode)
    return builder.checkpoint(
        epoch=7,
        context=context().to_dict(),
        ledger=ledger.to_state(),
        workers=workers.to_state(),
        bindings=bindings if bindings is not None else {"x": 41, "xs": [1, "two", {"m": 3}]},
    )


def test_a_snapshot_round_trips_through_its_file(tmp_path: Path) -> None:
    codec = CountingCodec()
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
    make_snapshot(CountingCodec()).write_atomic(path)
    envelope = msgpack.unpackb(path.read_bytes())
    assert (envelope["format"], envelope["version"]) == (FORMAT, FORMAT_VERSION)
    assert msgpack.unpackb(envelope["body"])["agent"] == "alice"


def _good_file(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "snapshot.msgpack"
    make_snapshot(CountingCodec()).write_atomic(path)
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
    snap = make_snapshot(CountingCodec())
    bad = MobileSnapshot(snap.agent, snap.epoch, {"x": "not bytes"}, {}, {}, {})  # type: ignore[dict-item]
    with pytest.raises(SnapshotRefused, match="'bindings'"):
        MobileSnapshot.decode(bad.encode())


# -- incremental encoding ---------------------------------------------------------------------


def test_a_checkpoint_after_one_change_encodes_only_that_binding() -> None:
    codec = CountingCodec()
    scope: dict[str, Any] = {f"n{i}": [i, f"v{i}"] for i in range(1000)}
    builder = SnapshotBuilder("a", encode=codec.encode)
    builder.checkpoint(epoch=1, context={}, ledger={}, workers={}, bindings=scope)
    assert codec.calls == 1000
    scope["n500"] = "changed"
    snap = builder.checkpoint(epoch=2, context={}, ledger={}, workers={}, bindings=scope)
    assert codec.encoded[1000:] == ["changed"]
    assert codec.decode(snap.bindings["n500"]) == "changed"
    assert len(snap.bindings) == 1000


def test_an_unchanged_scope_checkpoints_without_encoding_anything() -> None:
    codec = CountingCodec()
    scope = {"a": [1], "b": "x"}
    builder = SnapshotBuilder("a", encode=codec.encode)
    first = builder.checkpoint(epoch=1, context={}, ledger={}, workers={}, bindings=scope)
    second = builder.checkpoint(epoch=2, context={}, ledger={}, workers={}, bindings=dict(scope))
    assert codec.calls == 2
    assert second.packed_bindings is first.packed_bindings  # the section is not even re-joined


def test_a_name_rebound_several_times_in_one_run_is_encoded_once() -> None:
    codec = CountingCodec()
    cache = BindingEncodingCache(codec.encode)
    for i in range(5):
        cache.put("x", [i])
    cache.packed_section()
    assert codec.encoded == [[4]]


def test_the_large_binding_size_and_the_checkpoint_share_one_encoding() -> None:
    codec = CountingCodec()
    cache = BindingEncodingCache(codec.encode)
    cache.put("big", "x" * 1000)
    assert cache.size_of("big") == len(codec.encode("x" * 1000))
    cache.packed_section()
    assert codec.calls == 2  # one by the cache, one by this test's own comparison


def test_a_dropped_or_vanished_binding_leaves_the_next_snapshot() -> None:
    codec = CountingCodec()
    builder = SnapshotBuilder("a", encode=codec.encode)
    builder.checkpoint(epoch=1, context={}, ledger={}, workers={}, bindings={"a": 1, "b": 2})
    builder.cache.drop("a")
    assert builder.checkpoint(epoch=2, context={}, ledger={}, workers={}).names() == {"b"}
    snap = builder.checkpoint(epoch=3, context={}, ledger={}, workers={}, bindings={})
    assert snap.names() == frozenset()
    assert codec.calls == 2


def test_after_a_restore_the_next_checkpoint_re_encodes_nothing_that_came_back(
    tmp_path: Path,
) -> None:
    codec = CountingCodec()
    path = tmp_path / "s.msgpack"
    make_snapshot(codec).write_atomic(path)
    loaded = MobileSnapshot.load(path)
    values = loaded.decoded_bindings(codec.decode)
    builder = SnapshotBuilder("alice", encode=codec.encode)
    builder.adopt(loaded, values)
    before = codec.calls
    again = builder.checkpoint(epoch=8, context={}, ledger={}, workers={}, bindings=values)
    assert codec.calls == before
    assert again.bindings == loaded.bindings


def test_a_binding_the_codec_cannot_decode_refuses_the_snapshot_by_name() -> None:
    snap = make_snapshot(CountingCodec())

    def broken(data: bytes) -> Any:
        raise ValueError("bad ext type")

    with pytest.raises(SnapshotRefused, match="binding 'x'"):
        snap.decoded_bindings(broken)


def test_the_define_hook_re_putting_the_same_value_object_encodes_nothing_new() -> None:
    codec = CountingCodec()
    cache = BindingEncodingCache(codec.encode)
    value = {"rows": list(range(100))}
    cache.put("x", value)
    cache.packed_section()
    cache.put("x", value)  # e.g. `let x = $x`: the same immutable object
    cache.packed_section()
    assert codec.calls == 1
