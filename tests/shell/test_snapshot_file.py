"""The durable snapshot file: written atomically each clean boundary, reloadable, never clobbered
by a corrupt read."""

from __future__ import annotations

from pathlib import Path

import pytest

from exarch_actors.runtime.errors import SnapshotRefused
from exarch_actors.runtime.state.snapshot import MobileSnapshot


def test_every_clean_boundary_writes_the_snapshot_atomically_and_it_reloads(
    start_shell, tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    path = tmp_path / "agents" / "trunk" / "snapshot.msgpack"
    shell.run("let a = [1, 2]; cd /tmp").get()
    shell.run("let b = { echo $a }; div 1 0").get()  # a ral error is a clean boundary
    snap = MobileSnapshot.load(path)
    assert set(snap.bindings) == {"a", "b"} and snap.epoch == 2
    assert snap.context["cwd"] == "/tmp"
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["snapshot.msgpack", "snapshot.msgpack.log"]  # base + log, no temp left
    resumed = start_shell(name="resumed", snapshot=snap).proxy()
    r = resumed.run("b; pwd").get()
    assert r.stdout == "[1, 2]\n" and r.value == "/tmp"
    assert resumed.probe().get().live_bindings == 2  # the ledger state came back too


def test_a_corrupt_snapshot_is_refused_and_the_previous_one_kept(
    start_shell, tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    shell.run("let a = 1").get()
    path = tmp_path / "agents" / "trunk" / "snapshot.msgpack"
    previous = MobileSnapshot.load(path)
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    kept, refusal = MobileSnapshot.load_or_keep(path, previous)
    assert kept is previous and isinstance(refusal, SnapshotRefused)
    with pytest.raises(SnapshotRefused, match="corrupt"):
        MobileSnapshot.load(path)
    # the next compaction (here: a binding over the log's 1 MiB bound) replaces it whole
    shell.run("let b = seq 1 200000").get()
    assert set(MobileSnapshot.load(path).bindings) == {"a", "b"}


def test_checkpoints_ship_only_the_bindings_a_run_changed(start_shell, tmp_path: Path) -> None:
    shell = start_shell().proxy()
    shell.run("let a = 1; let b = 2").get()
    first = shell.durable_snapshot().get()
    shell.run("let b = 3").get()
    second = shell.durable_snapshot().get()
    assert second.bindings["a"] is first.bindings["a"]  # the cached encoding, not a re-encode
    assert second.bindings["b"] != first.bindings["b"]


def test_a_forked_child_seals_its_whole_inherited_scope_as_baseline(start_shell) -> None:
    parent = start_shell(notice_sink=lambda n: None).proxy()
    parent.run("let a = 1; let b = 2").get()
    child = start_shell(
        name="kid", snapshot=parent.fork_snapshot().get(), idle_calls=2, notice_sink=lambda n: None
    ).proxy()
    probe = child.probe().get()
    assert (probe.baseline_bindings, probe.live_bindings, probe.epoch) == (2, 0, 0)
    for _ in range(4):
        child.run("1").get()
    assert child.run("add $a $b").get().value == "3"  # baseline never prunes
