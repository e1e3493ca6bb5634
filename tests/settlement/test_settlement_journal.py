"""The spawn journal: replay equality, torn tails, reused seqs, phase order (Hypothesis)."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.settlement.fleet_yield import fleet_yield
from exarch_actors.runtime.state.durable import read_jsonl, torn_path
from exarch_actors.runtime.state.journal import (
    PHASES,
    AlreadyTerminal,
    DuplicateSeq,
    InconsistentRecord,
    MalformedRecord,
    PhaseOrderRefused,
    SeqRefused,
    SpawnJournal,
    UnknownNode,
    fold_settlement,
    replay,
)
from tests.support.records import record_of, sealed

Op = tuple[str, str, dict[str, Any]]


@st.composite
def lifecycle(draw: st.DrawFn, node: str) -> list[Op]:
    """One node's valid record sequence: spawned, some phases, and one of every ending."""
    ops: list[Op] = [("spawned", node, {})]
    k = draw(st.integers(0, 3))
    env = f"env-{node}"
    for phase in PHASES[:k]:
        extra = (
            {"environmentId": env, "pid": 4242, "scratch": f"/s/{node}"}
            if phase == "environment"
            else {}
        )
        ops.append(("execution-admitted", node, {"phase": phase, **extra}))
    if k == 3:
        for t in range(draw(st.integers(0, 2))):
            ops.append(("execution-result", node, {"turn": t, "events": [{"e": t}]}))
    endings = ["open", "settled", "cancelled"] + (
        ["pending", "released", "unconfirmed"] if k >= 2 else []
    )
    ending = draw(st.sampled_from(endings))
    status = draw(st.sampled_from(["done", "down"]))
    receipt = {"environmentId": env, "detail": "d"}
    if ending == "settled":
        ops.append(("settled", node, {"status": status, "spend": {"tokensIn": 1, "tokensOut": 2}}))
    elif ending == "cancelled":
        ops.append(("cancelled", node, {"ack": "unknown", "detail": "local abort"}))
    elif ending in ("pending", "released", "unconfirmed"):
        ops.append(("reconciled", node, {"spend": {"tokensIn": None}, "reason": "floor"}))
        ops.append(
            (
                "settled",
                node,
                {
                    "status": status,
                    "retainedExecution": "pending",
                    "retainedPendingCause": "unobservable",
                },
            )
        )
        if ending == "released":
            ops.append(("environment-teardown", node, {**receipt, "destroyed": True}))
            ops.append(("settled", node, {"status": status, "retainedExecution": "released"}))
        elif ending == "unconfirmed":
            ops.append(("environment-teardown", node, {**receipt, "destroyed": False}))
            ops.append(("teardown-unconfirmed", node, {"environmentId": env, "pid": 4242}))
            ops.append(
                ("settled", node, {"status": status, "retainedExecution": "release-unconfirmed"})
            )
    return ops


@st.composite
def journals(draw: st.DrawFn) -> list[Op]:
    n = draw(st.integers(1, 6))
    queues = [draw(lifecycle(f"n{i}")) for i in range(n)]
    schedule = draw(st.lists(st.integers(0, n - 1), max_size=60))
    out: list[Op] = []
    for i in schedule:
        if queues[i]:
            out.append(queues[i].pop(0))
    for q in queues:
        out.extend(q)
    return out


def _write(ops: list[Op], path: Path) -> SpawnJournal:
    j = SpawnJournal(path)
    for kind, node, fields in ops:
        j.append(kind, node, **fields)
    return j


