"""Every append starts on a fresh line: a torn tail left by a SIGKILL mid-append is set aside.

Before the fix, the first append after the crash was written straight onto the partial line, so
the file held one corrupt inner line for ever and ``files-parse`` could never pass again.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.actors.resume import resume_run
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import append_jsonl, read_jsonl, torn_path
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import copy_session

_records = st.lists(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(st.integers(), st.text(max_size=30), st.none(), st.booleans()),
        max_size=5,
    ),
    min_size=0,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(_records, st.dictionaries(st.text(min_size=1), st.text(), min_size=1), st.data())
def test_an_append_after_any_torn_prefix_of_a_record_starts_on_a_fresh_line_and_keeps_the_bytes(
    before: list[dict[str, object]], torn: dict[str, str], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.jsonl"
        for r in before:
            append_jsonl(path, r)
        line = json.dumps({**torn, "at": "x"}, ensure_ascii=False).encode()
        cut = data.draw(st.integers(1, len(line)), label="cut")
        fragment = line[:cut]
        offset = path.stat().st_size if path.exists() else 0
        with path.open("ab") as f:
            f.write(fragment)  # what a SIGKILL mid-append leaves
        append_jsonl(path, {"after": "crash"})
        read = read_jsonl(path)
        assert read.damage == []
        whole = cut == len(line)  # only the newline was lost: the record stands
        expected = [*before, *([json.loads(line)] if whole else []), {"after": "crash"}]
        assert [{k: v for k, v in r.items() if k != "at"} for r in read.records] == [
            {k: v for k, v in r.items() if k != "at"} for r in expected
        ]
        aside = read_jsonl(torn_path(path)).records
        if whole:
            assert aside == []
        else:
            assert [base64.b64decode(r["bytes"]) for r in aside] == [fragment]
            assert aside[0]["offset"] == offset


_TORN = {
    "agents/slow/commits.jsonl": b'{"kind": "Commit", "agent": "slow", "epo',
    "transcript.jsonl": b'{"kind": "Io", "agent": "slow", "call_id": "call_slow_1',
    "spawn-journal.jsonl": b'{"kind": "execution-result", "seq": 99, "id": "sl',
    "agents/trunk/events.jsonl": b'{"kind": "assistant", "message": {"role": "assi',
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_TORN))
def test_resume_after_a_torn_tail_finishes_and_every_file_parses(
    crashed: Path, tmp_path: Path, name: str
) -> None:
    session = copy_session(crashed, tmp_path)
    with (session / name).open("ab") as f:
        f.write(_TORN[name])
    out = resume_run(SessionDir(session))
    assert out.outcome == "replied" and out.reply == "42"
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)
    files = report.get("files-parse")
    assert any(f"{name}.torn: 1 torn tail(s)" in n for n in files.notes), files.notes
    aside = read_jsonl(session / f"{name}.torn").records
    assert [base64.b64decode(r["bytes"]) for r in aside] == [_TORN[name]]
