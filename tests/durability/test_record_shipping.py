"""Shipping a host's durable writes (``runtime/state/record_mirror.py``): every write made under a
root bound with a sink reaches the driver's session directory byte for byte, in order, and a
host can write nothing there but its own agent's files and ``record.jsonl``."""

from __future__ import annotations

from pathlib import Path

import pytest

from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.binding_log import BindingLogWriter, log_path
from exarch_actors.runtime.state.durability import Durability, ShippedRecord
from exarch_actors.runtime.state.durable import append_jsonl, atomic_write_bytes
from exarch_actors.runtime.state.eventlog import AgentLog
from exarch_actors.runtime.state.record_mirror import (
    RecordRefused,
    agent_files,
    apply_shipped,
    seed,
)
from exarch_actors.runtime.state.session_dir import SessionDir


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("policy", list(Durability))
def test_every_durable_write_a_host_makes_reaches_the_drivers_directory_byte_for_byte(
    tmp_path: Path, policy: Durability
) -> None:
    node, driver = SessionDir.at(tmp_path / "node"), SessionDir.at(tmp_path / "driver")
    shipped: list[ShippedRecord] = []

    def sink(record: ShippedRecord) -> None:
        shipped.append(record)
        apply_shipped(driver, "a", record)

    held = durability.bind(driver.root, policy)
    files = durability.bind(node.root, policy, ship=sink)
    try:
        log = AgentLog(node.events("a"))
        log.append_user("hello")
        append_jsonl(node.record, {"kind": "Commit", "agent": "a"})
        atomic_write_bytes(node.snapshot("a"), b"base one")
        writer = BindingLogWriter(log_path(node.snapshot("a")))
        writer.start((1, 8))
        writer.append({"set": {"x": b"1"}})
        writer.append({"set": {"y": b"2"}})
        writer.close()
        log.restart()  # /clear: events.jsonl archived beside itself, a fresh one begun
        log.append_user("again")
        atomic_write_bytes(node.snapshot("a"), b"base two")
    finally:
        durability.unbind(files)
        durability.unbind(held)
    assert [r.op for r in shipped] == [
        "lines", "lines", "replace", "replace", "bytes", "bytes", "rename", "lines", "lines",
        "replace",
    ]  # fmt: skip
    assert _files(driver.root) == _files(node.root)
    assert len(driver.event_logs("a")) == 2


def test_a_root_bound_without_a_sink_ships_nothing(tmp_path: Path) -> None:
    node = SessionDir.at(tmp_path / "node")
    with durability.bound_to(node.root, Durability.PROCESS):
        AgentLog(node.events("a")).append_user("hello")
        atomic_write_bytes(node.snapshot("a"), b"base")
    assert not (tmp_path / "driver").exists()
    assert node.events("a").exists()


@pytest.mark.parametrize(
    "path",
    [
        "../outside.jsonl",
        "/etc/passwd",
        "agents/b/events.jsonl",
        "agents/a/../b/events.jsonl",
        "agents/a/../../outside",
        "agents/a",
        "agents/a/sub/events.jsonl",
        "run.json",
        "spawn-journal.jsonl",
        "transcript.jsonl",
        "result.json",
        "",
    ],
)
def test_a_host_may_write_only_its_own_agents_files_and_record_jsonl(
    tmp_path: Path, path: str
) -> None:
    driver = SessionDir.at(tmp_path / "driver")
    before = _files(tmp_path)
    with pytest.raises(RecordRefused):
        apply_shipped(driver, "a", ShippedRecord("lines", path, b'{"kind": "x"}\n'))
    with pytest.raises(RecordRefused):  # a rename may not take a file out either
        apply_shipped(driver, "a", ShippedRecord("rename", "agents/a/events.jsonl", b"", path))
    assert _files(tmp_path) == before


def test_an_unknown_operation_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    driver = SessionDir.at(tmp_path / "driver")
    with pytest.raises(RecordRefused, match="unknown record operation"):
        apply_shipped(driver, "a", ShippedRecord("truncate", "agents/a/events.jsonl"))  # type: ignore[arg-type]
    assert _files(driver.root) == {}


def test_a_host_started_elsewhere_is_seeded_with_exactly_the_drivers_copy_of_its_files(
    tmp_path: Path,
) -> None:
    driver, node = SessionDir.at(tmp_path / "driver"), SessionDir.at(tmp_path / "node")
    AgentLog(driver.events("a")).append_user("hello")
    atomic_write_bytes(driver.snapshot("a"), b"base")
    AgentLog(node.events("a")).append_user("a stale copy from an earlier host")
    (node.events("a").parent / "stale.tmp").write_bytes(b"x")
    seed(node, "a", agent_files(driver, "a"))
    assert _files(node.events("a").parent) == _files(driver.events("a").parent)


def test_a_path_shipped_once_goes_to_the_sink_bound_now_after_a_rebind(tmp_path: Path) -> None:
    node = SessionDir.at(tmp_path / "node")
    frame = node.root / "agents" / "a" / "bindings.log"
    first: list[ShippedRecord] = []
    second: list[ShippedRecord] = []
    files = durability.bind(node.root, Durability.PROCESS, ship=first.append)
    durability.shipped(frame, "bytes", b"one")  # its route remembered
    durability.unbind(files)
    durability.shipped(frame, "bytes", b"unbound")  # bound nowhere: shipped nowhere
    files = durability.bind(node.root, Durability.PROCESS, ship=second.append)
    try:
        durability.shipped(str(frame), "bytes", b"two")
    finally:
        durability.unbind(files)
    assert [r.data for r in first] == [b"one"]
    assert second == [ShippedRecord("bytes", "agents/a/bindings.log", b"two")]


def test_a_directory_bound_inside_a_bound_one_takes_the_paths_under_it(tmp_path: Path) -> None:
    outer_sink: list[ShippedRecord] = []
    inner_sink: list[ShippedRecord] = []
    path = tmp_path / "inner" / "agents" / "a" / "bindings.log"
    outer = durability.bind(tmp_path, Durability.PROCESS, ship=outer_sink.append)
    try:
        durability.shipped(path, "bytes", b"one")
        assert durability.bound(path) is outer
        inner = durability.bind(tmp_path / "inner", Durability.PROCESS, ship=inner_sink.append)
        try:
            assert durability.bound(path) is inner
            durability.shipped(path, "bytes", b"two")
        finally:
            durability.unbind(inner)
        assert durability.bound(path) is outer
    finally:
        durability.unbind(outer)
    assert outer_sink == [ShippedRecord("bytes", "inner/agents/a/bindings.log", b"one")]
    assert inner_sink == [ShippedRecord("bytes", "agents/a/bindings.log", b"two")]
