"""The apply loop, rule by rule, through the real ``exarch-actors run`` command.

Each test runs a scenario in a subprocess and reads the session directory it left:
``agents/trunk/events.jsonl`` (what the model's context was built from), ``transcript.jsonl``
(the bus) and ``result.json``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exarch_actors.runtime.constants import MAX_STEPS
from exarch_actors.runtime.messages import EMPTY_REPLY_STUB
from tests.agent.conftest import Run


def _assistants(run: Run) -> list[dict[str, object]]:
    return [e["message"] for e in run.events("trunk") if e["kind"] == "assistant"]


def _results(run: Run) -> list[dict[str, object]]:
    return [e["message"] for e in run.events("trunk") if e["kind"] == "tool_result"]


# --- admission at the commit boundary (X2 / X7) ----------------------------------------------


@pytest.mark.slow
def test_non_json_tool_arguments_are_committed_as_an_empty_object_and_answered_as_missing_script(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        fn_arguments = "not json"

        [[agents.trunk]]
        ral = ["reply 1"]
        repeat = 2
        """
    )
    assert run.code == 0, run.stderr
    first = _assistants(run)[0]
    assert first["tool_calls"] == [{"id": "call_trunk_0_0", "name": "ral", "arguments": {}}]
    result = _results(run)[0]
    assert result["tool_call_id"] == "call_trunk_0_0"
    assert result["is_error"] is True
    assert "missing its script" in str(result["content"])
    io = [r for r in run.kinds("transcript.jsonl", "Io") if r["call_id"] == "call_trunk_0_0"]
    assert [r["value"] for r in io] == [result["content"]], (
        "the transcript shows what the model saw"
    )


@pytest.mark.slow
def test_an_empty_assistant_reply_is_committed_with_the_stub_and_repaired_by_a_nudge(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        text = "   "

        [[agents.trunk]]
        ral = ["reply 1"]
        repeat = 2
        """
    )
    assert run.code == 0, run.stderr
    first = _assistants(run)[0]
    assert first["text"] == EMPTY_REPLY_STUB and first["tool_calls"] == []
    events = run.events("trunk")
    i = next(i for i, e in enumerate(events) if e["kind"] == "assistant")
    assert events[i + 1]["kind"] == "nudge" and events[i + 1]["nudge"] == "empty_repair"


@pytest.mark.slow
def test_every_requested_tool_id_gets_exactly_one_result_in_request_order(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let a = 1", "fail 'boom'", "echo $nope", "add $a 1", "reply $a"]

        [[agents.trunk]]
        ral = ["reply 2"]
        """
    )
    assert run.code == 0, run.stderr
    events = run.events("trunk")
    asked = [
        c["id"] for e in events if e["kind"] == "assistant" for c in e["message"]["tool_calls"]
    ]
    answered = [e["message"]["tool_call_id"] for e in events if e["kind"] == "tool_result"]
    assert answered == asked
    assert len(set(answered)) == len(answered)
    contents = [e["message"]["content"] for e in events if e["kind"] == "tool_result"]
    assert "boom" in contents[1] and "undefined variable nope" in contents[2]
    assert contents[3] == "[value]\n2", "a failed call does not stop the batch"


# --- max tokens ---------------------------------------------------------------------------


@pytest.mark.slow
def test_max_tokens_without_a_tool_call_keeps_the_partial_and_posts_a_continue_nudge(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        text = "The answer is forty-"
        stop = "max_tokens"

        [[agents.trunk]]
        text = "two."
        ral = ["reply 42"]

        [[agents.trunk]]
        ral = ["reply 42"]
        """
    )
    assert run.code == 0, run.stderr
    events = run.events("trunk")
    kinds = [e["kind"] for e in events]
    i = kinds.index("assistant")
    assert events[i]["message"]["text"] == "The answer is forty-"
    assert events[i]["message"]["stop_reason"] == "max_tokens"
    assert events[i + 1]["kind"] == "nudge" and events[i + 1]["nudge"] == "continue"
    assert run.stdout.strip() == "42"


@pytest.mark.slow
def test_a_scripted_truncated_error_also_keeps_the_partial_and_continues(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        text = "half of it"
        error = "truncated"

        [[agents.trunk]]
        ral = ["reply 1"]
        repeat = 2
        """
    )
    assert run.code == 0, run.stderr
    events = run.events("trunk")
    assert events[1]["kind"] == "assistant" and events[1]["message"]["text"] == "half of it"
    assert events[2]["kind"] == "nudge" and events[2]["nudge"] == "continue"
    assert not run.kinds("transcript.jsonl", "ProviderError")


