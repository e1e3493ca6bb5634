"""A node's settlement records made in a batch land as one-by-one appends would, in one write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.state import durability
from runtime.state.durable import read_jsonl
from runtime.state.journal import AlreadyTerminal, MismatchedEnvironment, SpawnJournal, replay
from runtime.state.journal_batch import JournalBatch

ENV = "agent:kid"


def admitted(journal: SpawnJournal, node: str = "kid") -> None:
    journal.spawned(node, parent="trunk")
    journal.admitted(node, "intent")
    journal.admitted(node, "environment", environmentId=ENV, pid=4242, scratch="/s/kid")
    journal.admitted(node, "dispatched")


def settlement(journal: SpawnJournal, turns: int, ending: str, node: str = "kid") -> None:
    """What a spawn site writes at a child's end (actors/fleet.py ``_settle_child``)."""
    for t in range(turns):
        journal.execution_result(node, turn=t, events=[], snapshot=None, outcome="cancelled")
    journal.environment_teardown(node, {"environmentId": ENV, "destroyed": True, "detail": "d"})
    if ending == "cancelled":
        journal.cancelled(node, ack="accepted", detail="ended")
    else:
        journal.settled(node, ending, reason="completed")


def without_at(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "at"} for r in records]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.integers(0, 3),
    ending=st.sampled_from(["cancelled", "done", "down"]),
    others=st.integers(0, 3),
)
def test_a_batch_writes_the_records_one_by_one_appends_would_in_one_write(
    tmp_path_factory: pytest.TempPathFactory, turns: int, ending: str, others: int
) -> None:
    root = tmp_path_factory.mktemp("batch")
    plain = SpawnJournal(root / "plain.jsonl")
    batched = SpawnJournal(root / "batched.jsonl")
    files = durability.bind(root, durability.Durability.PROCESS)
    try:
        for journal in (plain, batched):
            admitted(journal)
            for i in range(others):  # other nodes' records before the batch commits
                journal.spawned(f"other-{i}")
        settlement(plain, turns, ending)
        writer = durability.writer_for(batched.path)
        assert writer is not None
        before = writer.records
        with JournalBatch(batched, "kid") as batch:
            settlement(batch, turns, ending)
        assert writer.records == before + 1
    finally:
        durability.unbind(files)
    written = read_jsonl(batched.path).records
    assert without_at(written) == without_at(read_jsonl(plain.path).records)
    assert replay(batched.path).state.nodes["kid"].terminal is not None
    assert batched.state.terminal_records().keys() == {"kid"}


def test_a_record_refused_in_a_batch_raises_where_it_is_made_and_the_earlier_ones_land(
    tmp_path: Path,
) -> None:
    journal = SpawnJournal(tmp_path / "j.jsonl")
    admitted(journal)
    with pytest.raises(AlreadyTerminal), JournalBatch(journal, "kid") as batch:
        batch.execution_result("kid", turn=0, events=[], snapshot=None)
        batch.cancelled("kid", ack="accepted", detail="ended")
        batch.settled("kid", "done")  # a second terminal record
    kinds = [r["kind"] for r in read_jsonl(journal.path).records]
    assert kinds[-2:] == ["execution-result", "cancelled"]
    assert journal.state.nodes["kid"].terminal is not None


def test_a_receipt_for_another_environment_is_refused_in_a_batch_before_anything_is_written(
    tmp_path: Path,
) -> None:
    journal = SpawnJournal(tmp_path / "j.jsonl")
    admitted(journal)
    lines = len(read_jsonl(journal.path).records)
    batch = JournalBatch(journal, "kid")
    with pytest.raises(MismatchedEnvironment):
        batch.environment_teardown(
            "kid", {"environmentId": "agent:x", "destroyed": True, "detail": ""}
        )
    assert len(read_jsonl(journal.path).records) == lines
    assert batch.commit() == []


def test_a_batch_whose_node_moved_meanwhile_appends_each_record_checked_on_its_own(
    tmp_path: Path,
) -> None:
    journal = SpawnJournal(tmp_path / "j.jsonl")
    admitted(journal)
    batch = JournalBatch(journal, "kid")
    batch.execution_result("kid", turn=1, events=[], snapshot=None)
    journal.cancelled("kid", ack="accepted", detail="another writer closed it")
    with pytest.raises(AlreadyTerminal):
        batch.commit()
    kinds = [r["kind"] for r in read_jsonl(journal.path).records]
    assert kinds[-1] == "cancelled"
    assert replay(journal.path).state.nodes["kid"].results == []


def test_a_batch_takes_only_its_own_nodes_settlement_records(tmp_path: Path) -> None:
    journal = SpawnJournal(tmp_path / "j.jsonl")
    admitted(journal)
    admitted(journal, "sibling")
    batch = JournalBatch(journal, "kid")
    with pytest.raises(ValueError):
        batch.execution_result("sibling", turn=0, events=[], snapshot=None)
    with pytest.raises(ValueError):
        batch.spawned("kid-2")
