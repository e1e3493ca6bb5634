"""The embedded default provider: plays a scenario (docs/scenarios.md) exactly, with no network.

One :class:`ScenarioPlayback` holds the scenario and one cursor per agent name for the whole run;
:meth:`ScenarioPlayback.provider` hands out a :class:`ScriptedProvider` bound to a name. Rules:

- each ``complete`` consumes the agent's next message (``repeat`` already expanded in place);
  a message is consumed when its round-trip starts, so a cancelled or failing one is not replayed;
- an agent with nothing left gets an empty ``end_turn`` message;
- an exact name wins over a pattern; a pattern (``worker-*``) gives every matching agent its own
  copy, because cursors are per agent name, not per scenario entry;
- ``delay_ms`` waits on the cancel scope (a cancel ends the wait within one scheduler tick);
- ``error`` raises that :class:`~runtime.providers.base.ProviderError` after the delay;
- tool calls are named ``ral`` with arguments ``{"script": ...}`` and ids
  ``call_<agent>_<round>_<i>``, so a rerun produces byte-identical transcripts; ``ids = [...]``
  (a recording's) gives them the ids the model gave instead;
- ``calls = [{name, arguments, id}]`` (a recording's) plays any tool call as written: another
  tool's name, raw arguments (a string is passed on raw, as a network provider passes text that
  is not a JSON object), the recorded id;
- ``fn_arguments`` replaces every tool call's arguments with that raw value (one ``ral`` call is
  made if the message has no ``ral`` scripts);
- ``usage_tokens = N`` reports ``Usage(input_tokens=N)`` (``usage_output_tokens = M`` adds
  ``output_tokens=M``); with neither, usage is ``None``;
- ``error_message`` replaces the scripted error's text (a recording keeps the original's).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResult,
    TranscriptItem,
    Usage,
    UserMessage,
)
from exarch_actors.runtime.providers.base import (
    RAL_TOOL,
    MalformedReply,
    OnEvent,
    Provider,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    RequestRejected,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    TransportError,
    Truncated,
)
from exarch_actors.runtime.providers.scenario import Scenario, ScriptedMessage

_SUMMARY_CLIP = 200


class UnknownScript(ExarchError):
    """``/model NAME`` named no script of the scenario."""


class ScenarioPlayback:
    """The run-wide playback state of one scenario: a cursor per agent name. Thread-safe."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._lock = threading.Lock()
        self._scripts: dict[str, tuple[ScriptedMessage, ...]] = {}
        self._rounds: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled into an agent process (``actors/agent_process.py``): the scenario and the
        cursors as they stand; the copy plays on from there, its lock a new one."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def provider(self, agent_name: str) -> ScriptedProvider:
        return ScriptedProvider(self, agent_name)

    def take(self, agent_name: str) -> tuple[int, ScriptedMessage | None]:
        """Consume the agent's next message; return (round number, message or None)."""
        with self._lock:
            script = self._scripts.get(agent_name)
            if script is None:
                script = self._scripts[agent_name] = self.scenario.script_for(agent_name)
            n = self._rounds.get(agent_name, 0)
            self._rounds[agent_name] = n + 1
        return n, (script[n] if n < len(script) else None)

    def advance(self, agent_name: str, rounds: int) -> int:
        """``resume``: move ``agent_name``'s cursor to at least ``rounds`` (the messages its
        durable log shows were already played); never backwards. Returns the cursor."""
        with self._lock:
            n = max(self._rounds.get(agent_name, 0), rounds)
            self._rounds[agent_name] = n
            return n

    def cursor(self, agent_name: str) -> int:
        """Messages ``agent_name`` has consumed so far (its next round number)."""
        with self._lock:
            return self._rounds.get(agent_name, 0)

    def remaining(self, agent_name: str) -> int:
        """Scripted messages not yet consumed by ``agent_name``."""
        with self._lock:
            script = self._scripts.get(agent_name)
            if script is None:
                script = self.scenario.script_for(agent_name)
            return max(0, len(script) - self._rounds.get(agent_name, 0))


_CALL_ROUND = re.compile(r"_(\d+)_\d+$")
"""The round in a scripted call id (``call_<agent>_<round>_<i>``)."""


def played_rounds(events: Iterable[Mapping[str, Any]], errors: int = 0) -> int:
    """How many provider round-trips an agent already made, from its event-log records: every
    ``complete`` leaves an assistant event (a truncated reply too) or, ``errors``, a
    ``ProviderError`` on the bus; scripted call ids give a floor when a record was lost. A
    round cancelled mid-``delay_ms`` leaves no trace and is replayed (the one known gap). What
    ``resume`` and an agent process's restart move the agent's cursor to, so a rebuilt agent
    plays on from where it was instead of from its first round."""
    assistants = 0
    top = -1
    for r in events:
        if r.get("kind") != "assistant":
            continue
        assistants += 1
        message = r.get("message")
        for call in (message.get("tool_calls") if isinstance(message, dict) else None) or ():
            m = _CALL_ROUND.search(str(call.get("id", "")))
            if m:
                top = max(top, int(m.group(1)))
    return max(assistants + errors, top + 1)


def _id_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:32] or "agent"