_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(journals())
def test_replaying_a_journal_restores_the_identical_settlement_state(ops: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as d:
        j = _write(ops, Path(d) / "spawn-journal.jsonl")
        rep = replay(j.path)
        assert rep.damage == [] and rep.refused == []
        assert rep.state.terminal_records() == j.state.terminal_records()
        assert rep.state.never_settled == j.state.never_settled
        assert fleet_yield(rep.state) == fleet_yield(j.state)
        assert [r["seq"] for r in rep.records] == list(range(len(ops)))


@_SETTINGS
@given(journals(), st.data())
def test_a_torn_tail_is_reported_and_the_readable_prefix_is_used(ops: list[Op], data) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "spawn-journal.jsonl"
        _write(ops, path)
        raw = path.read_bytes()
        last_start = raw.rstrip(b"\n").rfind(b"\n") + 1
        cut = data.draw(st.integers(last_start + 1, len(raw) - 2), label="cut")
        path.write_bytes(raw[:cut])
        rep = replay(path)
        assert rep.torn and len(rep.records) == len(ops) - 1
        assert rep.state.terminal_records() == fold_settlement(rep.records).terminal_records()
        j, _ = SpawnJournal.open(path)  # a writer resuming after the crash
        j.spawned("after-crash")
        again = replay(path)
        assert not again.torn and again.damage == []  # the fragment was set aside, not kept
        assert again.records[-1]["id"] == "after-crash"
        aside = read_jsonl(torn_path(path)).records
        assert [base64.b64decode(r["bytes"]) for r in aside] == [raw[last_start:cut]]


@_SETTINGS
@given(journals(), st.data())
def test_a_reused_seq_is_refused_on_replay(ops: list[Op], data) -> None:
    if len(ops) < 2:
        return
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "spawn-journal.jsonl"
        _write(ops, path)
        lines = path.read_bytes().splitlines()
        i = data.draw(st.integers(1, len(lines) - 1), label="victim")
        reused = data.draw(st.integers(0, i - 1), label="reused")
        rec = record_of(lines[i])
        rec["seq"] = reused
        lines[i] = sealed(rec).rstrip(b"\n")
        path.write_bytes(b"\n".join(lines) + b"\n")
        with pytest.raises(DuplicateSeq):
            replay(path)
        lenient = replay(path, strict=False)
        assert len(lenient.refused) >= 1 and isinstance(lenient.refused[0], DuplicateSeq)


@given(st.lists(st.sampled_from(PHASES), max_size=6))
def test_admission_phases_are_accepted_only_in_order_intent_environment_dispatched(
    phases: list[str],
) -> None:
    st_ = fold_settlement([{"kind": "spawned", "seq": 0, "id": "n"}])
    accepted: list[str] = []
    for i, phase in enumerate(phases, start=1):
        rec = {
            "kind": "execution-admitted",
            "seq": i,
            "id": "n",
            "phase": phase,
            "environmentId": "e",
        }
        expected = PHASES[len(accepted)] if len(accepted) < 3 else None
        if phase == expected:
            st_.apply(rec)
            accepted.append(phase)
        else:
            with pytest.raises(PhaseOrderRefused):
                st_.apply(rec)
            st_.last_seq = i  # the refused record consumed nothing; keep seqs moving
    assert accepted == list(PHASES[: len(accepted)])
    assert st_.nodes["n"].phases == accepted


def test_dispatched_before_environment_is_refused(journal) -> None:
    journal.spawned("n")
    journal.admitted("n", "intent")
    with pytest.raises(PhaseOrderRefused, match="next must be 'environment'"):
        journal.admitted("n", "dispatched")
    assert replay(journal.path).state.nodes["n"].phases == ["intent"]  # nothing written


def test_a_second_terminal_record_is_refused(journal) -> None:
    journal.spawned("n")
    journal.settled("n", "done")
    with pytest.raises(AlreadyTerminal):
        journal.settled("n", "down")
    with pytest.raises(AlreadyTerminal):
        journal.cancelled("n", ack="unknown", detail="late")


def test_records_about_unknown_nodes_or_of_unknown_kinds_are_refused(journal) -> None:
    with pytest.raises(UnknownNode):
        journal.settled("ghost", "done")
    journal.spawned("n")
    with pytest.raises(MalformedRecord):
        journal.append("exploded", "n")
    with pytest.raises(MalformedRecord):
        journal.settled("n", "maybe")


def test_a_pending_slot_without_an_environment_is_refused(journal) -> None:
    journal.spawned("n")
    with pytest.raises(InconsistentRecord, match="without an admitted environment"):
        journal.settled("n", "down", retained="pending", cause="unobservable")


def test_a_lower_unused_seq_is_refused_as_out_of_order() -> None:
    st_ = fold_settlement(
        [{"kind": "spawned", "seq": 0, "id": "a"}, {"kind": "spawned", "seq": 5, "id": "b"}]
    )
    with pytest.raises(SeqRefused) as e:
        st_.apply({"kind": "spawned", "seq": 3, "id": "c"})
    assert not isinstance(e.value, DuplicateSeq)
