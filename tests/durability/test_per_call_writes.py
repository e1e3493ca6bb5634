"""The shortcuts of the per-call write path (runtime/state/durable.py, durability.py,
eventlog.py): each gives exactly what the long way gave -- a record's stamp, its line and the
size an event log counts, the writer a path routes to -- and stops when its directory is
unbound."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.messages import AssistantMessage, StopReason, ToolCall, ToolResult, Usage
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.checksum import open_line
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import now_iso, read_jsonl, stamped_line
from exarch_actors.runtime.state.eventlog import AgentLog

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_records = st.dictionaries(st.text().filter(lambda k: k != "at"), _json, max_size=5).map(
    lambda d: {"kind": "user", **d}
)


def test_a_stamp_reads_as_the_utc_millisecond_clock_it_was_taken_between() -> None:
    for _ in range(200):
        before = dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None)
        stamp = now_iso()
        after = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        assert STAMP.match(stamp), stamp
        taken = dt.datetime.fromisoformat(stamp[:-1])
        assert before <= taken <= after


@given(_records)
def test_a_stamped_line_is_the_record_plus_its_stamp_and_counts_the_records_own_json(
    record: dict[str, object],
) -> None:
    line, size = stamped_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    covered, sealed = open_line(line.rstrip(b"\n"))
    assert sealed, "the line carries its checksum"
    parsed = json.loads(covered)
    assert STAMP.match(parsed.pop("at"))
    assert parsed == record and list(parsed) == list(record)  # same keys, same order
    assert size == len(json.dumps(record, ensure_ascii=False).encode()) + 1


def test_a_records_own_stamp_is_replaced_by_a_fresh_one_not_written_twice() -> None:
    line, size = stamped_line({"kind": "user", "at": "1999-01-01T00:00:00.000Z", "text": "x"})
    assert line.count(b'"at"') == 1
    parsed = json.loads(line)
    assert parsed["at"] != "1999-01-01T00:00:00.000Z" and STAMP.match(parsed["at"])
    assert size == len(json.dumps({"kind": "user", "text": "x"}).encode()) + 1


def test_an_event_logs_mirror_counts_what_a_reload_of_its_file_counts(tmp_path: Path) -> None:
    log = AgentLog(tmp_path / "events.jsonl")
    log.append_user("héllo \u2603 " * 20)
    log.append_note("a note", model_visible=True)
    loaded = AgentLog.load(tmp_path / "events.jsonl")[0]
    assert [e.size for e in loaded.events] == [e.size for e in log.events]
    assert [e.data for e in loaded.events] == [e.data for e in log.events]
    assert loaded.history_bytes == log.history_bytes


def test_a_path_routes_to_one_writer_however_it_is_given_and_to_none_once_unbound(
    tmp_path: Path,
) -> None:
    files = durability.bind(tmp_path, Durability.PROCESS)
    path = tmp_path / "agents" / "a" / "events.jsonl"
    try:
        writer = durability.writer_for(path)
        assert writer is not None
        assert durability.writer_for(path) is writer
        assert durability.writer_for(str(path)) is writer
        assert durability.writer_for(Path(str(path))) is writer
        durability.append(path, b'{"kind": "x"}\n')
    finally:
        durability.unbind(files)
    assert durability.writer_for(path) is None
    assert durability.writer_for(str(path)) is None
    durability.append(path, b'{"kind": "y"}\n')  # one-shot now: still written, in order
    assert [r["kind"] for r in read_jsonl(path).records] == ["x", "y"]


def test_a_live_logs_transcript_is_what_a_reload_of_its_file_renders(tmp_path: Path) -> None:
    log = AgentLog(tmp_path / "events.jsonl")
    log.append_user("go")
    for i in range(3):
        msg = AssistantMessage(
            text=f"step {i}",
            tool_calls=(ToolCall(f"c{i}", "ral", {"script": f"let v = {i}", "n": [i, {"x": 1}]}),),
            stop_reason=StopReason.TOOL_USE,
            usage=Usage(10 + i, 2, 0, 3),
        )
        log.append_assistant(msg)
        log.append_tool_result(ToolResult(f"c{i}", f"value {i}", is_error=i == 1))
    loaded = AgentLog.load(tmp_path / "events.jsonl")[0]
    assert log.render_transcript() == loaded.render_transcript()
