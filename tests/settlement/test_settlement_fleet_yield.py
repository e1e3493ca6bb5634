"""fleetYield counts and per-node spend, and result.json written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exarch_actors.runtime.settlement.fleet_yield import BadOutcome, fleet_yield, write_result
from exarch_actors.runtime.state.journal import SpawnJournal
from exarch_actors.runtime.state.session_dir import SessionDir


def _run(journal: SpawnJournal) -> None:
    env = {"environmentId": "e-r", "pid": 1, "scratch": "/s"}
    journal.spawned("trunk")
    journal.spawned("ok", parent="trunk")
    journal.settled("ok", "done", spend={"tokensIn": 0, "tokensOut": 0, "tokensKnown": True})
    journal.spawned("bad", parent="trunk")
    journal.settled(
        "bad", "down", spend={"tokensIn": None, "tokensOut": None, "tokensKnown": False}
    )
    journal.spawned("stop", parent="trunk")
    journal.cancelled("stop", ack="unknown", detail="local abort")
    journal.spawned("r", parent="trunk")
    journal.admitted("r", "intent")
    journal.admitted("r", "environment", **env)
    journal.reconciled(
        "r", spend={"tokensIn": 7, "tokensOut": 3, "tokensKnown": True}, reason="floor"
    )
    journal.settled("r", "down", retained="pending", cause="unobservable")
    journal.teardown_unconfirmed("r", environment_id="e-r", pid=1, scratch="/s")
    journal.settled("r", "down", retained="release-unconfirmed")


def test_fleet_yield_counts_every_category_and_the_open_trunk(journal: SpawnJournal) -> None:
    _run(journal)
    fy = fleet_yield(journal.state)
    assert (fy.spawned, fy.done, fy.down, fy.cancelled, fy.never_settled) == (5, 1, 2, 1, 1)
    assert fy.release_unconfirmed == 1 and fy.never_settled_ids == ("trunk",)
    assert fy.spawned == fy.done + fy.down + fy.cancelled + fy.never_settled


def test_unknown_tokens_stay_null_and_are_never_summed_as_zero(journal: SpawnJournal) -> None:
    _run(journal)
    doc = fleet_yield(journal.state).to_json()
    assert doc["spend"]["ok"]["tokensIn"] == 0 and doc["spend"]["ok"]["tokensKnown"] is True
    assert doc["spend"]["bad"]["tokensIn"] is None and doc["spend"]["bad"]["tokensKnown"] is False
    assert doc["spend"]["r"] == {
        "tokensIn": 7,
        "tokensOut": 3,
        "tokensKnown": True,
        "wallSeconds": None,
        "source": "floor",
        "cacheWrite": None,
        "cacheRead": None,
        "costUsd": None,
    }
    assert doc["tokens"] == {
        "in": 7,
        "out": 3,
        "cacheWrite": 0,
        "cacheRead": 0,
        "knownNodes": 2,
        "unknownNodes": 3,
    }


def test_write_result_writes_the_contract_fields_atomically(tmp_path: Path, journal) -> None:
    _run(journal)
    journal.settled("trunk", "done")
    path = write_result(
        SessionDir(tmp_path), "replied", "3 files", fleet_yield(journal.state), runId="x"
    )
    doc = json.loads(path.read_text())
    assert path.name == "result.json" and doc["outcome"] == "replied" and doc["reply"] == "3 files"
    fy = doc["fleetYield"]
    for key in ("spawned", "done", "down", "cancelled", "neverSettled", "releaseUnconfirmed"):
        assert isinstance(fy[key], int), key
    assert fy["neverSettled"] == 0 and doc["runId"] == "x"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_write_result_refuses_an_unknown_outcome_and_keeps_the_old_file(tmp_path, journal) -> None:
    path = write_result(SessionDir(tmp_path), "quiesced", None, fleet_yield(journal.state))
    old = path.read_bytes()
    with pytest.raises(BadOutcome, match="'finished'"):
        write_result(SessionDir(tmp_path), "finished", None, fleet_yield(journal.state))
    assert path.read_bytes() == old


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        ("replied", "done"),
        ("quiesced", "done"),
        ("capped", "down"),
        ("failed", "down"),
        ("cancelled", "down"),
        (None, "down"),
    ],
)
def test_only_a_normal_end_settles_a_child_done(outcome: str | None, status: str) -> None:
    from exarch_actors.runtime.settlement.fleet_yield import settlement_status

    assert settlement_status(outcome) == status
