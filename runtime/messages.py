"""The transcript vocabulary: what an agent and its model say to each other.

A transcript is a sequence of :data:`Message` values (user text, assistant replies, tool results)
plus an optional :class:`SystemPrompt`. Every value is a frozen dataclass with a JSON-dict form
(``to_dict`` / :func:`message_from_dict`) for the agent's event log.

The admission invariant (X2/X7, docs/architecture.md) lives here as :func:`admit_assistant`: every
assistant message is passed through it at the commit boundary, so every committed message
serialises to a request that a strict backend (OpenAI chat-completions, Anthropic Messages)
accepts:

- tool-call arguments that are not a JSON object become ``{}`` (X2) — a raw string is parsed first
  and kept only if it decodes to an object;
- an assistant message with no tool call and no non-whitespace text gets :data:`EMPTY_REPLY_STUB`
  as its text (X7) — Anthropic rejects empty and whitespace-only text blocks;
- a tool-call id that is empty, duplicated, or outside ``[A-Za-z0-9_-]`` (Anthropic's pattern) is
  replaced by a deterministic one derived from its position, so every result can be matched.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    """Why the model stopped. A ``StrEnum``: ``StopReason.TOOL_USE == "tool_use"``."""

    TOOL_USE = "tool_use"
    END_TURN = "end_turn"
    MAX_TOKENS = "max_tokens"


EMPTY_REPLY_STUB = "(empty reply)"
"""The text an otherwise-empty assistant message is committed with (X7)."""

_ID_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Usage:
    """Token usage one round-trip reported; ``used`` is what compaction compares to the window.

    ``input_tokens`` is the whole prompt, cached or not, in both dialects (Anthropic reports
    its three parts separately and they are summed; OpenAI's ``prompt_tokens`` already includes
    ``cached_tokens``). ``cache_write_tokens`` (Anthropic ``cache_creation_input_tokens``) and
    ``cache_read_tokens`` (Anthropic ``cache_read_input_tokens``, OpenAI
    ``prompt_tokens_details.cached_tokens``) are the parts of it priced differently, so
    ``cache_write_tokens + cache_read_tokens <= input_tokens`` always holds.
    """

    input_tokens: int
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    @property
    def used(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def uncached_input_tokens(self) -> int:
        """Prompt tokens billed at the plain input price."""
        return max(0, self.input_tokens - self.cache_write_tokens - self.cache_read_tokens)

    def to_dict(self) -> dict[str, int]:
        d = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.cache_write_tokens:  # absent when zero: older event logs read the same
            d["cache_write_tokens"] = self.cache_write_tokens
        if self.cache_read_tokens:
            d["cache_read_tokens"] = self.cache_read_tokens
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Usage:
        return cls(
            int(d.get("input_tokens", 0)),
            int(d.get("output_tokens", 0)),
            int(d.get("cache_write_tokens", 0)),
            int(d.get("cache_read_tokens", 0)),
        )


@dataclass(frozen=True)
class ToolCall:
    """One tool call. ``arguments`` is a dict once admitted; a raw ``str`` before admission."""

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        args = d.get("arguments", {})
        if not isinstance(args, dict | str):
            args = json.dumps(args)
        return cls(str(d.get("id", "")), str(d.get("name", "")), args)

    @property
    def script(self) -> str | None:
        """The ``script`` argument of a ``ral`` call, when the arguments hold a string one."""
        if isinstance(self.arguments, dict):
            value = self.arguments.get("script")
            return value if isinstance(value, str) else None
        return None

    @property
    def arguments_json(self) -> str:
        """The arguments as the JSON text a wire request carries."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class SystemPrompt:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"role": "system", "text": self.text}


@dataclass(frozen=True)
class UserMessage:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"role": "user", "text": self.text}


