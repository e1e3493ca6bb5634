"""``mcp`` and ``mcp-tools`` in a scripted agent's ral against a real server: listing, calling,
structured results as ral values, error results as ral errors, stdio and streamable HTTP, on
both agent backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exarch_actors.runtime.mcp.config import McpServer
from tests.mcp.conftest import seen

CALLS = """
[fleet]
prompt = "use the tools"

[[agents.trunk]]
ral = ['''
let tools = mcp-tools t
let sum = mcp t add [a: 2, b: 3]
reply [tools: $tools, sum: $sum]
''']
"""


@pytest.mark.parametrize("agents", ["thread", "process"])
def test_an_agent_lists_tools_and_gets_a_structured_result_as_a_ral_map(
    mcp_fleet: Any, agents: str
) -> None:
    run = mcp_fleet(CALLS, agents=agents)
    reply = run.reply()
    tools = {t["name"]: t for t in reply["tools"]}
    assert {"add", "echo", "fail", "slow"} <= set(tools)
    assert tools["add"]["description"] == "Add two integers; a structured result."
    assert tools["add"]["input"]["required"] == ["a", "b"]
    assert reply["sum"] == {"sum": 5, "terms": [2, 3]}
    assert "done add" in seen(run.log)


def test_an_error_result_is_a_ral_error_carrying_the_servers_message(mcp_fleet: Any) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['try { mcp t fail [message: "disk on fire"] } catch e { reply (get $e message) }']
        """
    )
    message = run.reply()
    assert "disk on fire" in message and message.startswith("mcp t fail")


def test_arguments_that_are_not_a_map_are_refused_before_anything_is_sent(
    mcp_fleet: Any,
) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['try { mcp t echo "hi" } catch e { reply (get $e message) }']
        """
    )
    assert "ARGS must be a map" in run.reply()
    assert seen(run.log) == []


def test_an_unknown_server_is_refused_naming_the_configured_ones(mcp_fleet: Any) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['try { mcp nope echo [text: x] } catch e { reply (get $e message) }']
        """
    )
    assert run.reply() == "mcp: no server named 'nope' (servers: t)"


def test_a_streamable_http_server_answers_the_same_calls(
    mcp_fleet: Any, http_server: tuple[str, Path]
) -> None:
    url, log = http_server
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['reply (mcp web add [a: 40, b: 2])']
        """,
        servers=(McpServer("web", url=url),),
    )
    assert run.reply() == {"sum": 42, "terms": [40, 2]}
    assert "done add" in seen(log)


def test_the_server_never_sees_the_providers_key(
    mcp_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-never-shown")
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['''
        let key = mcp t getenv [name: OPENAI_API_KEY]
        reply [key: $key, session: (mcp t getenv [name: EXARCH_SESSION])]
        ''']
        """
    )
    reply = run.reply()
    assert reply["key"] == {"result": ""}
    assert reply["session"] == {"result": str(run.session.resolve())}


def test_the_system_prompt_lists_the_granted_servers_and_their_tools_once_known(
    mcp_fleet: Any,
) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ["let tools = mcp-tools t; agent kid 'x'; let r = agent-wait kid; reply done"]

        [[agents.kid]]
        ral = ['reply ok']
        """
    )
    assert run.reply() == "done"
    trunk, kid = run.fleet.hosted["trunk"].system, run.fleet.hosted["kid"].system
    assert "- t: loopback (tools not listed yet: `mcp-tools t`)" in trunk  # lazily started
    assert "- t: loopback\n  - echo: Echo TEXT back.\n  - add: Add two integers" in kid


def test_a_server_that_cannot_start_is_a_ral_error_pointing_at_its_log(mcp_fleet: Any) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['try { mcp x echo [text: a] } catch e { reply (get $e message) }']
        """,
        servers=(McpServer("x", command="/nonexistent/server"),),
    )
    message = run.reply()
    assert message.startswith("mcp x: cannot start or reach the server (stdio: /nonexistent/")
    log = run.session / "mcp" / "x.stderr"
    assert message.endswith(f"its log: {log.resolve()}") or message.endswith(f"its log: {log}")
    assert "cannot start: No such file or directory" in log.read_text()
