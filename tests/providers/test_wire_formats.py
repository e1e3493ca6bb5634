"""What each network provider puts on the wire and the protocol quirks it tolerates."""

from __future__ import annotations

import pytest

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
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.anthropic import AnthropicProvider
from exarch_actors.runtime.providers.base import ProviderHandle, RateLimited
from exarch_actors.runtime.providers.openai import OpenAIProvider
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    anthropic_chunks,
    openai_chunks,
    sse,
)

TRANSCRIPT: list[TranscriptItem] = [
    SystemPrompt("from the log"),
    UserMessage("count the files"),
    AssistantMessage("Looking.", (ToolCall("c1", "ral", {"script": "ls"}),), StopReason.TOOL_USE),
    ToolResult("c1", "no such dir", is_error=True),
    UserMessage("steer: use ."),
]


def openai(server: ProtocolServer, **kw: object) -> OpenAIProvider:
    p = make_provider("openai", model="gpt-x", base_url=server.url + "/v1", **kw)  # type: ignore[arg-type]
    assert isinstance(p, OpenAIProvider)
    return p


def anthropic(server: ProtocolServer, **kw: object) -> AnthropicProvider:
    p = make_provider("anthropic", model="claude-x", base_url=server.url, **kw)  # type: ignore[arg-type]
    assert isinstance(p, AnthropicProvider)
    return p


def test_openai_request_carries_roles_tool_calls_tool_results_usage_option_and_key(
    server: ProtocolServer,
) -> None:
    server.script(Exchange(chunks=openai_chunks("ok")))
    openai(server, api_key="sk-1", max_tokens=99).complete(TRANSCRIPT, cancel=CancelScope())
    req = server.requests[0]
    assert req.headers["authorization"] == "Bearer sk-1"
    body = req.body
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 99
    assert body["messages"] == [
        {"role": "system", "content": "from the log"},
        {"role": "user", "content": "count the files"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "ral", "arguments": '{"script": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "error: no such dir"},
        {"role": "user", "content": "steer: use ."},
    ]
    assert body["tools"][0]["function"]["name"] == "ral"


def test_openai_api_key_comes_from_the_environment_and_an_explicit_system_wins(
    server: ProtocolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    server.script(Exchange(chunks=openai_chunks("ok")))
    openai(server).complete(TRANSCRIPT, system="explicit", cancel=CancelScope())
    req = server.requests[0]
    assert req.headers["authorization"] == "Bearer sk-env"
    assert req.body["messages"][0] == {"role": "system", "content": "explicit"}


def test_a_chat_trunk_with_no_tools_sends_no_tools(server: ProtocolServer) -> None:
    server.script(Exchange(chunks=openai_chunks("hi")))
    openai(server).complete([UserMessage("hi")], tools=(), cancel=CancelScope())
    assert "tools" not in server.requests[0].body


def test_openai_stream_without_done_is_complete_once_a_finish_reason_arrived(
    server: ProtocolServer,
) -> None:
    server.script(Exchange(chunks=openai_chunks("fine", done=False, usage=None)))
    msg = openai(server, max_retries=0).complete([UserMessage("hi")], cancel=CancelScope())
    assert (msg.text, msg.usage) == ("fine", None)


def test_openai_tool_calls_reported_with_finish_stop_are_still_tool_use(
    server: ProtocolServer,
) -> None:
    chunks = openai_chunks("", [("c1", "ral", '{"script": "x"}')], finish="stop")
    server.script(Exchange(chunks=chunks))
    msg = openai(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.stop_reason is StopReason.TOOL_USE


def test_openai_error_chunk_reporting_overload_is_retried(server: ProtocolServer) -> None:
    err = sse({"error": {"type": "server_overloaded", "message": "busy"}})
    server.script(Exchange(chunks=[err]), Exchange(chunks=openai_chunks("ok")))
    msg = openai(server, backoff_base=0.001).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.text == "ok"
    assert len(server.requests) == 2


def test_anthropic_request_carries_version_key_system_and_merged_user_turns(
    server: ProtocolServer,
) -> None:
    # prompt_cache=False: the plain shape; the cache markers have their own tests
    # (tests/providers/test_prompt_caching.py).
    server.script(Exchange(chunks=anthropic_chunks("ok")))
    anthropic(server, api_key="ak", prompt_cache=False).complete(TRANSCRIPT, cancel=CancelScope())
    req = server.requests[0]
    assert req.headers["x-api-key"] == "ak"
    assert req.headers["anthropic-version"] == "2023-06-01"
    body = req.body
    assert body["system"] == "from the log"
    assert body["max_tokens"] == 8192
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "count the files"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "ral", "input": {"script": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c1",
                    "content": "no such dir",
                    "is_error": True,
                },
                {"type": "text", "text": "steer: use ."},
            ],
        },
    ]
    assert body["tools"][0]["input_schema"]["required"] == ["script"]


def test_anthropic_transcript_opening_with_an_assistant_turn_gets_a_user_turn_first() -> None:
    from exarch_actors.runtime.providers.anthropic import render_anthropic_messages

    turns = render_anthropic_messages([AssistantMessage("  "), UserMessage("")])
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert all(b["text"].strip() for t in turns for b in t["content"])


def test_anthropic_base_url_ending_in_v1_is_not_doubled(server: ProtocolServer) -> None:
    server.script(Exchange(chunks=anthropic_chunks("ok")))
    p = make_provider("anthropic", model="m", base_url=server.url + "/v1")
    p.complete([UserMessage("hi")], cancel=CancelScope())
    assert server.requests[0].path == "/v1/messages"


def test_anthropic_529_overloaded_is_retried_and_exhaustion_is_a_rate_limit(
    server: ProtocolServer,
) -> None:
    server.script(Exchange(status=529, body=b"{}"), Exchange(chunks=anthropic_chunks("ok")))
    assert (
        anthropic(server, backoff_base=0.001)
        .complete([UserMessage("hi")], cancel=CancelScope())
        .text
        == "ok"
    )
    server.script(Exchange(status=529, body=b"{}"))
    with pytest.raises(RateLimited) as e:
        anthropic(server, max_retries=0).complete([UserMessage("hi")], cancel=CancelScope())
    assert e.value.status == 529


def test_anthropic_overloaded_error_event_mid_stream_is_retried(server: ProtocolServer) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}
    chunks = [*anthropic_chunks("partial")[:3], sse(overloaded, "error")]
    server.script(Exchange(chunks=chunks), Exchange(chunks=anthropic_chunks("whole")))
    msg = anthropic(server, backoff_base=0.001).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.text == "whole"


def test_anthropic_usage_counts_cached_input_tokens(server: ProtocolServer) -> None:
    start = {
        "type": "message_start",
        "message": {
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 5,
                "output_tokens": 1,
            }
        },
    }
    rest = anthropic_chunks("hi", usage=(0, 42))[1:]
    server.script(Exchange(chunks=[sse(start, "message_start"), *rest]))
    msg = anthropic(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.usage == Usage(1015, 42, cache_write_tokens=5, cache_read_tokens=1000)


def test_a_network_provider_is_shared_by_a_forked_child_and_swappable_per_agent(
    server: ProtocolServer,
) -> None:
    parent = ProviderHandle(openai(server))
    child = ProviderHandle(parent.current().for_agent("child"))
    assert child.current() is parent.current()
    child.swap(anthropic(server))
    assert parent.current().name == "openai"
    assert child.current().name == "anthropic"
