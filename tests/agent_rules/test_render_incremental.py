"""``AgentLog.render_transcript`` extends its last rendering as events are appended; whatever
happens to the mirror in between, it renders what a fresh render of the same events gives."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResult,
    UserMessage,
)
from exarch_actors.runtime.state.eventlog import AgentLog


def _render_from_scratch(log: AgentLog) -> list[Message]:
    out: list[Message] = []
    for ev in log.events:
        msg = ev.message()
        if msg is None:
            continue
        if isinstance(msg, UserMessage) and out and isinstance(out[-1], UserMessage):
            out[-1] = UserMessage(out[-1].text + "\n\n" + msg.text)
        else:
            out.append(msg)
    return out


STEPS = st.lists(
    st.sampled_from(
        [
            "user",
            "nudge",
            "note",
            "hidden-note",
            "tool-turn",
            "reply",
            "compact",
            "render",
            "restart",
            "reload",
            "pending-reload",
        ]
    ),
    max_size=25,
)


@settings(max_examples=80, deadline=None)
@given(STEPS)
def test_every_render_equals_a_render_from_scratch(steps: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "events.jsonl"
        log = AgentLog(path)
        for n, step in enumerate(steps):
            if step == "user":
                log.append_user(f"u{n}")
            elif step == "nudge":
                log.append_nudge("continue", f"n{n}")
            elif step == "note":
                log.append_note(f"visible {n}", model_visible=True)
            elif step == "hidden-note":
                log.append_note(f"hidden {n}")
            elif step == "tool-turn":
                log.append_assistant(
                    AssistantMessage(
                        "", (ToolCall(f"c{n}", "ral", {"script": "1"}),), StopReason.TOOL_USE
                    )
                )
                log.append_tool_result(ToolResult(f"c{n}", f"r{n}"))
            elif step == "reply":
                log.append_assistant(AssistantMessage(f"a{n}"))
            elif step == "compact":
                log.apply_compaction(f"summary {n}", keep_from=len(log.events) // 2)
            elif step == "restart":  # /clear
                log.restart()
            elif step == "reload":
                log, _report = AgentLog.load(path)
            elif step == "pending-reload":  # a crash mid-dispatch, then resume
                log.append_assistant(
                    AssistantMessage(
                        "", (ToolCall(f"p{n}", "ral", {"script": "1"}),), StopReason.TOOL_USE
                    )
                )
                log.render_transcript()
                log, _report = AgentLog.load(path)
                assert log.render_transcript() == _render_from_scratch(log)
                log.settle_pending()
            assert log.render_transcript() == _render_from_scratch(log)
