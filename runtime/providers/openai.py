"""Any OpenAI-compatible chat-completions endpoint (OpenAI, llama.cpp, vLLM, Ollama, ...).

Streaming request (``stream: true`` with ``stream_options.include_usage``), tool calls assembled
from ``delta.tool_calls`` fragments by their ``index``, usage from whichever chunk carries it.
``base_url`` is the API root that ``/chat/completions`` is appended to (``http://host:8080/v1``
for llama.cpp, ``http://host:8000/v1`` for vLLM, ``http://host:11434/v1`` for Ollama). A stream
is complete at ``data: [DONE]``, or at EOF once a ``finish_reason`` has been seen (some local
servers omit ``[DONE]``); EOF before either is a cut stream and is retried.

Stop reasons: ``tool_calls`` → tool_use, ``length`` → max_tokens, anything else → end_turn —
except that a reply carrying tool calls is tool_use whatever the server said, since local servers
often report ``stop`` for tool calls.

What local servers do differently, and what this module makes of it (each reproduced by a
loopback server in tests/providers/test_local_dialects.py):

- **A tool call without an id** (llama.cpp builds of May 2025 put it in ``function.id``; other
  servers send none): ``function.id`` is taken, else a fresh ``call_<24 hex>`` id — unique, so
  calls of different replies never share one (the chat view and the log key calls by id).
- **No ``index``** (Ollama until late 2024): a delta with an id not seen yet starts a new call, a
  delta with a known id continues it, one with neither continues the latest call.
- **The name repeated** on every delta (llama.cpp, May 2025) or sent as ``""`` after the first
  (LM Studio): the first non-empty name stands.
- **Arguments in one piece, or as an object** (Ollama sends the whole call in one chunk): one
  fragment is a whole argument string; an object is serialised.
- **Cached prompt tokens** (``usage.prompt_tokens_details.cached_tokens``, OpenAI and vLLM
  with prefix caching): counted as :attr:`Usage.cache_read_tokens`, part of ``prompt_tokens``.
- **No usage** (a server without ``stream_options``): ``usage`` is ``None`` and compaction
  estimates the tokens in use from the history's size.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import (
    AssistantMessage,
    StopReason,
    SystemPrompt,
    ToolCall,
    ToolResult,
    TranscriptItem,
    Usage,
    UserMessage,
)
from exarch_actors.runtime.providers.base import (
    MalformedReply,
    RateLimited,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    TransportError,
    effective_system,
)
from exarch_actors.runtime.providers.endpoints import OPENAI_BASE_URL
from exarch_actors.runtime.providers.http import (
    HttpStreamingProvider,
    Retryable,
    StreamIncomplete,
    decode_arguments,
)

TOOL_ERROR_PREFIX = "error: "
"""Chat-completions has no error flag on a tool message; the content says it instead."""


def render_openai_messages(
    transcript: Sequence[TranscriptItem], system: str | None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    sys_text = effective_system(transcript, system)
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    for m in transcript:
        if isinstance(m, SystemPrompt):
            continue
        if isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.text})
        elif isinstance(m, ToolResult):
            content = (TOOL_ERROR_PREFIX + m.content) if m.is_error else m.content
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": content})
        elif isinstance(m, AssistantMessage):
            msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [_render_call(c) for c in m.tool_calls]
            elif not m.text:
                msg["content"] = ""
            out.append(msg)
    return out


def _render_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def render_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


class _Call:
    __slots__ = ("args", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.args: list[str] = []


class OpenAIProvider(HttpStreamingProvider):
    name = "openai"
    default_base_url = OPENAI_BASE_URL
    api_key_env = "OPENAI_API_KEY"
    base_url_env = "OPENAI_BASE_URL"

    def __init__(self, *, include_usage: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.include_usage = include_usage

    def build_request(
        self,
        transcript: Sequence[TranscriptItem],
        system: str | None,
        tools: Sequence[ToolSpec],
        tool_choice_none: bool,
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        # Everything fixed comes first and the messages last, so two round trips' bodies are
        # byte-identical up to the new messages: servers with automatic prefix caching
        # (OpenAI, vLLM, llama.cpp's prompt cache) hit. Nothing per-request (no timestamp, no
        # id) is sent, and the tool list keeps its order.
        body: dict[str, Any] = {"model": self.model, "stream": True}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if tools:
            body["tools"] = render_openai_tools(tools)
            if tool_choice_none:
                body["tool_choice"] = "none"
        body["messages"] = render_openai_messages(transcript, system)
        headers: dict[str, str] = {}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return f"{self.endpoint.path}/chat/completions", headers, body

    def read_stream(
        self,
        events: Iterator[tuple[str, str]],
        emit: Callable[[StreamEvent], None],
        scope: CancelScope,
    ) -> AssistantMessage:
        text: list[str] = []
        calls: dict[int, _Call] = {}
        finish: str | None = None
        usage: Usage | None = None
        done = False
        for _event, data in events:
            scope.check()
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise MalformedReply(f"not JSON in the event stream: {data[:200]!r}") from None
            if not isinstance(chunk, dict):
                raise MalformedReply(f"an event-stream chunk is not an object: {data[:200]!r}")
            if "error" in chunk:
                raise _stream_error(chunk["error"])
            u = chunk.get("usage")
            if isinstance(u, dict):
                usage = _usage(u)
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                piece = delta.get("content")
                if isinstance(piece, str) and piece:
                    text.append(piece)
                    emit(TextDelta(piece))
                latest = max(calls, default=0)  # where this chunk's unindexed deltas resume
                for j, tc in enumerate(delta.get("tool_calls") or ()):
                    self._tool_delta(tc, latest + j, calls, emit)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and finish is None:
            raise StreamIncomplete("no finish_reason and no [DONE]")
        tool_calls = tuple(
            ToolCall(c.id or fresh_call_id(), c.name, decode_arguments("".join(c.args)))
            for _, c in sorted(calls.items())
        )
        if finish == "length":
            stop = StopReason.MAX_TOKENS
        elif tool_calls:
            stop = StopReason.TOOL_USE
        else:
            stop = StopReason.END_TURN
        return AssistantMessage("".join(text), tool_calls, stop, usage)

    @staticmethod
    def _tool_delta(
        tc: Any, position: int, calls: dict[int, _Call], emit: Callable[[StreamEvent], None]
    ) -> None:
        if not isinstance(tc, dict):
            raise MalformedReply(f"a tool-call delta is not an object: {tc!r}")
        fn = tc.get("function") or {}
        if not isinstance(fn, dict):
            raise MalformedReply(f"a tool-call delta's function is not an object: {tc!r}")
        new_id = _text(tc.get("id")) or _text(fn.get("id"))
        index = tc.get("index")
        if not isinstance(index, int):
            index = _unindexed(new_id, calls, position)
        call = calls.setdefault(index, _Call())
        new_name = _text(fn.get("name"))
        frag = fn.get("arguments")
        if isinstance(frag, dict):  # some local servers send the object, not its text
            frag = json.dumps(frag)
        frag = frag if isinstance(frag, str) else ""
        if new_id:
            call.id = new_id
        if new_name and not call.name:
            call.name = new_name
        call.args.append(frag)
        emit(ToolCallDelta(index, new_id, new_name, frag))


def _usage(u: dict[str, Any]) -> Usage:
    """A usage object; ``prompt_tokens_details.cached_tokens`` (sent by OpenAI and some
    compatible servers) is the cached part of ``prompt_tokens``. There is no cache-write figure
    in this dialect: writing the cache is not billed."""
    prompt = _count(u.get("prompt_tokens"))
    details = u.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(prompt, _count(u.get("completion_tokens")), 0, min(cached, prompt))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def fresh_call_id() -> str:
    """An id for a tool call its server sent without one: unique across replies and runs."""
    return f"call_{secrets.token_hex(12)}"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _unindexed(new_id: str | None, calls: dict[int, _Call], position: int) -> int:
    """The call a delta without an ``index`` belongs to: the one with its id, a new one for an
    id not seen yet; with neither, ``position`` (the latest call's index plus the delta's place
    in its chunk), so a continuation extends the latest call and a chunk's siblings stay apart."""
    if new_id is not None:
        for i, c in calls.items():
            if c.id == new_id:
                return i
        return max(calls, default=-1) + 1
    return position


def _stream_error(err: Any) -> Exception:
    """An ``{"error": ...}`` chunk mid-stream: retried when it says overload or rate limit."""
    detail = err if isinstance(err, dict) else {"message": str(err)}
    kind = str(detail.get("type") or detail.get("code") or "")
    message = f"stream error {kind or 'unknown'}: {detail.get('message', '')}"
    if "rate" in kind or "overload" in kind or "429" in kind:
        return Retryable(RateLimited(message))
    if "server" in kind or "500" in kind:
        return Retryable(TransportError(message))
    return MalformedReply(message)
