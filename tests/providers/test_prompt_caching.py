"""Prompt caching on the wire: Anthropic's cache breakpoints (where they sit, how they move as a
conversation grows, never on what compaction drops), cached tokens counted from both dialects,
and an OpenAI request prefix that stays byte-identical between round trips."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolResult,
    TranscriptItem,
    Usage,
    UserMessage,
)
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.anthropic import AnthropicProvider
from exarch_actors.runtime.providers.base import RAL_TOOL, SUMMARIZE_INSTRUCTION, ToolSpec
from exarch_actors.runtime.providers.openai import OpenAIProvider
from exarch_actors.runtime.providers.prompt_cache import (
    MAX_BREAKPOINTS,
    marked_blocks,
    place_breakpoints,
)
from tests.agent.conftest import exarch
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    anthropic_chunks,
    openai_chunks,
    sse,
)

EPHEMERAL = {"type": "ephemeral"}
SECOND_TOOL = ToolSpec("notes", "Keep a note.", {"type": "object", "properties": {}})


def anthropic(server: ProtocolServer) -> AnthropicProvider:
    p = make_provider("anthropic", model="claude-x", base_url=server.url, api_key="k")
    assert isinstance(p, AnthropicProvider)
    return p


def openai(server: ProtocolServer) -> OpenAIProvider:
    p = make_provider("openai", model="gpt-x", base_url=server.url + "/v1", api_key="k")
    assert isinstance(p, OpenAIProvider)
    return p


def call(n: int) -> ToolCall:
    return ToolCall(f"c{n}", "ral", {"script": f"echo {n}"})


def step(n: int) -> list[TranscriptItem]:
    """One round trip's growth: the assistant's call and its result."""
    return [AssistantMessage("", (call(n),), StopReason.TOOL_USE), ToolResult(f"c{n}", f"{n}")]


def markers(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every marked place of a request body: ("system", i), ("tool", name), ("block", pos)."""
    found: list[tuple[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        found += [("system", i) for i, b in enumerate(system) if "cache_control" in b]
    found += [("tool", t["name"]) for t in body.get("tools", []) if "cache_control" in t]
    found += [("block", i) for i in marked_blocks(body["messages"])]
    return found


def flat_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for turn in body["messages"] for b in turn["content"]]


# --- the rule ---------------------------------------------------------------------------------


@st.composite
def request_shapes(draw: st.DrawFn) -> tuple[Any, Any, list[dict[str, Any]], int, bool]:
    n_turns = draw(st.integers(0, 12))
    messages = []
    for i in range(n_turns):
        role = "user" if i % 2 == 0 else "assistant"
        blocks = [{"type": "text", "text": f"{i}.{j}"} for j in range(draw(st.integers(1, 5)))]
        messages.append({"role": role, "content": blocks})
    system = [{"type": "text", "text": "sys"}] if draw(st.booleans()) else None
    tools = [{"name": f"t{k}"} for k in range(draw(st.integers(0, 3)))] or None
    total = sum(len(t["content"]) for t in messages)
    droppable = draw(st.integers(0, max(0, min(3, total))))
    return system, tools, messages, droppable, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(request_shapes())
def test_breakpoints_never_exceed_four_and_never_sit_on_droppable_blocks(
    shape: tuple[Any, Any, list[dict[str, Any]], int, bool],
) -> None:
    system, tools, messages, droppable, conversation = shape
    placed = place_breakpoints(
        system, tools, messages, droppable_blocks=droppable, conversation=conversation
    )
    body = {"system": system, "tools": tools or [], "messages": messages}
    found = markers(body)
    assert placed == len(found) <= MAX_BREAKPOINTS
    total = len(flat_blocks(body))
    assert all(pos < total - droppable for kind, pos in found if kind == "block")
    if total - droppable > 0 and conversation:  # the latest stable block is always marked
        assert ("block", total - droppable - 1) in found
    if not conversation:
        assert not any(kind == "block" for kind, _ in found)
    assert bool(system) == (("system", 0) in found)
    assert bool(tools) == any(kind == "tool" for kind, _ in found)
    place_breakpoints(  # idempotent
        system, tools, messages, droppable_blocks=droppable, conversation=conversation
    )
    assert markers(body) == found


# --- on the wire ------------------------------------------------------------------------------


def test_anthropic_request_marks_system_prompt_last_tool_and_latest_turn(
    server: ProtocolServer,
) -> None:
    server.script(Exchange(chunks=anthropic_chunks("ok")))
    anthropic(server).complete(
        [UserMessage("count the files")],
        system="be brief",
        tools=(RAL_TOOL, SECOND_TOOL),
        cancel=CancelScope(),
    )
    body = server.requests[0].body
    assert body["system"] == [{"type": "text", "text": "be brief", "cache_control": EPHEMERAL}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == EPHEMERAL
    assert body["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
    assert len(markers(body)) == 3


def test_anthropic_breakpoint_moves_forward_as_the_conversation_grows(
    server: ProtocolServer,
) -> None:
    provider = anthropic(server)
    transcript: list[TranscriptItem] = [UserMessage("go")]
    for _ in range(4):
        server.script(Exchange(chunks=anthropic_chunks("ok")))
    for n in range(4):
        provider.complete(transcript, system="sys", cancel=CancelScope())
        transcript += step(n)
    bodies = [r.body for r in server.requests]
    latest = [len(flat_blocks(b)) - 1 for b in bodies]
    assert latest == [0, 2, 4, 6]  # each request marks its own last block
    for before, after in itertools.pairwise(bodies):
        # the previous request's tail is marked again, so this request reads what it wrote
        previous_tail = len(flat_blocks(before)) - 1
        assert [p for k, p in markers(after) if k == "block"] == [
            previous_tail,
            len(flat_blocks(after)) - 1,
        ]
        assert len(markers(after)) == MAX_BREAKPOINTS  # system, tool, two in the conversation


def test_a_summary_request_reads_the_cached_transcript_and_marks_no_instruction(
    server: ProtocolServer,
) -> None:
    server.script(Exchange(chunks=anthropic_chunks("summary")))
    transcript: list[TranscriptItem] = [UserMessage("go"), AssistantMessage("ok"), UserMessage("n")]
    anthropic(server).summarize(transcript, CancelScope(), system="sys")
    body = server.requests[0].body
    blocks = flat_blocks(body)
    assert blocks[-1]["text"] == SUMMARIZE_INSTRUCTION
    assert "cache_control" not in blocks[-1]
    assert blocks[-2]["cache_control"] == EPHEMERAL  # the transcript's own tail: a cache read


def test_a_summary_request_that_forbids_tools_marks_no_conversation_block(
    server: ProtocolServer,
) -> None:
    # tool_choice "none" invalidates the cached messages: a marker there would only write
    server.script(Exchange(chunks=anthropic_chunks("summary")))
    transcript: list[TranscriptItem] = [UserMessage("go"), *step(1), UserMessage("next")]
    anthropic(server).summarize(transcript, CancelScope(), system="sys")
    body = server.requests[0].body
    assert body["tool_choice"] == {"type": "none"}
    assert markers(body) == [("system", 0), ("tool", "ral")]


def anthropic_start(input_tokens: int, write: int, read: int) -> bytes:
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        "output_tokens": 1,
    }
    return sse({"type": "message_start", "message": {"usage": usage}}, "message_start")


def test_anthropic_cache_writes_and_reads_are_counted_apart(server: ProtocolServer) -> None:
    rest = anthropic_chunks("ok", usage=(0, 7))[1:]
    server.script(
        Exchange(chunks=[anthropic_start(20, 3000, 0), *rest]),
        Exchange(chunks=[anthropic_start(25, 40, 3000), *rest]),
    )
    provider = anthropic(server)
    first = provider.complete([UserMessage("go")], cancel=CancelScope())
    second = provider.complete([UserMessage("go"), *step(1)], cancel=CancelScope())
    assert first.usage == Usage(3020, 7, cache_write_tokens=3000, cache_read_tokens=0)
    assert second.usage == Usage(3065, 7, cache_write_tokens=40, cache_read_tokens=3000)
    assert second.usage.uncached_input_tokens == 25


def openai_usage_chunk(prompt: int, completion: int, cached: int | None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return sse({"id": "x", "choices": [], "usage": usage})


def test_openai_cached_tokens_are_read_from_prompt_tokens_details(server: ProtocolServer) -> None:
    head = openai_chunks("ok", usage=None, done=False)
    server.script(
        Exchange(chunks=[*head, openai_usage_chunk(2000, 9, 1792), sse("[DONE]")]),
        Exchange(chunks=[*head, openai_usage_chunk(2000, 9, None), sse("[DONE]")]),
    )
    provider = openai(server)
    cached = provider.complete([UserMessage("go")], cancel=CancelScope())
    plain = provider.complete([UserMessage("go")], cancel=CancelScope())
    assert cached.usage == Usage(2000, 9, cache_write_tokens=0, cache_read_tokens=1792)
    assert plain.usage == Usage(2000, 9)


def test_openai_request_bytes_share_their_prefix_up_to_the_new_messages(
    server: ProtocolServer,
) -> None:
    provider = openai(server)
    transcript: list[TranscriptItem] = [UserMessage("go")]
    server.script(Exchange(chunks=openai_chunks("ok")), Exchange(chunks=openai_chunks("ok")))
    provider.complete(transcript, system="sys", tools=(RAL_TOOL, SECOND_TOOL), cancel=CancelScope())
    transcript += step(1)
    provider.complete(transcript, system="sys", tools=(RAL_TOOL, SECOND_TOOL), cancel=CancelScope())
    first, second = (r.raw for r in server.requests)
    # the first body minus its closing "]}" is a prefix of the second: only messages were added
    assert first.endswith(b"]}")
    assert second.startswith(first[:-2])
    assert second[len(first) - 2 : len(first)] == b", "
    body = json.loads(first)
    assert list(body)[-1] == "messages"
    assert [t["function"]["name"] for t in body["tools"]] == ["ral", "notes"]


def test_a_real_run_marks_each_anthropic_request_and_moves_the_marker_forward(
    server: ProtocolServer, tmp_path: Path
) -> None:
    calls = [("toolu_1", "ral", '{"script": "let x = 41"}')]
    server.script(
        Exchange(chunks=anthropic_chunks("", calls)),
        Exchange(
            chunks=anthropic_chunks("", [("toolu_2", "ral", '{"script": "reply (add $x 1)"}')])
        ),
        Exchange(chunks=anthropic_chunks("", [("toolu_3", "ral", '{"script": "reply 42"}')])),
    )
    p = exarch(
        [
            "run",
            "--provider=anthropic",
            f"--base-url={server.url}",
            "--model=claude-x",
            "--api-key=k",
            f"--session-dir={tmp_path / 'session'}",
            "Reply with 42.",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42"
    bodies = [r.body for r in server.requests]
    assert len(bodies) == 3
    for body in bodies:
        assert body["system"][0]["cache_control"] == EPHEMERAL  # the agent's system prompt
        assert body["tools"][-1]["cache_control"] == EPHEMERAL
        assert len(markers(body)) <= MAX_BREAKPOINTS
    tails = [len(flat_blocks(b)) - 1 for b in bodies]
    assert tails == sorted(tails) and len(set(tails)) == 3  # the marker moves forward
    for before, after in itertools.pairwise(bodies):
        marked = [p for k, p in markers(after) if k == "block"]
        assert marked[-1] == len(flat_blocks(after)) - 1
        assert len(flat_blocks(before)) - 1 in marked  # reads what the previous one wrote
