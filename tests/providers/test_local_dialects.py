"""The openai provider against loopback servers that stream as local OpenAI-compatible servers do.

Each dialect is an encoder in tests/support/protocol_servers.py written from the server's own
source (its docstring names the file and function), served by a real HTTP server on 127.0.0.1:

- ``llama.cpp`` — ``llama-server --jinja`` since June 2025: standard deltas, ``content: null``
  in the role chunk, usage only when asked, ``timings`` on the last chunk.
- ``llama.cpp-may2025`` — the builds of late May 2025: the call's id inside ``function`` (or
  none at all), no ``type``, the name repeated on every delta, usage on the finish chunk.
- ``vllm`` — ``vllm serve --enable-auto-tool-choice``: the first call delta has no arguments key,
  and the finish chunk carries the last arguments *and* ``finish_reason: "tool_calls"``.
- ``ollama`` — ``/v1`` as of 2025: every call arrives whole in one chunk, arguments in one piece,
  ``role`` and ``content: ""`` repeated in every delta.
- ``ollama-2024`` — ``/v1`` before early 2025: no ``index``, ``finish_reason: "stop"`` although
  calls were made, and no usage at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import StopReason, ToolCall, Usage, UserMessage, admit_assistant
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.openai import OpenAIProvider
from tests.agent.conftest import exarch
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    llamacpp_chunks,
    llamacpp_may2025_chunks,
    ollama_2024_chunks,
    ollama_chunks,
    sse,
    vllm_chunks,
)

Encoder = Callable[..., list[bytes]]


@dataclass(frozen=True)
class Dialect:
    name: str
    chunks: Encoder
    reports_usage: bool
    """Whether usage reaches a client that asked for it (``stream_options.include_usage``)."""
    call_id: Callable[[int], str]
    """The id this server gives the n-th call of a reply."""

    def reply(self, text: str = "", calls: Sequence[tuple[str, str]] = ()) -> Exchange:
        """``calls``: (name, arguments JSON) per call, ids as this server makes them."""
        with_ids = [(self.call_id(i), name, args) for i, (name, args) in enumerate(calls)]
        return Exchange(chunks=self.chunks(text, with_ids))


DIALECTS = [
    Dialect("llama.cpp", llamacpp_chunks, True, lambda i: f"Bd1rUq0wXb8KsA3nLtM6cZy{i}e9PfHj2"),
    Dialect("llama.cpp-may2025", llamacpp_may2025_chunks, True, lambda i: f"kYp{i}Qz"),
    Dialect("vllm", vllm_chunks, True, lambda i: f"chatcmpl-tool-9c3e51d0a2b74f8e{i:016x}"),
    Dialect("ollama", ollama_chunks, True, lambda i: f"call_q{i}x7m2ka"),
    Dialect("ollama-2024", ollama_2024_chunks, False, lambda i: f"call_w{i}n4c8zt"),
]

SCRIPT = json.dumps({"script": 'echo "hi there"'})


@pytest.fixture(params=DIALECTS, ids=lambda d: d.name)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    return request.param


def _local(server: ProtocolServer, model: str = "qwen2.5:7b") -> OpenAIProvider:
    p = make_provider("openai", model=model, base_url=server.url + "/v1", max_retries=0)
    assert isinstance(p, OpenAIProvider)
    return p


def test_text_and_a_ral_call_are_assembled_whole_with_the_servers_id(
    server: ProtocolServer, dialect: Dialect
) -> None:
    server.script(dialect.reply("Let me check.", [("ral", SCRIPT)]))
    msg = _local(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.text == "Let me check."
    assert msg.tool_calls == (ToolCall(dialect.call_id(0), "ral", {"script": 'echo "hi there"'}),)
    assert msg.stop_reason is StopReason.TOOL_USE
    assert msg.usage == (Usage(12, 5) if dialect.reports_usage else None)
    assert admit_assistant(msg) == msg  # nothing to repair: ids, names and arguments are whole


def test_two_calls_in_one_reply_stay_two_calls_in_their_order(
    server: ProtocolServer, dialect: Dialect
) -> None:
    first, second = json.dumps({"script": "let a = 1"}), json.dumps({"script": "echo $a"})
    server.script(dialect.reply("", [("ral", first), ("ral", second)]))
    msg = _local(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert [(c.id, c.name, c.arguments) for c in msg.tool_calls] == [
        (dialect.call_id(0), "ral", {"script": "let a = 1"}),
        (dialect.call_id(1), "ral", {"script": "echo $a"}),
    ]
    assert msg.stop_reason is StopReason.TOOL_USE


def test_a_text_reply_ends_the_turn(server: ProtocolServer, dialect: Dialect) -> None:
    server.script(dialect.reply("All done: 3 files."))
    msg = _local(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert (msg.text, msg.tool_calls) == ("All done: 3 files.", ())
    assert msg.stop_reason is StopReason.END_TURN


def test_calls_sent_without_any_id_get_well_formed_ids_no_two_replies_share(
    server: ProtocolServer,
) -> None:
    no_ids = [("", "ral", SCRIPT), ("", "ral", SCRIPT)]
    server.script(*[Exchange(chunks=llamacpp_may2025_chunks("", no_ids))] * 2)
    p = _local(server)
    replies = [p.complete([UserMessage("hi")], cancel=CancelScope()) for _ in range(2)]
    ids = [c.id for r in replies for c in r.tool_calls]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert all(admit_assistant(r) == r for r in replies)  # well-formed: admission keeps them


def test_unindexed_calls_in_separate_chunks_are_told_apart_by_their_ids(
    server: ProtocolServer,
) -> None:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "llama3.1:8b"}

    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def call(cid: str, script: str) -> dict[str, object]:
        fn = {"name": "ral", "arguments": json.dumps({"script": script})}
        return {"id": cid, "type": "function", "function": fn}

    server.script(
        Exchange(
            chunks=[
                chunk({"role": "assistant", "content": "", "tool_calls": [call("call_a", "1")]}),
                chunk({"role": "assistant", "content": "", "tool_calls": [call("call_b", "2")]}),
                chunk({"role": "assistant", "content": ""}, "stop"),
                sse("[DONE]"),
            ]
        )
    )
    msg = _local(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert [(c.id, c.arguments) for c in msg.tool_calls] == [
        ("call_a", {"script": "1"}),
        ("call_b", {"script": "2"}),
    ]


def test_a_local_server_is_asked_without_a_key_and_answers(
    server: ProtocolServer, dialect: Dialect, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.script(dialect.reply("ok"))
    assert _local(server).complete([UserMessage("hi")], cancel=CancelScope()).text == "ok"
    (req,) = server.requests
    assert "authorization" not in req.headers
    assert req.path == "/v1/chat/completions"
    assert req.body["stream_options"] == {"include_usage": True}


@pytest.mark.slow
def test_run_against_a_local_server_with_no_key_calls_ral_and_replies(
    server: ProtocolServer, dialect: Dialect, tmp_path: Path
) -> None:
    def call(script: str) -> Exchange:
        return dialect.reply("", [("ral", json.dumps({"script": script}))])

    server.script(call("let x = add 40 2"), call("reply $x"), call("reply $x"))
    session = tmp_path / "session"
    p = exarch(
        [
            "run",
            "--base-url",
            server.url + "/v1",
            "--model",
            "qwen2.5:7b",
            "--session-dir",
            str(session),
            "add 40 and 2",
        ],
        cwd=tmp_path,
        env={"OPENAI_API_KEY": "", "EXARCH_API_KEY": ""},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42"
    assert all("authorization" not in r.headers for r in server.requests)
    tool_msgs = [m for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [dialect.call_id(0)]
