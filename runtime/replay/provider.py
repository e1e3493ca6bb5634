"""The recording provider: any provider, with every reply it returns handed to a recorder.

:class:`RecordingProvider` wraps the provider each agent is given (the trunk's from the run's
factory, a child's through :meth:`for_agent`, so a forked child is recorded under its own name
and the header comment names its parent). It sits between the agent and its provider, so the
agent loop needs no hook: what is recorded is exactly the reply the agent then admits.

Rules:

- a returned reply is recorded before it is returned (admission is deterministic and
  idempotent, so replaying the raw reply commits the same message);
- a :class:`~runtime.providers.base.ProviderError` is recorded as that failure (kind and text,
  a truncation with its partial reply) and re-raised: the replay fails the same round-trip;
- a cancelled round-trip records nothing (no reply was produced), like the scripted provider,
  which does not replay a cancelled message;
- ``summarize`` is not recorded: compaction in a replay uses the scripted provider's own
  deterministic summary, which changes no ral result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.messages import AssistantMessage, TranscriptItem
from exarch_actors.runtime.providers.base import (
    RAL_TOOL,
    OnEvent,
    Provider,
    ProviderError,
    ToolSpec,
    Truncated,
)
from exarch_actors.runtime.replay.recording import Recorder


class RecordSink(Protocol):
    """Where a :class:`RecordingProvider` hands what it records: the run's :class:`Recorder`,
    or, in an agent process, a stand-in that forwards to the control side's recorder."""

    def spawned(self, child: str, parent: str) -> None: ...

    def reply(self, agent: str, msg: AssistantMessage) -> None: ...

    def failure(self, agent: str, kind: str, message: str, partial: AssistantMessage) -> None: ...


def unrecorded(provider: Provider) -> Provider:
    """``provider`` without its recording wrapper (what crosses to another process: a
    recorder is a writer of this process's files)."""
    return provider.inner if isinstance(provider, RecordingProvider) else provider


class ModelSwitchUnsupported(ExarchError):
    """``/model`` on a provider that cannot switch models."""


class RecordingProvider(Provider):
    """``inner`` as the agent ``agent_name`` uses it, recording each reply into ``recorder``."""

    def __init__(self, inner: Provider, recorder: RecordSink, agent_name: str) -> None:
        self.inner = inner
        self.recorder = recorder
        self.agent_name = agent_name
        self.name = inner.name
        self.model = inner.model
        self.window_tokens = inner.window_tokens

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        try:
            msg = self.inner.complete(
                transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
            )
        except Truncated as t:
            self.recorder.failure(self.agent_name, t.kind, str(t), t.partial)
            raise
        except ProviderError as e:
            self.recorder.failure(self.agent_name, e.kind, str(e), AssistantMessage())
            raise
        self.recorder.reply(self.agent_name, msg)
        return msg

    def summarize(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> str:
        return self.inner.summarize(transcript, cancel, system=system)

    def summary_reply(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> AssistantMessage:
        return self.inner.summary_reply(transcript, cancel, system=system)

    def for_agent(self, agent_name: str) -> Provider:
        self.recorder.spawned(agent_name, self.agent_name)
        return RecordingProvider(self.inner.for_agent(agent_name), self.recorder, agent_name)

    def with_model(self, model: str) -> Provider:
        """``/model NAME``: the inner provider's switch, still recorded under this agent."""
        swap = getattr(self.inner, "with_model", None)
        if not callable(swap):
            raise ModelSwitchUnsupported(
                f"/model: the {self.inner.name} provider cannot switch models"
            )
        new = swap(model)
        assert isinstance(new, Provider)
        return RecordingProvider(new, self.recorder, self.agent_name)

    def describe(self) -> str:
        return self.inner.describe()


def recorded(factory: Callable[[str], Provider], recorder: Recorder) -> Callable[[str], Provider]:
    """A run's provider factory whose every provider records into ``recorder``."""
    return lambda name: RecordingProvider(factory(name), recorder, name)
