"""Damaged session files: ``check`` names the damage, ``resume`` refuses it typed (exit 2) or heals
it, and neither ever prints a traceback.

The sessions are real: one run SIGKILLed mid-flight (``crashed``, shared per module and copied
per test) and one run that finished (``finished``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import Result

from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import copy_session, exarch_cli
from tests.support.records import record_of, rewrite_document, sealed


@pytest.fixture
def finished(finished_once: Path, tmp_path: Path) -> Path:
    return copy_session(finished_once, tmp_path)


@pytest.fixture
def session(crashed: Path, tmp_path: Path) -> Path:
    return copy_session(crashed, tmp_path)


def resume(session: Path) -> Result:
    return exarch_cli("resume", str(session))


def check(session: Path) -> Result:
    return exarch_cli("check", str(session), "--json")


def _garble_line(path: Path, index: int) -> int:
    """Replace line ``index`` (0-based) with bytes that are not JSON; returns its 1-based line."""
    lines = path.read_bytes().splitlines(keepends=True)
    lines[index] = b"\x00garbled{ not json\n"
    path.write_bytes(b"".join(lines))
    return index + 1


def _violations(report: dict[str, object], name: str) -> list[str]:
    for inv in report["invariants"]:  # type: ignore[attr-defined]
        if inv["name"] == name:
            assert inv["status"] == "violated", inv
            return list(inv["details"])
    raise AssertionError(name)


# --------------------------------------------------------------------------- the journal


def test_a_garbled_journal_line_in_the_middle_is_refused_by_file_and_line_not_a_traceback(
    session: Path,
) -> None:
    line = _garble_line(session / "spawn-journal.jsonl", 2)
    before = (session / "spawn-journal.jsonl").read_bytes()
    res = resume(session)
    assert res.exit_code == 2, res.output
    assert f"spawn-journal.jsonl:{line}: not JSON" in res.output
    assert "Traceback" not in res.output
    assert (session / "spawn-journal.jsonl").read_bytes() == before, "a refusal writes nothing"
    report = json.loads(check(session).output)
    assert any(f"spawn-journal.jsonl:{line}" in d for d in _violations(report, "files-parse"))


def test_a_journal_record_lost_from_the_middle_is_a_seq_gap_and_refused(session: Path) -> None:
    """quick's execution-result gone: the fold cannot tell (settled needs no result), the
    numbering can."""
    path = session / "spawn-journal.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    gone = next(i for i, raw in enumerate(lines) if b'"execution-result"' in raw)
    path.write_bytes(b"".join(lines[:gone] + lines[gone + 1 :]))
    res = resume(session)
    assert res.exit_code == 2
    assert f"spawn-journal.jsonl:{gone + 1}: seq {gone + 1} where {gone} was due" in res.output


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_a_lost_journal_is_refused_by_resume_and_violates_check(session: Path, damage: str) -> None:
    path = session / "spawn-journal.jsonl"
    if damage == "deleted":
        path.unlink()
    else:
        path.write_bytes(b"")
    state = "missing" if damage == "deleted" else "empty"
    res = resume(session)
    assert res.exit_code == 2
    assert f"spawn-journal.jsonl: {state}, but transcript.jsonl records 2 Born" in res.output
    assert not (session / "result.json").exists(), "nothing was resumed"
    report = json.loads(check(session).output)
    assert any(
        f"spawn-journal.jsonl is {state}: transcript.jsonl records 2 Born" in d
        for d in _violations(report, "settled")
    )


def test_check_flags_a_finished_session_whose_journal_is_emptied(finished: Path) -> None:
    (finished / "spawn-journal.jsonl").write_bytes(b"")
    rewrite_document(finished / "result.json", fleetYield={})
    report = check_session(SessionDir(finished))
    assert any(
        "spawn-journal.jsonl is empty: transcript.jsonl records 2 Born child(ren) it never "
        "spawned (a, b)" in d
        for d in report.get("settled").details
    )


# --------------------------------------------------------------------------- result.json


def test_a_corrupt_result_json_is_named_by_check_and_rebuilt_by_resume(finished: Path) -> None:
    original = json.loads((finished / "result.json").read_text())
    (finished / "result.json").write_bytes(b'{"outcome": "replied", "rep')
    report = json.loads(check(finished).output)
    details = _violations(report, "settled")
    assert any(
        f"corrupt result.json at {finished / 'result.json'}" in d
        and f"`exarch-actors resume {finished}` sets it aside and rebuilds it" in d
        for d in details
    ), details
    assert any(d.startswith("result.json: unreadable") for d in _violations(report, "files-parse"))
    res = resume(finished)
    assert res.exit_code == 0, res.output
    rebuilt = json.loads((finished / "result.json").read_text())
    assert rebuilt["outcome"] == original["outcome"] == "replied"
    assert rebuilt["reply"] == original["reply"] == "42", "the reply comes back from Died"
    assert rebuilt["fleetYield"]["spawned"] == 2 and rebuilt["fleetYield"]["neverSettled"] == 0
    assert rebuilt["corruptResultSetAside"] == "result.json.corrupt"
    assert (finished / "result.json.corrupt").read_bytes() == b'{"outcome": "replied", "rep'
    assert check_session(SessionDir(finished)).ok


def test_a_valid_result_json_is_nothing_to_resume(finished: Path) -> None:
    res = resume(finished)
    assert res.exit_code == 2 and "the run already ended" in res.output


# --------------------------------------------------------------------------- the other files


def test_a_corrupt_snapshot_of_an_agent_to_rebuild_is_refused(session: Path) -> None:
    snap = session / "agents" / "slow" / "snapshot.msgpack"
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snap.write_bytes(bytes(data))
    res = resume(session)
    assert res.exit_code == 2
    assert "agents/slow/snapshot.msgpack" in res.output and "checksum" in res.output


def test_a_missing_snapshot_of_an_agent_that_committed_bindings_is_refused(session: Path) -> None:
    (session / "agents" / "slow" / "snapshot.msgpack").unlink()
    res = resume(session)
    assert res.exit_code == 2
    want = "snapshot.msgpack: missing, but agents/slow/commits.jsonl shows slow committed bindings"
    assert want in res.output


def test_a_corrupt_snapshot_of_an_ended_agent_does_not_stop_resume_and_check_names_it(
    session: Path,
) -> None:
    (session / "agents" / "quick" / "snapshot.msgpack").write_bytes(b"not a snapshot")
    res = resume(session)
    assert res.exit_code == 0, res.output
    report = json.loads(check(session).output)
    assert any("agents/quick/snapshot.msgpack" in d for d in _violations(report, "files-parse"))


def test_a_garbled_event_log_line_is_refused_by_file_and_line(session: Path) -> None:
    line = _garble_line(session / "agents" / "trunk" / "events.jsonl", 1)
    res = resume(session)
    assert res.exit_code == 2
    assert f"agents/trunk/events.jsonl:{line}: not JSON" in res.output


def test_an_event_record_of_the_wrong_shape_is_damage_not_a_crash(session: Path) -> None:
    path = session / "agents" / "slow" / "events.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    i = next(i for i, raw in enumerate(lines) if '"kind": "assistant"' in raw)
    record = record_of(lines[i])
    record["message"]["tool_calls"] = [7]
    lines[i] = sealed(record).decode()
    path.write_text("".join(lines))
    res = resume(session)
    assert res.exit_code == 2
    assert f"agents/slow/events.jsonl:{i + 1}: assistant message unreadable" in res.output


def test_a_died_record_with_an_unknown_outcome_is_refused_from_the_transcript(
    session: Path,
) -> None:
    path = session / "transcript.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    i = next(i for i, raw in enumerate(lines) if '"kind": "Died"' in raw)
    lines[i] = sealed({**record_of(lines[i]), "outcome": "bogus"}).decode()
    path.write_text("".join(lines))
    res = resume(session)
    assert res.exit_code == 2
    assert f"transcript.jsonl:{i + 1}: Died outcome 'bogus'" in res.output


def test_a_damaged_run_json_and_a_vanished_scenario_are_refused(session: Path) -> None:
    run = read_json_document(session / "run.json")[0]
    Path(run["scenario"]).rename(Path(run["scenario"]).with_suffix(".gone"))
    try:
        res = resume(session)
        assert res.exit_code == 2
        assert "the scenario this run was started with cannot be read" in res.output
    finally:
        Path(run["scenario"]).with_suffix(".gone").rename(run["scenario"])
    rewrite_document(session / "run.json", provider=3)
    res = resume(session)
    assert res.exit_code == 2 and "run.json is damaged: provider 3" in res.output


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("grants", {"base": {"exec": [1]}}),
        ("grants", {"agents": "not a list of pairs"}),
        ("shellLimits", {"maxWorkers": "many"}),
    ],
)
def test_damaged_grants_or_limits_in_run_json_are_refused_by_name_not_a_traceback(
    session: Path, field: str, value: object
) -> None:
    rewrite_document(session / "run.json", **{field: value})
    res = resume(session)
    assert res.exit_code == 2, res.output
    assert f"run.json is damaged: {field} is unreadable" in res.output


def test_resume_of_a_clean_crash_still_finishes(session: Path) -> None:
    res = resume(session)
    assert res.exit_code == 0, res.output
    assert check_session(SessionDir(session)).ok
    assert [r["kind"] for r in read_jsonl(session / "transcript.jsonl").records].count("Born") > 0


def test_a_duplicated_tool_result_line_in_an_event_log_violates_files_parse(
    finished: Path,
) -> None:
    """The shape a write retried after a partial one left (issue 34): one line twice."""
    assert check_session(SessionDir(finished)).get("files-parse").status == "held"
    log = next(p for p in sorted(finished.glob("agents/*/events.jsonl")) if b"tool_result" in
               p.read_bytes())  # fmt: skip
    lines = log.read_bytes().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if b'"tool_result"' in line)
    log.write_bytes(b"".join([*lines[: first + 1], lines[first], *lines[first + 1 :]]))
    details = check_session(SessionDir(finished)).get("files-parse").details
    call = json.loads(lines[first])["message"]["tool_call_id"]
    assert any(
        f"events.jsonl:{first + 2}: a duplicated line: tool call {call} answered again "
        f"(first at line {first + 1})" in d
        for d in details
    ), details
