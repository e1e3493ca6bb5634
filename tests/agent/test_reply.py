"""``reply``: it ends a returning agent after its batch, cancels the agent's remaining
descendants, and a headless trunk's first reply is turned back once for self-verification."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from exarch_actors.runtime.state.eventlog import AgentLog, ProtocolState
from tests.agent.conftest import Live, Run
from tests.support.waiting import HANG_GUARD, wait_for


@pytest.mark.slow
def test_the_headless_trunks_first_reply_is_turned_back_and_the_second_honoured(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["reply 1"]

        [[agents.trunk]]
        ral = ["echo checking"]

        [[agents.trunk]]
        ral = ["reply 2"]

        [[agents.trunk]]
        ral = ["reply 3"]
        """
    )
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "2"
    assert run.result["outcome"] == "replied" and run.result["reply"] == "2"
    assert run.nudges() == ["self_verify"]
    scripts = [r["script"] for r in run.kinds("transcript.jsonl", "Io")]
    assert scripts == ["reply 1", "echo checking", "reply 2"], "a tool call after the turn-back "
    "does not end the loop on the stale reply; the second reply does"


def test_a_turned_back_reply_stands_when_the_trunk_never_replies_again(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["reply 7"]
        """
    )
    assert run.code == 0, run.stderr
    assert run.result["outcome"] == "replied" and run.stdout.strip() == "7"
    assert run.nudges()[0] == "self_verify"
    assert "must_reply" in run.nudges()
    notes = [n["text"] for n in run.kinds("transcript.jsonl", "SystemNote")]
    assert any("first reply stands" in t for t in notes)


@pytest.mark.slow
def test_a_childs_reply_ends_it_after_its_batch_and_cancels_its_descendants(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'work'"]

        [[agents.trunk]]
        text = "waiting for kid"

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2

        [[agents.kid]]
        ral = [
          "agent grandkid 'sleep for a long time'",
          "agent-wait grandkid [timeout: 5]",
          "reply 5",
          "echo after-reply",
        ]

        [[agents.kid]]
        ral = ["echo never"]

        [[agents.grandkid]]
        ral = ["sleep 30"]
        """,
        timeout=30,
    )
    assert run.code == 0, run.stderr
    kid_scripts = [r["script"] for r in run.kinds("transcript.jsonl", "Io") if r["agent"] == "kid"]
    # a process agent's child is born after its agent verb returns: the kid waits (at most
    # 5 s, the grandkid still running then) so that its reply meets the grandkid's call running
    assert kid_scripts == [
        "agent grandkid 'sleep for a long time'",
        "agent-wait grandkid [timeout: 5]",
        "reply 5",
        "echo after-reply",
    ], "the batch finishes, then the agent ends: no further round-trip"
    died = {d["agent"]: d for d in run.kinds("transcript.jsonl", "Died")}
    assert died["kid"]["outcome"] == "replied"
    assert died["grandkid"]["outcome"] == "cancelled"
    journal = run.jsonl("spawn-journal.jsonl")
    assert any(r["kind"] == "cancelled" and r["id"] == "grandkid" for r in journal)
    assert run.result["fleetYield"]["neverSettled"] == 0
    for name in ("trunk", "kid", "grandkid"):  # the single exit leaves every log ready
        log, report = AgentLog.load(run.session / "agents" / name / "events.jsonl")
        assert log.state is ProtocolState.READY_FOR_USER and not report.protocol_anomalies
    cancelled = [e for e in run.events("grandkid") if e["kind"] == "tool_result"]
    assert len(cancelled) == 1 and "cancel" in cancelled[0]["message"]["content"]
    result = [e for e in run.events("trunk") if e.get("source") == "agent_result"]
    assert "kid finished: replied" in result[0]["text"] and result[0]["text"].endswith("5")


def test_a_parent_whose_childs_result_came_while_the_child_was_still_registered_is_asked_to_reply(
    live_fleet: Callable[..., Any], monkeypatch: Any
) -> None:
    """A child's result reaches its parent's inbox before the child deregisters, so the turn
    that admits the result can still count the child live and suspend its nudge rules. The
    interleaving is forced here: the child's deregistration waits until that turn has ended.
    Once the child is gone the rules run again, and the parent that never replied is asked to
    (it would otherwise quiesce without a reply)."""
    from exarch_actors.runtime.fleet.registry import FleetRegistry

    holder: dict[str, Any] = {}
    deregister = FleetRegistry.deregister

    def turn_after_the_result_ended(agent: str) -> bool:
        events = holder["live"].events(agent) if "live" in holder else []
        after = [e for e in events if e.get("source") == "agent_result"]
        if not after:
            return False
        tail = events[events.index(after[0]) + 1 :]
        return any(e.get("kind") == "assistant" for e in tail)

    def held(self: FleetRegistry, name: str) -> bool:
        if name == "kid":
            wait_for(lambda: turn_after_the_result_ended("trunk"), HANG_GUARD, "the trunk's turn")
        return deregister(self, name)

    monkeypatch.setattr(FleetRegistry, "deregister", held)
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'work'"]

        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"
        repeat = 2

        [[agents.trunk]]
        ral = ["reply 42"]

        [[agents.kid]]
        ral = ["reply 7"]
        """,
        interactive=False,
    )
    holder["live"] = live
    wait_for(lambda: live.trunk.outcome is not None, HANG_GUARD, "the trunk's end")
    assert live.trunk.outcome.value == "replied"
    assert live.trunk.reply_value == 42
    events = live.events("trunk")
    result = next(i for i, e in enumerate(events) if e.get("source") == "agent_result")
    after = [e["kind"] for e in events[result + 1 : result + 3]]
    assert after == ["assistant", "nudge"], after  # "waiting", then the must-reply nudge
    assert "without calling `reply`" in events[result + 2]["text"]


def test_a_cancelled_in_process_child_s_busy_shell_is_killed_and_its_call_answered_with_the_cause(
    live_fleet: Callable[..., Live],
) -> None:
    # the thread backend ends a cancelled agent as an agent process does: its eval root is
    # terminal, its busy host SIGKILLed rather than asked to unwind (`1:1 cancelled`)
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'work'"]

        [[agents.trunk]]
        text = "waiting for kid"
        stop = "end_turn"

        [[agents.kid]]
        ral = ["sleep 60"]
        """,
        interactive=True,
    )
    kid = wait_for(lambda: live.fleet.agents.get("kid"), 30, "kid born")
    wait_for(lambda: kid.eval_root.busy, 30, "kid busy in its sleep")
    live.fleet.registry.cancel("kid", "stop now")
    assert kid.wait(30), "kid ended"
    (result,) = [e["message"] for e in live.events("kid") if e["kind"] == "tool_result"]
    assert result["content"] == "[error]\ncancelled: stop now"
    assert kid.outcome is not None and kid.outcome.value == "cancelled"
