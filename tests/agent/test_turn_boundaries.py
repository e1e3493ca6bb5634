"""Turn boundaries: what a genuine turn resets and a self-nudge does not; the provider read once
per turn (a swap or ``/model`` lands next turn, never mid-turn); tool-boundary steering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from exarch_actors.runtime.messages import ToolResult, UserMessage
from tests.agent.conftest import Live, Run
from tests.agent.providers import Recording
from tests.support.waiting import wait_for


def _in_flight(events: list[dict[str, Any]], script: str) -> bool:
    """The assistant asked for ``script`` and its result is not in yet (the call is running)."""
    asked = [
        c["id"]
        for e in events
        if e["kind"] == "assistant"
        for c in e["message"]["tool_calls"]
        if c["arguments"].get("script") == script
    ]
    done = {e["message"]["tool_call_id"] for e in events if e["kind"] == "tool_result"}
    return bool(asked) and asked[-1] not in done


# --- latches and the sticky token -------------------------------------------------------------


@pytest.mark.slow
def test_a_genuine_turn_resets_the_nudge_budgets_and_a_self_nudge_does_not(
    run_scenario: Callable[..., Run],
) -> None:
    # Turn 1 messages itself, then never replies: must_reply fires its budget (3) and the turn
    # ends. The message is a new turn: the budget is fresh, so 3 more. Were self-nudges to
    # reset the budget, turn 1 would run until capped.
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["message trunk 'ping'"]

        [[agents.trunk]]
        text = "not replying"
        repeat = 8
        """
    )
    assert run.code == 0, run.stderr
    assert run.result["outcome"] == "quiesced"
    events = run.events("trunk")
    users = [i for i, e in enumerate(events) if e["kind"] == "user"]
    assert len(users) == 2 and events[users[1]]["source"] == "agent_message"
    first = [e["nudge"] for e in events[: users[1]] if e["kind"] == "nudge"]
    second = [e["nudge"] for e in events[users[1] :] if e["kind"] == "nudge"]
    assert first == ["must_reply"] * 3
    assert second == ["must_reply"] * 3


def test_an_interrupted_turn_stays_cancelled_and_the_next_genuine_turn_gets_a_fresh_scope(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["sleep 20", "echo after"]

        [[agents.trunk]]
        ral = ["echo fresh"]

        [[agents.trunk]]
        text = "done"
        """
    )
    live.wait_events(lambda ev: _in_flight(ev, "sleep 20"))
    interrupted = live.trunk.turn
    live.fleet.registry.interrupt("trunk")
    live.wait_idle(1)
    assert interrupted.cancelled and interrupted.reason == "interrupt"
    results = [e["message"] for e in live.events() if e["kind"] == "tool_result"]
    assert [r["is_error"] for r in results] == [True, True]
    assert "cancel" in results[0]["content"] and "interrupted" in results[1]["content"]
    assert "nudge" not in [e["kind"] for e in live.events()]
    live.steer("again")
    live.wait_idle(2)
    results = [e["message"] for e in live.events() if e["kind"] == "tool_result"]
    assert results[-1]["content"] == "[value]\nunit\n[stdout]\nfresh\n"
    # no way back: the interrupted scope stays cancelled; the new turn ran in a fresh one
    assert interrupted.cancelled and live.trunk.turn is not interrupted
    assert not live.trunk.turn.cancelled and not live.trunk.token.cancelled


def test_an_interrupted_headless_turn_posts_no_nudge_and_is_not_re_driven(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        text = "thinking"
        delay_ms = 20000

        [[agents.trunk]]
        ral = ["reply 1"]
        """,
        interactive=False,
    )
    wait_for(lambda: live.trunk.stats.steps == 1, what="the first request in flight")
    live.fleet.registry.interrupt("trunk")
    assert live.fleet.wait_empty(10)
    kinds = [e["kind"] for e in live.events()]
    assert kinds == ["user"], "nothing committed, no nudge, no second request"
    assert live.trunk.outcome.value == "quiesced"


# --- the provider, once per turn ----------------------------------------------------------------


