"""Memory-mode spawns: ``agent NAME PROMPT [memory: true]`` forks the parent's model-visible
context into the child before its prompt; without the option the child inherits nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from exarch_actors.runtime.messages import AssistantMessage, ToolResult, UserMessage
from tests.agent.conftest import Live, Run
from tests.agent.providers import Recording

PROMPT = "Find the magic number, then have a helper check it."
KID_PROMPT = "Check the number I found above and reply with it."


def scenario(option: str) -> str:
    return f"""
    [fleet]
    prompt = "{PROMPT}"

    [[agents.trunk]]
    text = "The magic number is 1234."
    ral = ["let magic = 1234"]

    [[agents.trunk]]
    text = "A helper will double-check it."
    ral = ["let asked = 1", "agent kid '{KID_PROMPT}' {option}"]

    [[agents.trunk]]
    text = "Waiting for kid."
    stop = "end_turn"

    [[agents.trunk]]
    ral = ["reply checked"]
    repeat = 2

    [[agents.kid]]
    ral = ["reply (str $magic)"]
    """


def kid_first_request(live: Live) -> list[Any]:
    assert live.fleet.wait_empty(30)
    provider = live.fleet.agents["kid"].provider.current()
    assert isinstance(provider, Recording)
    return provider.requests[0]


def test_a_memory_mode_child_starts_with_its_parents_context_and_then_its_prompt(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(scenario("[memory: true]"), interactive=False, wrap=Recording)
    sent = kid_first_request(live)
    # the trunk's first exchange, then the prompt; the frame being dispatched when kid was
    # forked (its text, both its calls and the result of the first) is not inherited
    assert [type(m) for m in sent] == [UserMessage, AssistantMessage, ToolResult, UserMessage]
    assert sent[0] == UserMessage(PROMPT)
    assert sent[1].text == "The magic number is 1234."
    assert sent[-1].text == KID_PROMPT, "the prompt enters through the child's own inbox"
    assert not any("A helper will double-check it." in str(m) for m in sent)
    events = live.events("kid")
    notes = [e["text"] for e in events if e["kind"] == "note"]
    assert notes == ["memory: inherited 3 events from trunk"]
    prompts = [e for e in events if e["kind"] == "user" and e["text"] == KID_PROMPT]
    assert len(prompts) == 1 and events.index(prompts[0]) == 4, "after the inherited context"
    assert live.fleet.agents["kid"].reply_value == "1234"


def test_without_memory_a_child_inherits_nothing_but_its_prompt(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(scenario(""), interactive=False, wrap=Recording)
    assert kid_first_request(live) == [UserMessage(KID_PROMPT)]
    assert next(e["kind"] for e in live.events("kid")) == "user"


@pytest.mark.slow
def test_the_spawn_receipt_says_memory_and_bad_options_are_refused_by_name(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = [
          "try { agent a 'x' [memroy: true] } catch e { get $e message }",
          "try { agent b 'x' [memory: 1] } catch e { get $e message }",
          "try { agent c 'x' yes } catch e { get $e message }",
          "agent kid 'x' [memory: true]",
        ]

        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2

        [[agents.kid]]
        ral = ["reply ok"]
        """
    )
    assert run.code == 0, run.stderr
    values = [r["value"] for r in run.kinds("transcript.jsonl", "Io") if r["agent"] == "trunk"]
    assert values[0] == "[value]\nagent: unknown option memroy (known: memory)"
    assert values[1] == "[value]\nagent: memory must be true or false, got 1"
    assert values[2] == "[value]\nagent OPTIONS must be a map such as [memory: true], got yes"
    assert values[3] == (
        '[value]\n[agent: "kid", status: "started", fuel: 2, parent: "trunk", memory: true]'
    )
    assert sorted({r["agent"] for r in run.kinds("transcript.jsonl", "Born")}) == ["kid", "trunk"]
