"""The Anthropic Messages API, streaming.

Events: ``message_start`` (input usage), ``content_block_start`` (text or tool_use with id and
name), ``content_block_delta`` (``text_delta``, ``input_json_delta``), ``content_block_stop``,
``message_delta`` (stop_reason, output usage), ``message_stop``; ``ping`` is ignored and
``error`` mid-stream is retried when it reports overload or rate limiting. Headers:
``x-api-key`` and ``anthropic-version``. 429 and 529 (overloaded) are rate limits, 5xx transport
failures; both are retried.

Rendering keeps the API's shape rules: user and tool-result items merge into one user turn (tool
results first), consecutive assistant items merge, the first turn is a user turn, text blocks are
never empty or whitespace-only, and ``tool_use.input`` is always an object.

Prompt caching: every request carries ``cache_control`` breakpoints on its system prompt, its
tools and the latest stable prefix of the conversation (``runtime/providers/prompt_cache.py``
says where and why); ``prompt_cache=False`` sends none. Usage reports the cache writes and reads
apart (``cache_creation_input_tokens``, ``cache_read_input_tokens``): they are priced apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import (
    EMPTY_REPLY_STUB,
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
    SUMMARIZE_INSTRUCTION,
    MalformedReply,
    ProviderError,
    RateLimited,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    TransportError,
    effective_system,
)
from exarch_actors.runtime.providers.endpoints import ANTHROPIC_BASE_URL
from exarch_actors.runtime.providers.http import (
    HttpStreamingProvider,
    Retryable,
    StreamIncomplete,
    decode_arguments,
    object_arguments,
)
from exarch_actors.runtime.providers.prompt_cache import place_breakpoints

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 8192
"""The API requires max_tokens; 8192 fits every current model's output limit."""

EMPTY_USER_STUB = "(empty message)"
CONTINUATION_STUB = "(conversation continues)"


def render_anthropic_messages(transcript: Sequence[TranscriptItem]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for m in transcript:
        if isinstance(m, SystemPrompt):
            continue
        if isinstance(m, UserMessage):
            add("user", [{"type": "text", "text": m.text if m.text.strip() else EMPTY_USER_STUB}])
        elif isinstance(m, ToolResult):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content,
            }
            if m.is_error:
                block["is_error"] = True
            add("user", [block])
        elif isinstance(m, AssistantMessage):
            blocks: list[dict[str, Any]] = []
            if m.text.strip():
                blocks.append({"type": "text", "text": m.text})
            blocks.extend(_render_call(c) for c in m.tool_calls)
            if not blocks:
                blocks.append({"type": "text", "text": EMPTY_REPLY_STUB})
            add("assistant", blocks)
    if turns and turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": CONTINUATION_STUB}]})
    for turn in turns:  # tool results must open their user turn
        if turn["role"] == "user":
            turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    return turns