def test_a_provider_swap_mid_turn_lands_on_the_next_turn_even_across_self_nudges(
    live_fleet: Callable[..., Live],
) -> None:
    providers: dict[str, Recording] = {}

    def swap_mid_turn(rec: Recording, n: int) -> None:
        if n == 1:  # the UI thread swapping while the turn runs
            live.trunk.provider.swap(providers["alt"])

    def wrap(p: Any) -> Recording:
        rec = Recording(p, before_complete=swap_mid_turn)
        providers.setdefault("first", rec)
        return rec

    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["pin t 'x'"]

        [[agents.trunk]]
        text = "resting"

        [[agents.trunk]]
        ral = ["unpin t"]

        [[agents.trunk]]
        text = "done"

        [[agents.alt]]
        text = "from alt"
        """,
        wrap=wrap,
    )
    providers["alt"] = Recording(live.extra["playback"].provider("alt"))
    live.wait_idle(1)
    assert "pinned_reminder" in [e.get("nudge") for e in live.events()], "a self-nudge happened"
    assert len(providers["first"].requests) == 4, "the whole turn stayed on the old provider"
    assert providers["alt"].requests == []
    live.steer("next")
    live.wait_idle(2)
    assert len(providers["alt"].requests) == 1
    assert live.events()[-1]["message"]["text"] == "from alt"


def test_slash_model_sent_mid_turn_is_applied_at_the_boundary_and_answers_the_next_turn(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["sleep 0.4"]

        [[agents.trunk]]
        ral = ["echo still-trunk"]

        [[agents.trunk]]
        text = "trunk done"

        [[agents.alt]]
        ral = ["echo from-alt"]

        [[agents.alt]]
        text = "alt done"
        """
    )
    live.wait_events(lambda ev: _in_flight(ev, "sleep 0.4"))
    live.steer("/model alt")
    live.wait_idle(2)
    ids = [
        c["id"]
        for e in live.events()
        if e["kind"] == "assistant"
        for c in e["message"]["tool_calls"]
    ]
    assert ids == ["call_trunk_0_0", "call_trunk_1_0"], "the running turn kept its provider"
    assert "steering" not in [e["kind"] for e in live.events()], "a slash line is not steering"
    notes = [n["text"] for n in live.kinds("SystemNote")]
    assert any("model set to alt" in t for t in notes)
    live.steer("carry on")
    live.wait_idle(3)
    ids = [
        c["id"]
        for e in live.events()
        if e["kind"] == "assistant"
        for c in e["message"]["tool_calls"]
    ]
    assert ids[-1] == "call_alt_0_0"
    assert live.events()[-1]["message"]["text"] == "alt done"


def test_slash_model_naming_no_script_is_refused_with_a_notice_and_the_agent_lives_on(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "/model nosuch"

        [[agents.trunk]]
        text = "still here"
        """
    )
    live.wait_idle(1)
    refusals = [n["text"] for n in live.kinds("Notice") if n["notice"] == "Refused"]
    assert any("/model refused" in t and "nosuch" in t for t in refusals)
    live.steer("hello")
    live.wait_idle(2)
    assert live.events()[-1]["message"]["text"] == "still here"


# --- tool-boundary steering ---------------------------------------------------------------------


def test_steering_that_arrives_mid_turn_is_appended_after_the_complete_tool_result_batch(
    live_fleet: Callable[..., Live],
) -> None:
    providers: list[Recording] = []

    def wrap(p: Any) -> Recording:
        providers.append(Recording(p))
        return providers[-1]

    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["sleep 0.4", "echo second"]

        [[agents.trunk]]
        text = "noted"
        """,
        wrap=wrap,
    )
    live.wait_events(lambda ev: _in_flight(ev, "sleep 0.4"))
    live.steer("also check the logs")
    live.wait_idle(1)
    kinds = [e["kind"] for e in live.events()]
    assert kinds == ["user", "assistant", "tool_result", "tool_result", "steering", "assistant"]
    assert live.events()[4]["text"] == "also check the logs"
    second = providers[0].requests[1]
    assert isinstance(second[-1], UserMessage) and second[-1].text == "also check the logs"
    assert [type(m) for m in second[-3:-1]] == [ToolResult, ToolResult]
    assert live.trunk.stats.turns == 1, "steering joined the running turn"
