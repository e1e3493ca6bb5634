"""A tool call that holds a lone surrogate (a JSON ``"\\ud800"`` escape decodes to one) is
answered with an error and never run; the agent goes on with its next call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import AssistantMessage, StopReason, ToolCall, TranscriptItem
from exarch_actors.runtime.providers.base import RAL_TOOL, OnEvent, Provider, ToolSpec
from tests.agent.conftest import Live


class SurrogateFirst(Provider):
    """Answers the first request with a ral call whose script holds U+D800, then delegates."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.window_tokens = inner.window_tokens
        self.calls = 0

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        self.calls += 1
        if self.calls == 1:
            call = ToolCall("bad", "ral", {"script": 'let s = "a\ud800"; echo done'})
            return AssistantMessage(tool_calls=(call,), stop_reason=StopReason.TOOL_USE)
        return self.inner.complete(
            transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
        )

    def summarize(
        self, transcript: Sequence[TranscriptItem], cancel: CancelScope, **kw: Any
    ) -> str:
        return self.inner.summarize(transcript, cancel, **kw)


def test_a_call_holding_a_lone_surrogate_is_answered_with_an_error_and_the_agent_goes_on(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["echo after", "echo $s"]

        [[agents.trunk]]
        ral = ["reply 7"]
        repeat = 2
        """,
        interactive=False,
        wrap=SurrogateFirst,
    )
    assert live.trunk.wait(30), "the trunk ended"
    assert live.trunk.outcome.value == "replied"
    results = [e["message"] for e in live.events() if e["kind"] == "tool_result"]
    assert results[0]["tool_call_id"] == "bad" and results[0]["is_error"]
    assert "U+D800, a lone surrogate" in results[0]["content"]
    assert "after" in results[1]["content"], "the next call ran"
    assert "undefined variable s" in results[2]["content"], "nothing of the refused call ran"
    io = [r for r in live.kinds("Io") if r.get("call_id") == "bad"]
    assert len(io) == 1 and "U+D800" in io[0]["value"], "the transcript records the same text"
