"""The fleet's MCP servers under the actor rules: grants narrow which servers an agent may use,
a stdio server is started lazily once per fleet and dies with it, a crashed server is restarted
at the next call, and a cancel of the calling agent reaches the server at once."""

from __future__ import annotations

import threading
from typing import Any

import psutil
import pytest

from exarch_actors.runtime.mcp.replies import CALL, McpRequest
from exarch_actors.runtime.ral.grants import GrantPolicy, Grants
from tests.mcp.conftest import SERVER, seen
from tests.support.waiting import wait_for


def _servers() -> list[psutil.Process]:
    """The loopback servers running below this process."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if SERVER in p.cmdline():
                out.append(p)
        except psutil.Error:
            continue
    return out


KID_TRIES = """
[[agents.trunk]]
ral = ["agent kid 'use t'; let r = agent-wait kid; reply (get (get $r kid) reply)"]

[[agents.kid]]
ral = ['try { mcp t echo [text: hi] } catch e { reply (get $e message) }']
"""


def test_a_child_whose_grants_exclude_the_server_is_refused_with_not_granted(
    mcp_fleet: Any,
) -> None:
    policy = GrantPolicy(Grants(), (("kid", Grants(mcp=frozenset())),))
    run = mcp_fleet(KID_TRIES, grants=policy)
    message = run.reply()
    assert message.startswith("not granted: agent kid may not use MCP server 't'")
    assert run.fleet.mcp.hub().link_generation("t") == 0  # nothing was started for it
    assert "MCP servers" in run.fleet.hosted["trunk"].system
    assert "MCP servers" not in run.fleet.hosted["kid"].system  # never shown what it may not use


def test_a_child_never_gains_a_server_its_parent_lacks(mcp_fleet: Any) -> None:
    policy = GrantPolicy(
        Grants(),
        (("trunk", Grants(mcp=frozenset({"other"}))), ("kid", Grants(mcp=frozenset({"t"})))),
    )
    run = mcp_fleet(KID_TRIES, grants=policy)
    assert run.reply().startswith("not granted: agent kid")


def test_a_stdio_server_starts_lazily_once_per_fleet_and_dies_with_it(mcp_fleet: Any) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['''
        agent kid 'x'
        let r = agent-wait kid
        reply [mine: (mcp t pid), kid: (get (get $r kid) reply)]
        ''']

        [[agents.kid]]
        ral = ['reply (mcp t pid)']
        """
    )
    reply = run.reply()
    assert reply["mine"] == reply["kid"]  # one server, shared by both agents
    pid = reply["mine"]["result"]
    assert [p.pid for p in _servers()] == [pid]
    run.fleet.close()
    wait_for(lambda: not psutil.pid_exists(pid), 15, "the server to die with the fleet")


def test_a_servers_first_call_also_learns_its_tools_for_later_prompts(mcp_fleet: Any) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['reply (mcp t echo [text: hi])']
        """
    )
    assert run.reply() == {"result": "hi"}
    hub = run.fleet.mcp.hub()
    tools = wait_for(lambda: hub.catalog("t"), 15, "the background listing")
    assert "slow" in [t.name for t in tools]
    assert "  - echo: Echo TEXT back." in (run.fleet.mcp.prompt_for(Grants()) or "")


def test_a_fleet_that_never_calls_a_server_never_starts_it(mcp_fleet: Any) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['reply done']
        """
    )
    assert run.reply() == "done"
    assert _servers() == []
    assert run.fleet.mcp.hub().link_generation("t") == 0


def test_a_crashed_server_fails_the_call_in_flight_and_the_next_call_restarts_it(
    mcp_fleet: Any,
) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['let before = mcp t pid']

        [[agents.trunk]]
        ral = ['mcp t crash']

        [[agents.trunk]]
        ral = ['reply [before: $before, after: (mcp t pid)]']
        """
    )
    reply = run.reply()
    assert reply["before"] != reply["after"]
    assert run.fleet.mcp.hub().link_generation("t") == 2
    results = [
        e["message"]["content"]
        for e in _events(run, "trunk")
        if e.get("kind") == "tool_result"
    ]
    assert "the server's connection ended during the call" in results[1]
    assert "crash" in seen(run.log)


@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_cancel_of_the_calling_agent_reaches_the_server_during_a_slow_tool(
    mcp_fleet: Any, agents: str
) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['''
        agent kid 'wait'
        let r = agent-wait kid
        reply [kid: (get (get $r kid) outcome), after: (mcp t echo [text: still])]
        ''']

        [[agents.kid]]
        ral = ['mcp t slow [seconds: 120]']
        """,
        agents=agents,
    )
    wait_for(lambda: "start slow" in seen(run.log), 30, "the slow tool to start")
    run.fleet.registry.cancel("kid", "test cancel")
    wait_for(lambda: "cancelled slow" in seen(run.log), 15, "the server to see the cancel")
    reply = run.reply()
    assert reply == {"kid": "cancelled", "after": {"result": "still"}}  # the server stays usable
    assert "done slow" not in seen(run.log)


def _events(run: Any, agent: str) -> list[dict[str, Any]]:
    from exarch_actors.runtime.state.durable import read_jsonl

    return read_jsonl(run.session / "agents" / agent / "events.jsonl").records


def test_an_interrupted_call_abandons_its_request_and_leaves_the_server_usable(
    mcp_fleet: Any,
) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['mcp t slow [seconds: 120]']
        """
    )
    wait_for(lambda: "start slow" in seen(run.log), 30, "the slow tool to start")
    run.fleet.hosted["trunk"].interrupt("esc")
    wait_for(lambda: "cancelled slow" in seen(run.log), 15, "the server to see the cancel")
    assert run.fleet.wait_empty(30)
    answered: list[Any] = []
    done = threading.Event()

    def then(value: Any) -> None:
        answered.append(value)
        done.set()

    run.fleet.mcp.hub().begin(McpRequest("test", "1", "t", CALL, "echo", {"text": "again"}), then)
    assert done.wait(30)
    assert answered == [{"result": "again"}]
    assert run.fleet.mcp.hub().link_generation("t") == 1  # the same server, never restarted


def _shell_hosts() -> list[psutil.Process]:
    """The shell hosts below this process: the children of its fork server."""
    hosts = []
    for p in psutil.Process().children():
        try:
            if "forkserver" in " ".join(p.cmdline()):
                hosts += p.children()
        except psutil.Error:
            continue
    return hosts


def test_a_shell_that_dies_mid_call_leaves_the_server_usable_for_the_next_call(
    mcp_fleet: Any,
) -> None:
    run = mcp_fleet(
        """
        [[agents.trunk]]
        ral = ['mcp t slow [seconds: 120]']

        [[agents.trunk]]
        ral = ['reply (mcp t echo [text: "after the panic"])']
        """
    )
    wait_for(lambda: "start slow" in seen(run.log), 30, "the slow tool to start")
    (host,) = _shell_hosts()
    host.kill()  # the trunk's shell host dies in its call: a panic, the call rolled back
    wait_for(lambda: "cancelled slow" in seen(run.log), 15, "the server to see the cancel")
    assert run.reply() == {"result": "after the panic"}
    assert run.fleet.mcp.hub().link_generation("t") == 1
    results = [e for e in _events(run, "trunk") if e.get("kind") == "tool_result"]
    assert results[0]["message"]["is_error"]
