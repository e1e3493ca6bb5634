"""The pure half of the chat view: transcript entries from the event log and the bus."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from exarch_actors.cli.tui.model import (
    Append,
    Change,
    LogTail,
    Reset,
    TabItem,
    Transcript,
    Update,
    preview,
)
from exarch_actors.cli.tui.widgets import render_entry
from exarch_actors.runtime.events import Died, Io, Notice
from exarch_actors.runtime.state.durable import append_jsonl


def _assistant(text: str, *calls: tuple[str, str]) -> dict[str, object]:
    return {
        "kind": "assistant",
        "message": {
            "role": "assistant",
            "text": text,
            "tool_calls": [
                {"id": cid, "name": "ral", "arguments": {"script": s}} for cid, s in calls
            ],
        },
    }


def _result(cid: str, content: str) -> dict[str, object]:
    return {"kind": "tool_result", "message": {"tool_call_id": cid, "content": content}}


def _shown(changes: list[Change]) -> dict[str, TabItem]:
    shown: dict[str, TabItem] = {}
    for ch in changes:
        if isinstance(ch, Reset):
            shown.clear()
        elif isinstance(ch, Append | Update):
            shown[ch.entry.key] = ch.entry
    return shown


@given(io_first=st.booleans())
def test_a_ral_result_is_shown_exactly_once_whether_the_io_event_or_the_log_record_lands_first(
    io_first: bool,
) -> None:
    t = Transcript("trunk")
    changes = t.on_record(_assistant("looking", ("c1", "echo hi")))
    io = Io("trunk", call_id="c1", script="echo hi", value="[stdout]\nhi")
    record = _result("c1", "[stdout]\nhi")
    if io_first:
        first = t.on_event(io)
        second = t.on_record(record)
    else:
        first = t.on_record(record)
        second = t.on_event(io)
    assert [type(c) for c in first] == [Update]
    assert second == []
    changes += first + second
    call = _shown(changes)["c1"]
    assert call.kind == "ral" and call.text == "echo hi" and call.result == "[stdout]\nhi"


def test_a_call_is_shown_running_before_its_result_arrives() -> None:
    t = Transcript("trunk")
    (_text, call) = t.on_record(_assistant("waiting", ("c1", "sleep 30")))
    assert isinstance(call, Append) and call.entry.result is None
    assert "running" in call.entry.plain


def test_the_cleared_record_resets_the_tab_so_nothing_before_it_is_shown() -> None:
    t = Transcript("trunk")
    changes = t.on_record({"kind": "user", "source": "user", "text": "alpha"})
    changes += t.on_record(_assistant("alpha noted", ("c1", "let a = 1")))
    changes += t.on_record({"kind": "cleared", "archived": "events.1.jsonl"})
    changes += t.on_event(Notice("trunk", notice="Cleared", text="context cleared"))
    shown = _shown(changes)
    assert [e.kind for e in shown.values()] == ["cleared"]
    assert not any("alpha" in e.plain for e in shown.values())


def test_a_branch_shows_the_context_it_imported_before_its_birth_as_its_parents() -> None:
    t = Transcript("b", inherited_before="2026-01-01T00:00:01.000Z", inherited_from="trunk")
    old = t.on_record({"kind": "user", "text": "old", "at": "2026-01-01T00:00:00.998Z"})
    said = t.on_record({**_assistant("trunk said"), "at": "2026-01-01T00:00:00.999Z"})
    new = t.on_record({"kind": "user", "text": "new", "at": "2026-01-01T00:00:01.500Z"})
    shown = [c.entry for c in old + said + new if isinstance(c, Append)]
    assert [(e.kind, e.text, e.inherited) for e in shown] == [
        ("separator", "context inherited from trunk", False),
        ("user", "old", True),
        ("assistant", "trunk said", True),
        ("separator", "b branched from trunk", False),
        ("user", "new", False),
    ]
    assert shown[2].speaker == "trunk"


def test_died_adds_an_ended_entry_naming_outcome_and_cause() -> None:
    (ch,) = Transcript("helper").on_event(Died("helper", outcome="cancelled", cause="quit"))
    assert isinstance(ch, Append) and ch.entry.kind == "ended"
    assert ch.entry.text == "helper ended: cancelled (quit)"


def test_preview_keeps_short_results_whole_and_says_how_many_lines_it_left_out() -> None:
    assert preview("a\nb\n") == "a\nb"
    long = "\n".join(str(i) for i in range(30))
    shown = preview(long, lines=12).split("\n")
    assert shown[:12] == [str(i) for i in range(12)] and shown[12].startswith("… 18 more lines")


def test_log_tail_reads_only_complete_lines_and_follows_the_clear_rotation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    tail = LogTail(path)
    assert tail.read() == []  # no file yet
    append_jsonl(path, {"kind": "user", "text": "one"})
    with open(path, "ab") as f:
        f.write(b'{"kind": "user", "te')  # a record still being written
    assert [r["text"] for r in tail.read()] == ["one"]
    with open(path, "ab") as f:
        f.write(b'xt": "two"}\n')
    # /clear: the generation is archived by rename and a fresh file starts
    os.replace(path, tmp_path / "events.1.jsonl")
    append_jsonl(path, {"kind": "cleared", "archived": "events.1.jsonl"})
    assert [r["kind"] for r in tail.read()] == ["user", "cleared"]
    append_jsonl(path, {"kind": "user", "text": "three"})
    assert [r["text"] for r in tail.read()] == ["three"]
    tail.close()


def test_the_packaged_demo_plays_the_same_script_as_the_chat_example() -> None:
    from importlib import resources
    from pathlib import Path

    from exarch_actors.runtime.providers.scenario import load_scenario, parse_scenario

    root = Path(__file__).resolve().parents[2]
    demo = resources.files("exarch_actors.cli.tui").joinpath("demo.toml").read_text()
    packaged = parse_scenario(demo, source="demo.toml")
    example = load_scenario(root / "examples" / "chat.toml")
    assert packaged.agents == example.agents and packaged.patterns == example.patterns


def test_a_sub_agents_task_is_labelled_as_its_parents_and_a_humans_line_as_yours() -> None:
    sub = Transcript("helper", inherited_from="trunk", task_from="trunk")
    (task,) = sub.on_record({"kind": "user", "source": "user", "text": "count"})
    assert isinstance(task, Append)
    shown = render_entry(task.entry, "helper")
    assert isinstance(shown, Text) and shown.plain == "task from trunk › count"
    trunk = Transcript("trunk")
    (mine,) = trunk.on_record({"kind": "user", "source": "user", "text": "hello"})
    assert isinstance(mine, Append)
    shown = render_entry(mine.entry, "trunk")
    assert isinstance(shown, Text) and shown.plain == "you › hello"


def test_a_call_id_reused_by_a_later_reply_gets_its_own_entry_and_its_own_result() -> None:
    t = Transcript("trunk")
    changes = t.on_record(_assistant("first", ("call_0", "echo one")))
    changes += t.on_event(Io("trunk", call_id="call_0", value="one"))
    changes += t.on_record(_assistant("second", ("call_0", "echo two")))
    changes += t.on_record(_result("call_0", "two"))
    calls = [e for e in _shown(changes).values() if e.kind == "ral"]
    assert [(c.text, c.result) for c in calls] == [("echo one", "one"), ("echo two", "two")]
    assert len({c.key for c in calls}) == 2