@pytest.mark.slow
def test_max_tokens_with_tool_calls_dispatches_them_and_posts_no_continue_nudge(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        text = "cut short"
        ral = ["let a = 41"]
        stop = "max_tokens"

        [[agents.trunk]]
        ral = ["reply (add $a 1)"]
        repeat = 2
        """
    )
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "42"
    events = run.events("trunk")
    assert events[1]["message"]["stop_reason"] == "max_tokens"
    assert events[2]["kind"] == "tool_result" and events[2]["message"]["content"] == "[value]\nunit"
    assert "continue" not in run.nudges()


# --- MAX_STEPS --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_turn_that_never_stops_calling_tools_is_capped_at_max_steps_and_never_re_driven(
    run_scenario: Callable[..., Run],
) -> None:
    # The pin makes an unbudgeted reminder due after every stop: if Capped were re-driven,
    # or if the step count restarted on each self-nudge, this run would never end.
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["pin task 'never done'"]

        [[agents.trunk]]
        ral = ["1"]
        repeat = 300
        """
    )
    assert run.code == 1, run.stderr
    assert run.result["outcome"] == "capped"
    assert len(_assistants(run)) == MAX_STEPS
    assert run.nudges() == [], "Capped matches no nudge rule"
    died = run.kinds("transcript.jsonl", "Died")
    assert [d["outcome"] for d in died] == ["capped"]


@pytest.mark.slow
def test_an_unbudgeted_pin_reminder_loop_is_bounded_by_max_steps_across_self_nudges(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["pin task 'never done'"]
        """,
        timeout=60,
    )
    assert run.code == 1, run.stderr
    assert run.result["outcome"] == "capped"
    assert len(_assistants(run)) == MAX_STEPS
    assert run.nudges().count("pinned_reminder") == MAX_STEPS - 1


# --- provider errors --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rate_limit_surfaces_as_a_provider_error_event_and_never_as_a_nudge(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let a = 1"]

        [[agents.trunk]]
        error = "rate_limit"
        """
    )
    assert run.code == 1
    assert run.result["outcome"] == "failed"
    errors = run.kinds("transcript.jsonl", "ProviderError")
    assert [(e["agent"], e["error"]) for e in errors] == [("trunk", "rate_limit")]
    assert run.nudges() == []
    texts = " ".join(str(e.get("text", "")) for e in run.events("trunk"))
    assert "rate" not in texts.lower(), "nothing about the failure reaches the model"


@pytest.mark.slow
def test_an_exhausted_transport_in_a_child_fails_the_child_without_a_nudge_and_the_parent_hears(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'work'"]

        [[agents.trunk]]
        text = "waiting"

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2

        [[agents.kid]]
        error = "transport"
        delay_ms = 400
        """
    )
    # delay_ms: the kid fails only after the trunk has parked waiting for it; failing sooner
    # would let the trunk finish (and record the kid's result as undeliverable) first.
    assert run.code == 0, run.stderr
    errors = run.kinds("transcript.jsonl", "ProviderError")
    assert [(e["agent"], e["error"]) for e in errors] == [("kid", "transport")]
    assert run.nudges("kid") == []
    died = {d["agent"]: d["outcome"] for d in run.kinds("transcript.jsonl", "Died")}
    assert died["kid"] == "failed"
    results = [e for e in run.events("trunk") if e.get("source") == "agent_result"]
    assert results and "kid finished: failed" in results[0]["text"]
