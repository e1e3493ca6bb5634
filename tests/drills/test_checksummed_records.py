"""Every durable record carries a CRC32C (runtime/state/checksum.py): any single changed byte in
any line of a session file but a torn last one -- in every JSON-lines file the run writes and in
``run.json`` -- makes ``resume`` refuse (exit 2) naming the file and line, and ``check`` report
it; a torn last line is still healed. The sessions are real: one run SIGKILLed mid-flight (the
``crashed`` fixture: its files the run's own writers wrote).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.checksum import (
    ChecksumMismatch,
    open_document,
    open_line,
    seal_line,
)
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_read import DamagedSession, ResumeRefused, read_session
from tests.drills.conftest import copy_session, exarch_cli


def _jsonl_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.jsonl"))


def _line_start(raw: bytes, index: int) -> int:
    start = 0
    for _ in range(index):
        start = raw.index(b"\n", start) + 1
    return start


def _flip(path: Path, index: int, offset: int, value: int) -> int:
    """Set byte ``offset`` of line ``index`` (0-based, its newline included) of ``path`` to
    ``value``; returns the 1-based line."""
    raw = bytearray(path.read_bytes())
    at = _line_start(bytes(raw), index) + offset
    assert raw[at] != value
    raw[at] = value
    path.write_bytes(bytes(raw))
    return index + 1


def _slow_events(crashed: Path, tmp_path: Path) -> tuple[Path, Path, list[bytes]]:
    """A copy of the crashed session, its ``slow`` agent's event log and that log's lines."""
    root = copy_session(crashed, tmp_path)
    path = root / "agents" / "slow" / "events.jsonl"
    return root, path, path.read_bytes().splitlines(keepends=True)


def _refused_at(root: Path, rel: str, lines: set[int]) -> None:
    """``resume`` (and the reader under it) refuse naming ``rel`` at one of ``lines``; ``check``
    names it as damage too."""
    res = exarch_cli("resume", str(root))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert any(f"{rel}:{n}:" in res.output for n in lines), res.output
    with pytest.raises(DamagedSession):
        read_session(SessionDir(root))
    report = check_session(SessionDir(root), processes=False)
    details = report.get("files-parse").details
    assert any(f"{rel}:{n}" in d for d in details for n in lines), details


_SETTINGS = settings(
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.timeout(300)
@_SETTINGS
@given(data=st.data())
def test_any_single_byte_flip_in_any_line_but_the_last_is_refused_naming_file_and_line(
    crashed: Path, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = copy_session(crashed, Path(d))
        candidates = [
            rel
            for rel in _jsonl_files(root)
            if (root / rel).read_bytes().count(b"\n") >= 2  # a line before the last
        ]
        rel = data.draw(st.sampled_from(candidates), label="file")
        path = root / rel
        lines = path.read_bytes().splitlines(keepends=True)
        index = data.draw(st.integers(0, len(lines) - 2), label="line")
        offset = data.draw(st.integers(0, len(lines[index]) - 1), label="offset")
        old = lines[index][offset]
        value = data.draw(st.integers(0, 255).filter(lambda v: v != old), label="byte")
        line = _flip(path, index, offset, value)
        note(f"{rel}:{line} byte {offset} {old:#x} -> {value:#x}")
        # a byte turned into a newline splits the line: the damage may be named on its second half
        _refused_at(root, rel, {line, line + 1} if value == 0x0A else {line})


@pytest.mark.timeout(120)
@settings(_SETTINGS, max_examples=40)
@given(data=st.data())
def test_any_single_byte_flip_in_run_json_is_refused(crashed: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = copy_session(crashed, Path(d))
        path = root / "run.json"
        raw = bytearray(path.read_bytes()[:-1])  # the final newline is not the document's
        at = data.draw(st.integers(0, len(raw) - 1), label="offset")
        raw[at] = data.draw(st.integers(0, 255).filter(lambda v: v != raw[at]), label="byte")
        path.write_bytes(bytes(raw) + b"\n")
        with pytest.raises(ResumeRefused, match=r"run\.json"):
            read_session(SessionDir(root))
        res = exarch_cli("resume", str(root))
        assert res.exit_code == 2 and "run.json" in res.output and "Traceback" not in res.output


def test_the_audits_flip_of_assistant_to_assistan_dot_is_refused(
    crashed: Path, tmp_path: Path
) -> None:
    root, path, lines = _slow_events(crashed, tmp_path)
    i = next(i for i, raw in enumerate(lines[:-1]) if b'"kind": "assistant"' in raw)
    lines[i] = lines[i].replace(b'"kind": "assistant"', b'"kind": "assistan."', 1)
    path.write_bytes(b"".join(lines))
    _refused_at(root, "agents/slow/events.jsonl", {i + 1})
    assert "checksum mismatch" in exarch_cli("resume", str(root)).output


def test_the_audits_changed_tool_call_id_is_refused(crashed: Path, tmp_path: Path) -> None:
    root, path, lines = _slow_events(crashed, tmp_path)
    i = next(i for i, raw in enumerate(lines[:-1]) if b'"tool_call_id": "' in raw)
    at = lines[i].index(b'"tool_call_id": "') + len(b'"tool_call_id": "')
    changed = bytearray(lines[i])
    changed[at] = ord("Z") if changed[at] != ord("Z") else ord("Y")
    lines[i] = bytes(changed)
    path.write_bytes(b"".join(lines))
    _refused_at(root, "agents/slow/events.jsonl", {i + 1})


def test_a_torn_last_line_is_healed_and_the_run_resumes(crashed: Path, tmp_path: Path) -> None:
    root = copy_session(crashed, tmp_path)
    path = root / "transcript.jsonl"
    raw = path.read_bytes()
    last = raw[:-1].rindex(b"\n") + 1
    path.write_bytes(raw[: last + (len(raw) - last) // 2])  # half the last line, no newline
    report = check_session(SessionDir(root), processes=False)
    assert report.get("files-parse").status == "held"
    assert any("torn last line" in n for n in report.get("files-parse").notes)
    res = exarch_cli("resume", str(root))
    assert res.exit_code == 0, res.output
    assert (root / "transcript.jsonl.torn").exists(), "the fragment was set aside, bytes kept"
    assert not read_jsonl(root / "transcript.jsonl").damage


def test_every_line_of_a_new_session_carries_a_checksum(crashed: Path) -> None:
    files = _jsonl_files(crashed)
    assert {"transcript.jsonl", "spawn-journal.jsonl", "agents/slow/events.jsonl"} <= set(files)
    assert any(f.endswith("commits.jsonl") for f in files)
    for rel in files:
        for raw in (crashed / rel).read_bytes().splitlines():
            assert open_line(raw)[1], f"{rel}: a line without a checksum: {raw[:80]!r}"
    assert open_document((crashed / "run.json").read_bytes())[1]


def test_a_session_written_before_checksums_is_accepted_and_check_says_so(
    crashed: Path, tmp_path: Path
) -> None:
    root = copy_session(crashed, tmp_path)
    for rel in _jsonl_files(root):  # strip every checksum: the format before this change
        path = root / rel
        path.write_bytes(b"".join(open_line(r)[0] + b"\n" for r in path.read_bytes().splitlines()))
    run = root / "run.json"
    run.write_bytes(open_document(run.read_bytes())[0] + b"\n")
    read_session(SessionDir(root))  # accepted
    notes = check_session(SessionDir(root), processes=False).get("files-parse").notes
    assert any("predates checksums" in n and "run.json" in n for n in notes), notes
    res = exarch_cli("resume", str(root))
    assert res.exit_code == 0, res.output


def test_a_line_repaired_by_hand_without_its_checksum_reads_and_is_counted(
    crashed: Path, tmp_path: Path
) -> None:
    """What a refusal tells the user to do: repair the line and drop its ``crc`` member."""
    root, path, lines = _slow_events(crashed, tmp_path)
    lines[0] = open_line(lines[0].rstrip(b"\n"))[0] + b"\n"
    path.write_bytes(b"".join(lines))
    read = read_jsonl(path)
    assert not read.damage and read.bare == 1 and read.sealed == len(lines) - 1
    read_session(SessionDir(root))  # accepted
    notes = check_session(SessionDir(root), processes=False).get("files-parse").notes
    assert any(
        "without a checksum" in n and "agents/slow/events.jsonl (1 lines)" in n for n in notes
    )


def test_a_changed_checksum_digit_is_a_mismatch_and_a_changed_member_name_is_damage() -> None:
    line = seal_line(b'{"kind": "a"}').rstrip(b"\n")
    with pytest.raises(ChecksumMismatch, match="mismatch"):
        open_line(line[:-3] + (b"0" if line[-3:-2] != b"0" else b"1") + line[-2:])
    with pytest.raises(ChecksumMismatch, match="damaged checksum member"):
        open_line(line.replace(b'"crc"', b'"crd"'))
    assert json.loads(open_line(line)[0]) == {"kind": "a"}
