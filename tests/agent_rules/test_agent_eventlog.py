"""The agent event log (runtime.state.eventlog): durable appends, protocol state, compaction, clear,
resume and fork — against real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exarch_actors.runtime.fleet.compaction import SUMMARY_PREAMBLE
from exarch_actors.runtime.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from exarch_actors.runtime.ral.codec import encode_text
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.eventlog import (
    AgentLog,
    CompactionRefused,
    ProtocolError,
    ProtocolState,
    UnadmittedMessage,
    reply_fields,
    reply_of,
)


def call(i: str, script: str = "echo hi") -> ToolCall:
    return ToolCall(i, "ral", {"script": script})


def turn(log: AgentLog, n: int, payload: str = "x") -> None:
    """One user message, one tool round-trip, one closing assistant message."""
    log.append_user(f"task {n} {payload}")
    log.append_assistant(AssistantMessage("", (call(f"c{n}"),), StopReason.TOOL_USE))
    log.append_tool_result(ToolResult(f"c{n}", f"[value]\n{n}"))
    log.append_assistant(AssistantMessage(f"done {n}", usage=Usage(100 + n, 5)))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "agents" / "trunk" / "events.jsonl"


def test_every_append_is_on_disk_and_in_the_mirror(path: Path) -> None:
    log = AgentLog(path)
    turn(log, 1)
    recs = read_jsonl(path).records
    assert [r["kind"] for r in recs] == ["user", "assistant", "tool_result", "assistant"]
    assert log.event_count == 4
    assert log.history_bytes == sum(e.size for e in log.events) > 0
    assert log.used_tokens == 106


def test_a_user_message_while_tool_results_are_pending_is_refused_and_nothing_written(
    path: Path,
) -> None:
    log = AgentLog(path)
    log.append_user("go")
    log.append_assistant(AssistantMessage("", (call("a"), call("b")), StopReason.TOOL_USE))
    assert log.state is ProtocolState.AWAITING_TOOL_RESULTS
    before = path.read_bytes()
    for attempt in (
        lambda: log.append_user("more"),
        lambda: log.append_nudge("continue", "go on"),
        lambda: log.append_steering("steer"),
        lambda: log.append_assistant(AssistantMessage("again")),
    ):
        with pytest.raises(ProtocolError) as ei:
            attempt()
        assert ei.value.pending == ("a", "b")
    assert path.read_bytes() == before
    log.append_tool_result(ToolResult("b", "2"))
    log.append_tool_result(ToolResult("a", "1"))
    assert log.state is ProtocolState.READY_FOR_USER
    log.append_user("more")


def test_a_result_for_an_unrequested_id_is_refused(path: Path) -> None:
    log = AgentLog(path)
    log.append_assistant(AssistantMessage("", (call("a"),), StopReason.TOOL_USE))
    with pytest.raises(ProtocolError):
        log.append_tool_result(ToolResult("zzz", "?"))


def test_an_unadmitted_assistant_message_is_refused(path: Path) -> None:
    log = AgentLog(path)
    with pytest.raises(UnadmittedMessage):
        log.append_assistant(AssistantMessage("", (ToolCall("a", "ral", "not json"),)))
    assert not path.exists()


def test_settle_pending_answers_every_stranded_call_so_the_next_user_message_is_admissible(
    path: Path,
) -> None:
    log = AgentLog(path)
    log.append_assistant(AssistantMessage("", (call("a"), call("b")), StopReason.TOOL_USE))
    log.append_tool_result(ToolResult("a", "1"))
    settled = log.settle_pending()
    assert [e.data["message"]["tool_call_id"] for e in settled] == ["b"]
    assert settled[0].data["message"]["is_error"] is True
    log.append_user("next")


def test_render_transcript_gives_provider_messages_and_merges_adjacent_user_texts(
    path: Path,
) -> None:
    log = AgentLog(path)
    log.append_user("hello")
    log.append_assistant(AssistantMessage("hi"))
    log.append_nudge("must_reply", "reply please")
    log.append_nudge("pinned_reminder", "pinned: t")
    log.append_note("disk warning", model_visible=False)
    msgs = log.render_transcript()
    assert msgs == [
        UserMessage("hello"),
        AssistantMessage("hi"),
        UserMessage("reply please\n\npinned: t"),
    ]


def test_compaction_is_refused_with_results_pending_and_drops_nothing(path: Path) -> None:
    log = AgentLog(path)
    turn(log, 1)
    log.append_user("again")
    log.append_assistant(AssistantMessage("", (call("p"),), StopReason.TOOL_USE))
    n, size, disk = log.event_count, log.history_bytes, path.read_bytes()
    assert not log.can_compact()
    with pytest.raises(CompactionRefused):
        log.apply_compaction("summary")
    assert (log.event_count, log.history_bytes, path.read_bytes()) == (n, size, disk)


def test_compaction_records_the_breadcrumb_then_drops_the_prefix_and_never_rewrites_the_file(
    path: Path,
) -> None:
    log = AgentLog(path)
    for i in range(5):
        turn(log, i, payload="p" * 2000)
    before_disk = path.read_bytes()
    before_bytes = log.history_bytes
    kept_from = 12  # the user message of turn 3
    log.apply_compaction("the story so far", keep_from=kept_from)
    after_disk = path.read_bytes()
    assert after_disk.startswith(before_disk)  # append-only: the old bytes are untouched
    last = json.loads(after_disk.splitlines()[-1])
    assert last["kind"] == "compacted" and last["dropped"] == kept_from
    assert log.event_count == 1 + (20 - kept_from)
    assert log.history_bytes == sum(e.size for e in log.events) < before_bytes
    msgs = log.render_transcript()
    assert isinstance(msgs[0], UserMessage)
    assert msgs[0].text.startswith(SUMMARY_PREAMBLE + "the story so far")
    assert "task 3" in msgs[0].text  # the summary merges with the suffix's first user message
    assert log.used_tokens is None  # a stale usage cannot make compaction due again at once


def test_compaction_drops_the_prefix_objects_from_memory(path: Path) -> None:
    import gc
    import weakref

    log = AgentLog(path)
    turn(log, 1)
    ref = weakref.ref(log._events[0])
    log.append_user("next")
    log.apply_compaction("s", keep_from=4)
    gc.collect()
    assert ref() is None


def test_default_compaction_keeps_a_recent_suffix_that_starts_at_a_user_message(
    path: Path,
) -> None:
    log = AgentLog(path)
    for i in range(3):
        turn(log, i)
    log.apply_compaction("s")
    assert log.events[0].kind == "compacted"
    assert log.events[1].kind == "user"
    assert log.event_count < 12


def test_load_rebuilds_the_same_mirror_honouring_compaction(path: Path) -> None:
    log = AgentLog(path)
    for i in range(4):
        turn(log, i)
    log.apply_compaction("first", keep_from=8)
    turn(log, 9)
    log.apply_compaction("second", keep_from=5)
    log.append_user("after")
    loaded, report = AgentLog.load(path)
    assert report.damage == [] and not report.torn
    assert [e.data for e in loaded.events] == [e.data for e in log.events]
    assert loaded.history_bytes == log.history_bytes
    assert loaded.render_transcript() == log.render_transcript()


def test_load_tolerates_and_reports_a_torn_tail(path: Path) -> None:
    log = AgentLog(path)
    turn(log, 1)
    with path.open("ab") as f:
        f.write(b'{"kind": "user", "text": "half')
    loaded, report = AgentLog.load(path)
    assert report.torn
    assert loaded.event_count == 4
    loaded.append_user("continues fine")


def test_load_of_a_log_that_ended_mid_dispatch_is_awaiting_results(path: Path) -> None:
    log = AgentLog(path)
    log.append_user("go")
    log.append_assistant(AssistantMessage("", (call("a"),), StopReason.TOOL_USE))
    loaded, _ = AgentLog.load(path)
    assert loaded.pending_tool_calls == ("a",)
    loaded.settle_pending()
    loaded.append_user("resumed")


def test_clear_archives_the_generation_and_nothing_before_it_returns(path: Path) -> None:
    log = AgentLog(path)
    turn(log, 1, payload="SECRET")
    log.append_assistant(AssistantMessage("", (call("z"),), StopReason.TOOL_USE))
    archive = log.restart()
    assert archive is not None and archive.name == "events.1.jsonl"
    assert b"SECRET" in archive.read_bytes()
    assert b"SECRET" not in path.read_bytes()
    assert log.event_count == 0 and log.history_bytes == 0
    assert log.state is ProtocolState.READY_FOR_USER
    log.append_user("fresh")
    loaded, _ = AgentLog.load(path)
    assert loaded.render_transcript() == [UserMessage("fresh")]
    assert log.restart() is not None and (path.parent / "events.2.jsonl").exists()


def test_fork_context_drops_a_pending_unanswered_tool_call_frame(
    path: Path, tmp_path: Path
) -> None:
    parent = AgentLog(path)
    turn(parent, 1)
    parent.append_user("delegate")
    parent.append_assistant(
        AssistantMessage("", (call("s1", "agent kid 'x'"), call("s2")), StopReason.TOOL_USE)
    )
    parent.append_tool_result(ToolResult("s1", "receipt"))
    ctx = parent.fork_context()
    assert [e.kind for e in ctx] == ["user", "assistant", "tool_result", "assistant", "user"]
    child = AgentLog(tmp_path / "agents" / "kid" / "events.jsonl")
    child.import_context(ctx)
    child.append_user("launch prompt")
    assert child.state is ProtocolState.READY_FOR_USER
    assert child.render_transcript()[-1] == UserMessage("delegate\n\nlaunch prompt")


def test_fork_of_a_compacted_log_carries_the_summary(path: Path, tmp_path: Path) -> None:
    parent = AgentLog(path)
    for i in range(3):
        turn(parent, i)
    parent.apply_compaction("sum", keep_from=8)
    child = AgentLog(tmp_path / "kid.jsonl")
    child.import_context(parent.fork_context())
    assert child.render_transcript() == parent.render_transcript()
    reloaded, _ = AgentLog.load(tmp_path / "kid.jsonl")
    assert reloaded.render_transcript() == parent.render_transcript()


def _reply_batch(log: AgentLog, cid: str, value: str) -> None:
    log.append_assistant(AssistantMessage("", (call(cid, f"reply {value}"),), StopReason.TOOL_USE))
    log.append_tool_result(ToolResult(cid, "[value]\nunit"), reply=value)


def test_a_logged_reply_is_the_last_batchs_and_a_later_assistant_message_withdraws_it(
    path: Path,
) -> None:
    log = AgentLog(path)
    log.append_user("task")
    assert log.logged_reply() is None
    _reply_batch(log, "c1", "42")
    assert log.logged_reply() == "42"
    assert AgentLog.load(path)[0].logged_reply() == "42"  # read back from the file
    log.append_assistant(AssistantMessage("going on"))
    assert log.logged_reply() is None


def test_a_logged_reply_comes_back_with_the_type_the_agent_gave_it(path: Path) -> None:
    """A rebuilt child replies with its value, not its text: ``16``, not ``"16"`` (a resumed
    fan-in once summed the text and failed: ``add: expected a number, got string "16"``)."""
    value = {"n": 16, "parts": [1.5, "x", True]}
    log = AgentLog(path)
    log.append_user("task")
    log.append_assistant(AssistantMessage("", (call("c1", "reply $v"),), StopReason.TOOL_USE))
    text, encoded = reply_fields(value)
    log.append_tool_result(ToolResult("c1", "[value]\nunit"), reply=text, value=encoded)
    assert log.logged_reply() == value
    assert AgentLog.load(path)[0].logged_reply() == value  # read back from the file


def test_a_logged_reply_whose_value_is_damaged_or_absent_is_its_rendered_text(
    path: Path,
) -> None:
    log = AgentLog(path)
    log.append_user("task")
    log.append_assistant(AssistantMessage("", (call("c1", "reply 16"),), StopReason.TOOL_USE))
    log.append_tool_result(ToolResult("c1", "[value]\nunit"), reply="16", value="not*base64")
    assert log.logged_reply() == "16"
    assert reply_of({"reply": "16"}) == "16"  # a record written before replyValue existed
    assert reply_of({"reply": "16", "replyValue": encode_text(16)}) == 16
    assert reply_of({}) is None


def test_a_trunks_reply_counts_only_after_its_self_verify_nudge_in_the_same_turn(
    path: Path,
) -> None:
    log = AgentLog(path)
    log.append_user("task")
    _reply_batch(log, "c1", "41")  # the first reply: turned back, provisional
    assert log.logged_reply(final_after="self_verify") is None
    log.append_nudge("self_verify", "Before your reply becomes final, verify it.")
    _reply_batch(log, "c2", "42")
    assert log.logged_reply(final_after="self_verify") == "42"
    log.append_user("[message from agent kid]\nlate")  # a new turn: its own verification
    _reply_batch(log, "c3", "43")
    assert log.logged_reply(final_after="self_verify") is None
    assert log.logged_reply() == "43"
