"""``exarch-actors run --provider openai|anthropic`` end to end against real protocol servers on
127.0.0.1: the model calls ral, then replies; broken tool calls are answered; a hung server
times out into a ProviderError; ``--chat`` sends no system prompt and no tool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import ROOT, exarch, read_records
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    anthropic_chunks,
    openai_chunks,
)


def _run(
    server: ProtocolServer, tmp_path: Path, provider: str, *args: str, prompt: str = "add 40 and 2"
) -> tuple[Any, Path]:
    base = server.url + "/v1" if provider == "openai" else server.url
    session = tmp_path / "session"
    p = exarch(
        [
            "run",
            "--provider",
            provider,
            "--base-url",
            base,
            "--model",
            "m",
            "--api-key",
            "k",
            "--session-dir",
            str(session),
            *args,
            prompt,
        ],
        cwd=tmp_path,
        timeout=60,
    )
    return p, session


def _openai_call(call_id: str, name: str, args: str) -> Exchange:
    return Exchange(chunks=openai_chunks(tool_calls=[(call_id, name, args)]))


def _anthropic_call(call_id: str, script: str) -> Exchange:
    return Exchange(
        chunks=anthropic_chunks(tool_calls=[(call_id, "ral", json.dumps({"script": script}))])
    )


@pytest.mark.slow
def test_openai_run_calls_ral_then_replies(protocol_server: ProtocolServer, tmp_path: Path) -> None:
    protocol_server.script(
        _openai_call("call_1", "ral", json.dumps({"script": "let x = add 40 2"})),
        _openai_call("call_2", "ral", json.dumps({"script": "reply $x"})),
        _openai_call("call_3", "ral", json.dumps({"script": "reply $x"})),
    )
    p, session = _run(protocol_server, tmp_path, "openai")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42"
    reqs = protocol_server.requests
    assert len(reqs) == 3 and reqs[0].path == "/v1/chat/completions"
    assert reqs[0].body["model"] == "m" and reqs[0].body["stream"] is True
    assert reqs[0].body["messages"][0]["role"] == "system"
    assert [t["function"]["name"] for t in reqs[0].body["tools"]] == ["ral"]
    tool_msgs = [m for m in reqs[1].body["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": "call_1", "content": "[value]\nunit"}]
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "replied" and result["reply"] == "42"


@pytest.mark.slow
def test_anthropic_run_calls_ral_then_replies(
    protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    protocol_server.script(
        _anthropic_call("toolu_1", "let x = add 40 2"),
        _anthropic_call("toolu_2", "reply $x"),
        _anthropic_call("toolu_3", "reply $x"),
    )
    p, session = _run(protocol_server, tmp_path, "anthropic")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42"
    reqs = protocol_server.requests
    assert len(reqs) == 3 and reqs[0].path == "/v1/messages"
    assert reqs[0].body["system"] and [t["name"] for t in reqs[0].body["tools"]] == ["ral"]
    results = [
        b
        for m in reqs[1].body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert [r["tool_use_id"] for r in results] == ["toolu_1"]
    assert read_records(session / "transcript.jsonl")


@pytest.mark.slow
def test_unknown_tools_and_broken_arguments_are_answered_in_order_on_the_wire(
    protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    protocol_server.script(
        Exchange(
            chunks=openai_chunks(
                tool_calls=[
                    ("c1", "bash", json.dumps({"cmd": "ls"})),
                    ("c2", "ral", "not json"),
                    ("c3", "ral", json.dumps({"script": "add 1 1"})),
                ]
            )
        ),
        _openai_call("c4", "ral", json.dumps({"script": "reply ok"})),
        _openai_call("c5", "ral", json.dumps({"script": "reply ok"})),
    )
    p, session = _run(protocol_server, tmp_path, "openai")
    assert p.returncode == 0, p.stderr
    msgs = protocol_server.requests[1].body["messages"]
    assistant = next(m for m in msgs if m["role"] == "assistant")
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [
        json.dumps({"cmd": "ls"}),
        "{}",
        json.dumps({"script": "add 1 1"}),
    ], "the committed message is what a strict backend accepts"
    tools = [m for m in msgs if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == ["c1", "c2", "c3"]
    assert "unknown tool 'bash'" in tools[0]["content"]
    assert "missing its script" in tools[1]["content"]
    assert tools[2]["content"] == "[value]\n2"
    io = [r for r in read_records(session / "transcript.jsonl") if r["kind"] == "Io"]
    assert [r["call_id"] for r in io[:3]] == ["c1", "c2", "c3"]


@pytest.mark.slow
def test_a_provider_that_never_answers_times_out_into_a_provider_error_and_the_run_fails(
    protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    protocol_server.script(Exchange(hang=True))
    p, session = _run(protocol_server, tmp_path, "openai", "--timeout", "0.5", "--retries", "0")
    assert p.returncode == 1, p.stderr
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "failed"
    transcript = read_records(session / "transcript.jsonl")
    errors = [r for r in transcript if r["kind"] == "ProviderError"]
    assert [e["error"] for e in errors] == ["timeout"]
    events = read_records(session / "agents" / "trunk" / "events.jsonl")
    assert [e["kind"] for e in events] == ["user"], "no nudge, nothing committed"


@pytest.mark.slow
def test_a_rate_limited_request_is_retried_and_the_run_still_replies(
    protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    protocol_server.script(
        Exchange(status=429, headers={"retry-after": "0"}, body=b'{"error": "slow down"}'),
        _openai_call("call_1", "ral", json.dumps({"script": "reply 1"})),
        _openai_call("call_2", "ral", json.dumps({"script": "reply 1"})),
    )
    p, session = _run(protocol_server, tmp_path, "openai")
    assert p.returncode == 0, p.stderr
    assert len(protocol_server.requests) == 3
    transcript = read_records(session / "transcript.jsonl")
    assert not [r for r in transcript if r["kind"] == "ProviderError"]


@pytest.mark.slow
def test_chat_sends_no_system_prompt_and_no_tool_and_prints_the_answer(
    protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    protocol_server.script(Exchange(chunks=openai_chunks(text="Hello there, human.")))
    p, session = _run(protocol_server, tmp_path, "openai", "--chat", prompt="hi")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "Hello there, human."
    (req,) = protocol_server.requests
    assert "tools" not in req.body
    assert [m["role"] for m in req.body["messages"]] == ["user"]
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "replied"


def test_a_model_swap_on_a_network_provider_keeps_the_endpoint_and_changes_the_model(
    protocol_server: ProtocolServer,
) -> None:
    from exarch_actors.runtime.providers.anthropic import AnthropicProvider
    from exarch_actors.runtime.providers.openai import OpenAIProvider

    p = OpenAIProvider(model="a", base_url=protocol_server.url + "/v1", api_key="k")
    q = p.with_model("b")
    assert (p.model, q.model) == ("a", "b")
    assert q.base_url == p.base_url and q.api_key == p.api_key and q is not p
    r = AnthropicProvider(model="a", base_url=protocol_server.url, api_key="k")
    s = r.with_model("b")
    assert (r.model, s.model, s.name) == ("a", "b", "anthropic")


@pytest.mark.slow
def test_a_stream_that_never_ends_is_cancelled_by_ctrl_c_and_the_run_exits_130(
    protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    head = openai_chunks(text="thinking", done=False)[:2]
    keepalive = openai_chunks(text="...", done=False)[1]
    protocol_server.script(Exchange(chunks=head, forever=keepalive, interval=0.02))
    session = tmp_path / "session"
    cmd = [
        sys.executable,
        "-c",
        "from exarch_actors.cli.main import main; main()",
        "run",
        "--provider",
    ]
    cmd += ["openai", "--base-url", protocol_server.url + "/v1", "--model", "m", "--api-key", "k"]
    cmd += ["--timeout", "1", "--session-dir", str(session), "go"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert protocol_server.wait_for_requests(1, timeout=20)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 130
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "cancelled"
    events = read_records(session / "agents" / "trunk" / "events.jsonl")
    assert [e["kind"] for e in events] == ["user"], "nothing streamed was committed"
