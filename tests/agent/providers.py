"""Small Provider subclasses the agent tests wrap around the scripted provider.

They are real providers (the agent cannot tell them from any other): they record what they
were sent, or act at a precise moment of a turn, then delegate to the scripted provider.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import AssistantMessage, TranscriptItem
from exarch_actors.runtime.providers.base import RAL_TOOL, OnEvent, Provider, ToolSpec


class Recording(Provider):
    """Delegates to ``inner``; records every request and calls hooks before delegating."""

    def __init__(
        self,
        inner: Provider,
        *,
        label: str | None = None,
        before_complete: Callable[[Recording, int], None] | None = None,
        before_summarize: Callable[[Recording], None] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.window_tokens = inner.window_tokens
        self.label = label or inner.model
        self.before_complete = before_complete
        self.before_summarize = before_summarize
        self.requests: list[list[TranscriptItem]] = []
        self.systems: list[str | None] = []
        self.tools: list[tuple[ToolSpec, ...]] = []
        self.summaries: list[str] = []
        self._lock = threading.Lock()

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        with self._lock:
            self.requests.append(list(transcript))
            self.systems.append(system)
            self.tools.append(tuple(tools))
            n = len(self.requests)
        if self.before_complete is not None:
            self.before_complete(self, n)
        return self.inner.complete(
            transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
        )

    def summarize(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> str:
        if self.before_summarize is not None:
            self.before_summarize(self)
        summary = self.inner.summarize(transcript, cancel, system=system)
        self.summaries.append(summary)
        return summary

    def for_agent(self, agent_name: str) -> Provider:
        return Recording(self.inner.for_agent(agent_name))

    def with_model(self, model: str) -> Provider:
        swap: Any = getattr(self.inner, "with_model")  # noqa: B009 - scripted has it
        return Recording(swap(model), label=model)
