"""The one provider interface: stream one assistant message, cancellable mid-stream.

A :class:`Provider` turns a transcript into one :class:`~runtime.messages.AssistantMessage`.
While the reply streams it hands every text delta and tool-call delta to ``on_event`` so the
in-flight turn can be persisted; a :class:`StreamReset` says that the deltas seen so far are void
because the round-trip is being retried from scratch.

Invariants every implementation keeps:

- ``complete`` raises :class:`~runtime.cancel.Cancelled` promptly (well inside 200 ms) once its
  scope is cancelled, closing whatever connection it holds; nothing it streamed is committed.
- Failures are typed :class:`ProviderError` subclasses, raised only after the provider's own
  retries are exhausted. A network provider never raises :class:`Truncated` itself: it returns the
  message with ``stop_reason == MAX_TOKENS`` and the driver decides (X6, docs/architecture.md: with
  calls the driver dispatches them instead). A scripted ``error = "truncated"`` raises it directly.
- The returned message is *not yet admitted*: tool-call arguments may be a raw string. The driver
  passes it through :func:`runtime.messages.admit_assistant` at the commit boundary.

:class:`ProviderHandle` is the per-agent, hot-swappable slot (seed: "The provider is per-agent and
hot-swappable"): the driver reads ``current()`` once at the top of a turn, so a swap lands next
turn and never mid-turn. A forked child gets ``ProviderHandle(parent.current().for_agent(child))``:
network providers return themselves, the scripted provider returns the child's own script.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.messages import (
    AssistantMessage,
    SystemPrompt,
    TranscriptItem,
    UserMessage,
)

# ---------------------------------------------------------------------------------------------
# Tools


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: name, description, JSON-schema of its (object) arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


RAL_TOOL = ToolSpec(
    name="ral",
    description=(
        "Run one ral script in this agent's persistent shell and return its value, stdout and "
        "stderr. Bindings made with `let` persist across calls."
    ),
    parameters={
        "type": "object",
        "properties": {"script": {"type": "string", "description": "The ral script to run."}},
        "required": ["script"],
    },
)
"""The agent's only tool: ``ral``, with one argument, ``script``."""


# ---------------------------------------------------------------------------------------------
# Stream events


@dataclass(frozen=True)
class TextDelta:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": "text_delta", "text": self.text}


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of tool call ``index``; ``id``/``name`` arrive once, ``arguments`` in pieces."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": "tool_call_delta",
            "index": self.index,
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
        }


@dataclass(frozen=True)
class StreamReset:
    """Every delta since the round-trip began is void: the provider retries from scratch."""

    attempt: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": "stream_reset", "attempt": self.attempt, "reason": self.reason}


@dataclass(frozen=True)
class RateWait:
    """The request waits in the fleet's traffic governor for the rate limit (``since``: the wall
    clock when it began); ``waited`` is set when the wait is over: it was let through."""

    since: float
    waited: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"event": "rate_wait", "since": self.since, "waited": self.waited}


StreamEvent = TextDelta | ToolCallDelta | StreamReset | RateWait
OnEvent = Callable[[StreamEvent], None]


# ---------------------------------------------------------------------------------------------
# Errors


class ProviderError(ExarchError):
    """A round-trip failed after the provider's own retries. ``kind`` names it for event logs."""

    kind = "provider"

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status = status


class RateLimited(ProviderError):
    """HTTP 429 (or 529 overloaded) on every attempt."""

    kind = "rate_limit"

    def __init__(
        self,
        message: str,
        *,
        attempts: int = 1,
        status: int | None = 429,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, attempts=attempts, status=status)
        self.retry_after = retry_after


class TransportError(ProviderError):
    """The connection failed, was refused, reset, or cut mid-stream; or a 5xx on every attempt."""

    kind = "transport"


class ProviderTimeout(ProviderError):
    """Connecting, or waiting for the next byte of the reply, took longer than the timeout."""

    kind = "timeout"


class MalformedReply(ProviderError):
    """The endpoint answered with something that is not the protocol (bad JSON, bad events)."""

    kind = "malformed"


class RequestRejected(ProviderError):
    """A non-retryable HTTP 4xx (bad key, unknown model, invalid request); ``body`` says why."""

    kind = "rejected"

    def __init__(self, message: str, *, status: int, body: str = "", attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts, status=status)
        self.body = body


class Truncated(ProviderError):
    """The reply stopped at max tokens with no tool call; ``partial`` is what was produced.

    The driver appends ``partial`` (admitted) before surfacing this, so a continue nudge keeps the
    work as context (a ``MAX_TOKENS`` stop with no tool call becomes this error).
    """

    kind = "truncated"

    def __init__(self, partial: AssistantMessage, message: str = "") -> None:
        super().__init__(message or "reply truncated at max tokens with no tool call")
        self.partial = partial


def truncation_of(msg: AssistantMessage) -> Truncated | None:
    """The :class:`Truncated` error a max-tokens reply with no tool call amounts to, else None."""
    if msg.stop_reason == "max_tokens" and not msg.tool_calls:
        return Truncated(msg)
    return None


# ---------------------------------------------------------------------------------------------
# The interface

SUMMARIZE_INSTRUCTION = (
    "Summarise the conversation so far for your own future use: the task, what has been done, "
    "the facts and results established (names, numbers, paths), the shell bindings that matter, "
    "and what remains to do. Be complete but terse; this summary replaces the history."
)


def effective_system(transcript: Sequence[TranscriptItem], system: str | None) -> str | None:
    """``system`` if given, else the last :class:`SystemPrompt` in the transcript."""
    if system is not None:
        return system
    found: str | None = None
    for item in transcript:
        if isinstance(item, SystemPrompt):
            found = item.text
    return found


class Provider(ABC):
    """Streams one assistant message per call. Thread-safe for sequential use by one agent."""

    name: str = "provider"
    model: str = ""
    window_tokens: int | None = None

    @abstractmethod
    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        """One round-trip. Raises ``Cancelled`` or a :class:`ProviderError`."""

    def summarize(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> str:
        """A summary of ``transcript`` that can replace it (compaction). Default: ask the model."""
        reply = self.complete(
            [*transcript, UserMessage(SUMMARIZE_INSTRUCTION)],
            system=system,
            tools=(),
            cancel=cancel,
        )
        return reply.text

    def summary_reply(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> AssistantMessage:
        """:meth:`summarize` as a message whose ``usage`` says what the summary cost (counted
        like any round trip: compaction is not free). Default: the text with unknown usage;
        a provider that knows better (a network round trip, a scripted summary that costs
        nothing) says so."""
        return AssistantMessage(self.summarize(transcript, cancel, system=system))

    def for_agent(self, agent_name: str) -> Provider:
        """The provider a child named ``agent_name`` starts with (fork seeds its handle)."""
        return self

    def describe(self) -> str:
        return f"{self.name}:{self.model}" if self.model else self.name


class ProviderHandle:
    """The per-agent hot-swappable provider slot."""

    __slots__ = ("_lock", "_provider")

    def __init__(self, provider: Provider) -> None:
        self._lock = threading.Lock()
        self._provider = provider

    def current(self) -> Provider:
        with self._lock:
            return self._provider

    def swap(self, provider: Provider) -> Provider:
        """Install ``provider`` for the next turn; return the one it replaced."""
        with self._lock:
            previous, self._provider = self._provider, provider
            return previous
