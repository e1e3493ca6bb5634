"""The binding log and the snapshot keeper: base plus log reads back every committed binding; a
torn last frame is ignored, a corrupt middle frame refused, a stale log ignored; any sequence of
sets, removals and compactions reads back as a dict model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.actors.frames import Frame
from exarch_actors.actors.shell_snapshot import SnapshotKeeper
from exarch_actors.runtime.errors import SnapshotRefused
from exarch_actors.runtime.shell.ledger import BindingLedger
from exarch_actors.runtime.state.binding_log import BindingLogDamaged, log_path, read_log
from exarch_actors.runtime.state.snapshot import MobileSnapshot


def _keeper(path: Path, **kwargs: Any) -> tuple[SnapshotKeeper, list[Any]]:
    failures: list[Any] = []
    keeper = SnapshotKeeper("a", path, notify=failures.extend, **kwargs)
    _boot(keeper, {})
    return keeper, failures


def _boot(keeper: SnapshotKeeper, bindings: dict[str, bytes]) -> None:
    """What a fresh host reports: the scope it was given, the whole (unarmed) ledger."""
    keeper.reset(bindings, {"cwd": "/"})
    ledger = BindingLedger().to_state()
    keeper.apply(Frame("snapshot", {"bindings": {}, "context": {"cwd": "/"}, "ledger": ledger}))


def _frame(
    set_: dict[str, bytes] | None = None, removed: list[str] | None = None, **extra: Any
) -> Frame:
    fields: dict[str, Any] = {
        "bindings": set_ or {},
        "removed": removed or [],
        "context": extra.pop("context", {"cwd": "/"}),
        "ledger_delta": extra.pop("ledger_delta", {"clock": 0, "pinned": []}),
    }
    return Frame("snapshot", fields)


def _commit(keeper: SnapshotKeeper, epoch: int, **kwargs: Any) -> None:
    keeper.apply(_frame(**kwargs))
    keeper.checkpoint(epoch, {})


def _three_commits(tmp_path: Path) -> Path:
    path = tmp_path / "snapshot.msgpack"
    keeper, _ = _keeper(path)
    keeper.checkpoint(0, {})  # the base
    _commit(keeper, 1, set_={"x": b"1"})
    _commit(keeper, 2, set_={"y": b"2"})
    _commit(keeper, 3, set_={"z": b"3"}, removed=["x"])
    return path


def test_base_plus_log_reads_back_every_committed_change(tmp_path: Path) -> None:
    path = _three_commits(tmp_path)
    assert MobileSnapshot.load_base(path).bindings == {}  # all of it is in the log
    snap = MobileSnapshot.load(path)
    assert dict(snap.bindings) == {"y": b"2", "z": b"3"} and snap.epoch == 3


def test_a_torn_last_frame_is_ignored_at_every_cut_and_the_frames_before_it_are_kept(
    tmp_path: Path,
) -> None:
    path = _three_commits(tmp_path)
    log = log_path(path)
    whole = log.read_bytes()
    last = read_log(log, MobileSnapshot.load_base(path).base_id or (0, 0))
    assert len(last.records) == 3
    # where the last frame starts: the log as it was after the second commit
    before_last = whole[: len(whole) - _last_frame_size(whole)]
    for cut in range(len(before_last), len(whole)):
        log.write_bytes(whole[:cut])
        snap = MobileSnapshot.load(path)
        assert dict(snap.bindings) == {"x": b"1", "y": b"2"}, cut
        assert snap.epoch == 2


def test_a_corrupt_last_frame_is_ignored_like_a_torn_one(tmp_path: Path) -> None:
    path = _three_commits(tmp_path)
    log = log_path(path)
    data = bytearray(log.read_bytes())
    data[-1] ^= 0xFF  # the last payload byte: its checksum no longer matches
    log.write_bytes(bytes(data))
    assert dict(MobileSnapshot.load(path).bindings) == {"x": b"1", "y": b"2"}


def test_a_corrupt_frame_in_the_middle_refuses_the_snapshot_naming_the_log(
    tmp_path: Path,
) -> None:
    path = _three_commits(tmp_path)
    log = log_path(path)
    data = bytearray(log.read_bytes())
    data[len(data) - _last_frame_size(bytes(data)) - 1] ^= 0xFF  # the second commit's frame
    log.write_bytes(bytes(data))
    with pytest.raises(BindingLogDamaged, match=r"snapshot\.msgpack\.log.*corrupt"):
        MobileSnapshot.load(path)
    assert isinstance(BindingLogDamaged("x"), SnapshotRefused)  # resume's typed refusal


def test_a_log_left_from_before_a_compaction_is_ignored_as_already_folded_in(
    tmp_path: Path,
) -> None:
    path = _three_commits(tmp_path)
    old_log = log_path(path).read_bytes()
    keeper, _ = _keeper(tmp_path / "other.msgpack")
    _boot(keeper, {"y": b"2", "z": b"3", "w": b"4"})
    keeper.checkpoint(4, {})
    path.write_bytes((tmp_path / "other.msgpack").read_bytes())  # a new base, the old log
    log_path(path).write_bytes(old_log)
    assert dict(MobileSnapshot.load(path).bindings) == {"y": b"2", "z": b"3", "w": b"4"}


def test_the_log_is_compacted_into_a_new_base_once_it_outgrows_the_base(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.msgpack"
    keeper, _ = _keeper(path, compact_floor=1024)
    _boot(keeper, {"big": b"b" * 4096})
    keeper.checkpoint(0, {})
    assert keeper.compactions == 1
    for i in range(1, 10):
        _commit(keeper, i, set_={"v": bytes(600)})
    assert keeper.compactions == 2  # ~5.4 KiB appended > the 4 KiB base
    assert log_path(path).stat().st_size <= 4096 + 1024
    assert set(MobileSnapshot.load(path).bindings) == {"big", "v"}


def test_a_hundred_thousand_bindings_checkpoint_one_change_as_one_small_frame(
    tmp_path: Path,
) -> None:
    path = tmp_path / "snapshot.msgpack"
    keeper, _ = _keeper(path)
    ledger = BindingLedger()
    ledger.arm([])
    scope = {f"v{i}": f"value {i}".encode() for i in range(100_000)}
    for name, blob in scope.items():
        ledger.note_define(name, 1, len(blob))
    keeper.reset(scope, {"cwd": "/"})
    keeper.apply(
        Frame("snapshot", {"bindings": {}, "context": {"cwd": "/"}, "ledger": ledger.to_state()})
    )
    ledger.take_delta()
    keeper.checkpoint(1, {})
    log = log_path(path)
    for epoch in range(2, 12):
        size = log.stat().st_size
        name = f"v{epoch}"
        ledger.note_define(name, epoch, 9)
        ledger.tick()
        keeper.apply(_frame(set_={name: b"changed"}, ledger_delta=ledger.take_delta()))
        keeper.checkpoint(epoch, {})
        assert log.stat().st_size - size < 200, "one changed binding, one small frame"
    snap = MobileSnapshot.load(path)
    assert len(snap.bindings) == 100_000
    assert snap.bindings["v11"] == b"changed" and snap.bindings["v12"] == b"value 12"
    assert snap.ledger["last_use"]["v11"] == 11 and len(snap.ledger["last_use"]) == 100_000


def _last_frame_size(log: bytes) -> int:
    """Size of the last whole frame of ``log`` (walking the length prefixes)."""
    pos, last = 0, 0
    while pos < len(log):
        last = 8 + int.from_bytes(log[pos : pos + 4], "big")
        pos += last
    return last


_NAMES = st.sampled_from([f"n{i}" for i in range(6)])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _NAMES, st.binary(max_size=300)),
        st.tuples(st.just("remove"), _NAMES, st.just(b"")),
        st.tuples(st.just("checkpoint"), st.just(""), st.just(b"")),
        st.tuples(st.just("clear"), st.just(""), st.just(b"")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, floor=st.sampled_from([0, 256, 1024, 1 << 20]))
def test_any_sequence_of_sets_removals_and_compactions_reads_back_as_a_dict_model(
    ops: list[tuple[str, str, bytes]], floor: int
) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "snapshot.msgpack"
        keeper, failures = _keeper(path, compact_floor=floor)
        keeper.checkpoint(0, {})
        model: dict[str, bytes] = {}  # what the last checkpoint committed
        pending: dict[str, bytes | None] = {}
        epoch = 0
        for op, name, value in ops:
            if op == "set":
                pending[name] = value
            elif op == "remove":
                pending[name] = None
            elif op == "clear":  # a fresh host: empty scope, written as a new base
                _boot(keeper, {})
                pending.clear()
                model.clear()
                keeper.checkpoint(epoch, {})
            else:
                epoch += 1
                keeper.apply(
                    _frame(
                        set_={n: v for n, v in pending.items() if v is not None},
                        removed=[n for n, v in pending.items() if v is None],
                    )
                )
                keeper.checkpoint(epoch, {})
                for n, v in pending.items():
                    if v is None:
                        model.pop(n, None)
                    else:
                        model[n] = v
                pending.clear()
            assert dict(MobileSnapshot.load(path).bindings) == model
        assert keeper.bindings == model and not failures


def test_a_keeper_that_never_checkpointed_leaves_the_files_it_would_resume_from_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "snapshot.msgpack"
    first, _ = _keeper(path)
    _commit(first, 1, set_={"kept": b"1"})  # compacts: base + log on disk
    first.flush()
    files = (path.read_bytes(), log_path(path).read_bytes())
    resumed = SnapshotKeeper("a", path, notify=lambda n: None)
    resumed.reset(dict(MobileSnapshot.load(path).bindings), {"cwd": "/"})
    resumed.flush()  # its host never booted: a failed resume closes without a checkpoint
    assert (path.read_bytes(), log_path(path).read_bytes()) == files
    assert MobileSnapshot.load(path).epoch == 1


def test_a_dead_writers_temp_files_are_swept_at_the_next_keepers_first_compaction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "snapshot.msgpack"
    litter = [
        tmp_path / ".snapshot.msgpack.999999.1.tmp",
        tmp_path / ".snapshot.msgpack.log.999999.tmp",
    ]
    for p in litter:
        p.write_bytes(b"half a compaction")
    unrelated = tmp_path / ".events.jsonl.999999.1.tmp"
    unrelated.write_bytes(b"not ours")
    keeper, _ = _keeper(path)
    keeper.checkpoint(0, {})
    assert not any(p.exists() for p in litter) and unrelated.exists()