class ScriptedProvider(Provider):
    """Plays ``agent_name``'s script from a shared :class:`ScenarioPlayback`."""

    name = "scripted"

    def __init__(self, playback: ScenarioPlayback, agent_name: str) -> None:
        self.playback = playback
        self.agent_name = agent_name
        self.model = Path(playback.scenario.source).stem or "scenario"
        self.window_tokens = playback.scenario.window_tokens
        self._prefix = f"call_{_id_safe(agent_name)}_"
        """What every call id of this provider starts with (a ``re.sub`` per round trip before)."""
        self._streamed: dict[int, tuple[ScriptedMessage, tuple[str, ...]]] = {}
        """Per scripted entry (by identity, the entry kept to check it): its calls' arguments as
        the JSON a stream delta carries. A repeated entry is one object played many times, and
        its ``json.dumps`` was ~4 % of an agent process's CPU per ral call."""

    def play_on_after(self, rounds: int) -> int:
        """A rebuilt agent (``resume``, an agent process's restart): its next round is at least
        ``rounds`` (:func:`played_rounds`), never an earlier one. Returns the cursor."""
        return self.playback.advance(self.agent_name, rounds)

    def for_agent(self, agent_name: str) -> ScriptedProvider:
        return self.playback.provider(agent_name)

    def with_model(self, model: str) -> ScriptedProvider:
        """``/model NAME``: play the scenario's ``[[agents.NAME]]`` script from now on.

        The scripted provider's "models" are the scenario's scripts: the swapped provider
        consumes the named script's messages (one cursor per script name, shared with an agent
        of that name) and its call ids carry that name, so a transcript shows which answered.
        Children forked afterwards still play their own names. A name with no script is
        refused (:class:`UnknownScript`) rather than silently playing empty replies."""
        if not self.playback.scenario.entries_for(model):
            raise UnknownScript(
                f"the scenario {self.playback.scenario.source} has no [[agents.{model}]] script "
                "to switch to"
            )
        swapped = self.playback.provider(model)
        swapped.model = model
        return swapped

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        cancel.check()
        n, entry = self.playback.take(self.agent_name)
        if entry is None:
            return AssistantMessage(text="", tool_calls=(), stop_reason=StopReason.END_TURN)
        if entry.delay_ms and cancel.wait(entry.delay_ms / 1000.0):
            raise Cancelled(cancel.reason or "cancelled")
        cancel.check()
        if entry.error is not None:
            raise _scripted_error(entry, self.agent_name)
        msg = self._message(n, entry)
        if on_event is not None:
            if msg.text:
                on_event(TextDelta(msg.text))
            streamed = self._streamed.get(id(entry))
            if streamed is None or streamed[0] is not entry:
                streamed = (entry, tuple(c.arguments_json for c in msg.tool_calls))
                self._streamed[id(entry)] = streamed
            for i, call in enumerate(msg.tool_calls):
                on_event(ToolCallDelta(i, call.id, call.name, streamed[1][i]))
        return msg

    def _message(self, n: int, entry: ScriptedMessage) -> AssistantMessage:
        prefix = f"{self._prefix}{n}"
        if entry.calls:
            calls = tuple(
                ToolCall(c.id if c.id is not None else f"{prefix}_{i}", c.name, c.arguments)
                for i, c in enumerate(entry.calls)
            )
        else:
            args: list[dict[str, Any] | str] = [{"script": s} for s in entry.ral]
            if entry.fn_arguments is not None:
                args = [entry.fn_arguments] * max(1, len(args))
            ids = entry.ids or tuple(f"{prefix}_{i}" for i in range(len(args)))
            calls = tuple(ToolCall(i, RAL_TOOL.name, a) for i, a in zip(ids, args))
        return AssistantMessage(
            text=entry.text, tool_calls=calls, stop_reason=entry.stop, usage=_usage(entry)
        )

    def summarize(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> str:
        """A deterministic summary: counts, the first request and the last assistant text."""
        cancel.check()
        users = [m for m in transcript if isinstance(m, UserMessage)]
        replies = [m for m in transcript if isinstance(m, AssistantMessage)]
        results = [m for m in transcript if isinstance(m, ToolResult)]
        calls = sum(len(m.tool_calls) for m in replies)
        parts = [
            f"Summary of {len(users) + len(replies) + len(results)} earlier messages "
            f"({len(users)} user, {len(replies)} assistant, {calls} tool calls, "
            f"{len(results)} tool results)."
        ]
        if users:
            parts.append(f"First request: {_clip(users[0].text)}")
        last_text = next((m.text for m in reversed(replies) if m.text.strip()), None)
        if last_text is not None:
            parts.append(f"Last reply: {_clip(last_text)}")
        return "\n".join(parts)

    def summary_reply(
        self,
        transcript: Sequence[TranscriptItem],
        cancel: CancelScope,
        *,
        system: str | None = None,
    ) -> AssistantMessage:
        """The deterministic summary asks no model: it costs nothing (known zero usage)."""
        return AssistantMessage(self.summarize(transcript, cancel, system=system), usage=Usage(0))


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SUMMARY_CLIP else text[: _SUMMARY_CLIP - 3] + "..."


def _usage(entry: ScriptedMessage) -> Usage | None:
    if entry.usage_tokens is None and entry.usage_output_tokens is None:
        return None
    return Usage(
        entry.usage_tokens or 0,
        entry.usage_output_tokens or 0,
        entry.usage_cache_write_tokens,
        entry.usage_cache_read_tokens,
    )


def _scripted_error(entry: ScriptedMessage, agent: str) -> ProviderError:
    what = entry.error_message or f"scripted {entry.error} for {agent} ({entry.where})"
    if entry.error == "rate_limit":
        return RateLimited(what, status=429)
    if entry.error == "transport":
        return TransportError(what)
    if entry.error == "timeout":
        return ProviderTimeout(what)
    if entry.error == "malformed":
        return MalformedReply(what)
    if entry.error == "rejected":
        return RequestRejected(what, status=400)
    partial = AssistantMessage(
        text=entry.text, stop_reason=StopReason.MAX_TOKENS, usage=_usage(entry)
    )
    return Truncated(partial, what)