def _render_call(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": object_arguments(call)}


def render_anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


class _Block:
    __slots__ = ("id", "json", "kind", "name", "ordinal")

    def __init__(self, kind: str, ordinal: int, id: str = "", name: str = "") -> None:
        self.kind = kind
        self.ordinal = ordinal
        self.id = id
        self.name = name
        self.json: list[str] = []


class AnthropicProvider(HttpStreamingProvider):
    name = "anthropic"
    default_base_url = ANTHROPIC_BASE_URL
    api_key_env = "ANTHROPIC_API_KEY"
    base_url_env = "ANTHROPIC_BASE_URL"

    def __init__(self, *, prompt_cache: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prompt_cache = prompt_cache

    def classify_status(self, status: int) -> tuple[type[ProviderError], bool]:
        if status == 529:
            return RateLimited, True
        return super().classify_status(status)

    def build_request(
        self,
        transcript: Sequence[TranscriptItem],
        system: str | None,
        tools: Sequence[ToolSpec],
        tool_choice_none: bool,
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        messages = render_anthropic_messages(transcript)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens or DEFAULT_MAX_TOKENS,
            "stream": True,
        }
        system_blocks: list[dict[str, Any]] | None = None
        tool_list: list[dict[str, Any]] | None = None
        if tools:
            tool_list = render_anthropic_tools(tools)
            body["tools"] = tool_list
            if tool_choice_none:
                body["tool_choice"] = {"type": "none"}
        sys_text = effective_system(transcript, system)
        if sys_text:
            system_blocks = [{"type": "text", "text": sys_text}]
            body["system"] = system_blocks if self.prompt_cache else sys_text
        body["messages"] = messages
        if self.prompt_cache:
            place_breakpoints(
                system_blocks,
                tool_list,
                messages,
                droppable_blocks=_droppable(transcript),
                conversation=not tool_choice_none,  # a changed tool_choice reads no messages
            )
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        root = self.endpoint.path
        path = f"{root}/messages" if root.endswith("/v1") else f"{root}/v1/messages"
        return path, headers, body

    def read_stream(
        self,
        events: Iterator[tuple[str, str]],
        emit: Callable[[StreamEvent], None],
        scope: CancelScope,
    ) -> AssistantMessage:
        text: list[str] = []
        blocks: dict[int, _Block] = {}
        calls: list[_Block] = []
        stop: str | None = None
        input_tokens = output_tokens = cache_write = cache_read = 0
        saw_usage = False
        started = finished = False
        for event, data in events:
            scope.check()
            try:
                payload = json.loads(data) if data else {}
            except ValueError:
                raise MalformedReply(f"not JSON in the event stream: {data[:200]!r}") from None
            if not isinstance(payload, dict):
                raise MalformedReply(f"an event is not an object: {data[:200]!r}")
            kind = payload.get("type") or event
            if kind == "ping":
                continue
            if kind == "error":
                raise _stream_error(payload.get("error"))
            if kind == "message_start":
                started = True
                usage = (payload.get("message") or {}).get("usage") or {}
                if usage:
                    saw_usage = True
                    cache_write = int(usage.get("cache_creation_input_tokens") or 0)
                    cache_read = int(usage.get("cache_read_input_tokens") or 0)
                    input_tokens = int(usage.get("input_tokens") or 0) + cache_write + cache_read
                    output_tokens = int(usage.get("output_tokens") or 0)
            elif kind == "content_block_start":
                index = _index(payload)
                cb = payload.get("content_block") or {}
                block = _Block(str(cb.get("type", "")), len(calls))
                blocks[index] = block
                if block.kind == "text" and cb.get("text"):
                    text.append(cb["text"])
                    emit(TextDelta(cb["text"]))
                elif block.kind == "tool_use":
                    block.id = str(cb.get("id", ""))
                    block.name = str(cb.get("name", ""))
                    calls.append(block)
                    emit(ToolCallDelta(block.ordinal, block.id, block.name, ""))
                    if cb.get("input"):
                        block.json.append(json.dumps(cb["input"]))
            elif kind == "content_block_delta":
                block = blocks.get(_index(payload)) or _Block("", len(calls))
                delta = payload.get("delta") or {}
                dtype = delta.get("type")
                if dtype == "text_delta":
                    piece = str(delta.get("text", ""))
                    text.append(piece)
                    emit(TextDelta(piece))
                elif dtype == "input_json_delta" and block.kind == "tool_use":
                    piece = str(delta.get("partial_json", ""))
                    block.json.append(piece)
                    emit(ToolCallDelta(block.ordinal, None, None, piece))
            elif kind == "message_delta":
                stop = (payload.get("delta") or {}).get("stop_reason") or stop
                usage = payload.get("usage") or {}
                if "output_tokens" in usage:
                    saw_usage = True
                    output_tokens = int(usage.get("output_tokens") or 0)
            elif kind == "message_stop":
                finished = True
                break
        if not finished and stop is None:
            raise StreamIncomplete("no message_stop" if started else "no message_start")
        tool_calls = tuple(
            ToolCall(b.id or f"toolu_{b.ordinal}", b.name, decode_arguments("".join(b.json)))
            for b in calls
        )
        if stop == "max_tokens":
            reason = StopReason.MAX_TOKENS
        elif tool_calls:
            reason = StopReason.TOOL_USE
        else:
            reason = StopReason.END_TURN
        usage_out = None
        if saw_usage:
            usage_out = Usage(input_tokens, output_tokens, cache_write, cache_read)
        return AssistantMessage("".join(text), tool_calls, reason, usage_out)


def _droppable(transcript: Sequence[TranscriptItem]) -> int:
    """Trailing blocks compaction drops: a summary request's instruction (its answer replaces
    the history, so the instruction is never sent again)."""
    last = transcript[-1] if transcript else None
    return 1 if isinstance(last, UserMessage) and last.text == SUMMARIZE_INSTRUCTION else 0


def _index(payload: dict[str, Any]) -> int:
    index = payload.get("index", 0)
    if not isinstance(index, int):
        raise MalformedReply(f"content block index is not an integer: {index!r}")
    return index


def _stream_error(err: Any) -> Exception:
    detail = err if isinstance(err, dict) else {"message": str(err)}
    kind = str(detail.get("type", ""))
    message = f"stream error {kind or 'unknown'}: {detail.get('message', '')}"
    if kind in ("overloaded_error", "rate_limit_error"):
        return Retryable(RateLimited(message, status=529 if kind == "overloaded_error" else 429))
    if kind in ("api_error", "timeout_error"):
        return Retryable(TransportError(message))
    return MalformedReply(message)