@dataclass(frozen=True)
class AssistantMessage:
    """One assistant reply: text, tool calls in order, why it stopped, what it cost."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: StopReason = StopReason.END_TURN
    usage: Usage | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop_reason, StopReason):
            object.__setattr__(self, "stop_reason", StopReason(self.stop_reason))
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    @property
    def is_empty(self) -> bool:
        """No tool call and no non-whitespace text: what X7 repairs."""
        return not self.tool_calls and not self.text.strip()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "role": "assistant",
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "stop_reason": self.stop_reason.value,
        }
        if self.usage is not None:
            d["usage"] = self.usage.to_dict()
        return d


@dataclass(frozen=True)
class ToolResult:
    """The result for the tool call ``tool_call_id``, already digested to what the model sees."""

    tool_call_id: str
    content: str
    is_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": "tool_result",
            "tool_call_id": self.tool_call_id,
            "content": self.content,
            "is_error": self.is_error,
        }


Message = UserMessage | AssistantMessage | ToolResult
"""What a transcript holds, in order."""

TranscriptItem = Message | SystemPrompt


def message_from_dict(d: Mapping[str, Any]) -> TranscriptItem:
    """Inverse of ``to_dict`` for every transcript value; raises ``ValueError`` on a bad role."""
    role = d.get("role")
    if role == "user":
        return UserMessage(str(d.get("text", "")))
    if role == "assistant":
        usage = d.get("usage")
        return AssistantMessage(
            text=str(d.get("text", "")),
            tool_calls=tuple(ToolCall.from_dict(c) for c in d.get("tool_calls", ())),
            stop_reason=StopReason(d.get("stop_reason", "end_turn")),
            usage=Usage.from_dict(usage) if isinstance(usage, Mapping) else None,
        )
    if role == "tool_result":
        return ToolResult(
            str(d.get("tool_call_id", "")), str(d.get("content", "")), bool(d.get("is_error"))
        )
    if role == "system":
        return SystemPrompt(str(d.get("text", "")))
    raise ValueError(f"unknown transcript role {role!r}")


def _object_or_empty(arguments: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        decoded = json.loads(arguments)
    except (ValueError, TypeError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _is_object_text(raw: str) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, TypeError):
        return False


def _derived_id(index: int, call: ToolCall) -> str:
    key = f"{index}:{call.id}:{call.name}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(key).hexdigest()[:12]
    return f"call_{index}_{digest}"


def admission_repairs(msg: AssistantMessage) -> tuple[str, ...]:
    """What :func:`admit_assistant` would change, as short labels (for forensic records)."""
    repairs: list[str] = []
    seen: set[str] = set()
    for i, call in enumerate(msg.tool_calls):
        if not isinstance(call.arguments, dict) and not _is_object_text(call.arguments):
            repairs.append(f"X2: tool call {i} arguments not an object -> {{}}")
        if not _ID_OK.match(call.id) or call.id in seen:
            repairs.append(f"tool call {i} id {call.id!r} replaced")
        seen.add(call.id)
        if lone_surrogate(_object_or_empty(call.arguments)) or lone_surrogate(call.name):
            repairs.append(f"tool call {i} lone surrogate -> U+FFFD, not run")
    if lone_surrogate(msg.text):
        repairs.append("text lone surrogate -> U+FFFD")
    if msg.is_empty:
        repairs.append("X7: empty assistant message -> stub text")
    return tuple(repairs)


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate (``U+D800``) in a string, or in any key or string inside a
    JSON-shaped value; ``None`` when all of it is valid Unicode. A JSON ``"\\ud800"`` escape
    decodes to one, and it is not a character: no UTF-8 file, pipe or frame can carry it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"U+{ord(value[e.start]):04X}"
        return None
    if isinstance(value, dict):
        items: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return None
    for item in items:
        found = lone_surrogate(item)
        if found is not None:
            return found
    return None


def _valid_unicode(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD (a surrogate pair split into two
    code points is joined back into its character)."""
    if isinstance(value, str):
        if lone_surrogate(value) is None:
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_unicode(v) for v in value]
    return value


def admit_assistant(msg: AssistantMessage) -> AssistantMessage:
    """Enforce the transcript-admission invariant (X2, X7, ids, valid Unicode); idempotent.

    The result always has dict arguments, unique well-formed ids, and either a tool call or
    non-whitespace text. A lone surrogate in its text or arguments is committed as U+FFFD, so
    the event log, the transcript and the shell's frames can carry the message (the agent
    answers such a call with an error instead of running it: :func:`admit_with_report`). Stop
    reason and usage are kept: the driver still needs to know that a reply was truncated even
    after its text was stubbed.
    """
    return admit_with_report(msg)[0]


def admit_with_report(msg: AssistantMessage) -> tuple[AssistantMessage, dict[str, str]]:
    """:func:`admit_assistant`, and the admitted ids of the calls whose arguments held a lone
    surrogate, each with the first one found (``U+D800``): such a call must not run, since
    what it asked for is not the text that was committed."""
    calls: list[ToolCall] = []
    seen: set[str] = set()
    unencodable: dict[str, str] = {}
    kept = True  # every call as it came: the message itself is admitted (no copy)
    for i, call in enumerate(msg.tool_calls):
        call_id = call.id
        if not _ID_OK.match(call_id) or call_id in seen:
            call_id = _derived_id(i, call)
        seen.add(call_id)
        arguments = _object_or_empty(call.arguments)
        found = lone_surrogate(arguments) or lone_surrogate(call.name)
        if found is not None:
            unencodable[call_id] = found
            calls.append(ToolCall(call_id, _valid_unicode(call.name), _valid_unicode(arguments)))
            kept = False
        elif call_id is call.id and arguments is call.arguments:
            calls.append(call)  # valid Unicode throughout: _valid_unicode would copy it as is
        else:
            calls.append(ToolCall(call_id, call.name, arguments))
            kept = False
    text = _valid_unicode(msg.text)
    if not calls and not text.strip():
        text = EMPTY_REPLY_STUB
    if kept and text is msg.text:
        return msg, unencodable
    return replace(msg, text=text, tool_calls=tuple(calls)), unencodable
