"""The embedded scripted provider plays docs/scenarios.md exactly."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.messages import (
    StopReason,
    ToolCall,
    ToolResult,
    TranscriptItem,
    Usage,
    UserMessage,
    admit_assistant,
)
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.base import (
    MalformedReply,
    ProviderHandle,
    ProviderTimeout,
    RateLimited,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    TransportError,
    Truncated,
)
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from tests.support.waiting import HANG_GUARD

TRUNK = """
[fleet]
prompt = "Count the files."
window_tokens = 8000

[[agents.trunk]]
text = "Let me look."
ral = ["let n = 3", "echo $n"]

[[agents.trunk]]
ral = ["agent counter 'count again'"]

[[agents.trunk]]
text = "Done: 3 files."

[[agents.counter]]
ral = ["reply 3"]
"""


def play(source: str, agent: str = "trunk") -> ScenarioPlayback:
    return ScenarioPlayback(parse_scenario(source))


def test_messages_are_consumed_one_per_round_trip_in_file_order_as_ral_tool_calls() -> None:
    p = make_provider("scripted", scenario=parse_scenario(TRUNK))
    scope = CancelScope()
    first = p.complete([UserMessage("go")], cancel=scope)
    assert first.text == "Let me look."
    assert first.stop_reason is StopReason.TOOL_USE
    assert first.tool_calls == (
        ToolCall("call_trunk_0_0", "ral", {"script": "let n = 3"}),
        ToolCall("call_trunk_0_1", "ral", {"script": "echo $n"}),
    )
    second = p.complete([], cancel=scope)
    assert second.tool_calls[0].arguments == {"script": "agent counter 'count again'"}
    third = p.complete([], cancel=scope)
    assert (third.text, third.tool_calls, third.stop_reason) == (
        "Done: 3 files.",
        (),
        StopReason.END_TURN,
    )


def test_an_exhausted_agent_gets_an_empty_end_turn_message_every_time() -> None:
    p = play('[[agents.trunk]]\ntext = "only"\n').provider("trunk")
    scope = CancelScope()
    assert p.complete([], cancel=scope).text == "only"
    for _ in range(3):
        m = p.complete([], cancel=scope)
        assert (m.text, m.tool_calls, m.stop_reason) == ("", (), StopReason.END_TURN)
    assert admit_assistant(m).text.strip()  # the runtime's repair applies as usual


def test_an_agent_with_no_script_at_all_gets_an_empty_end_turn() -> None:
    m = play(TRUNK).provider("nobody").complete([], cancel=CancelScope())
    assert (m.text, m.tool_calls, m.stop_reason) == ("", (), StopReason.END_TURN)


def test_repeat_plays_the_message_n_times_in_place() -> None:
    pb = play(
        '[[agents.a]]\ntext = "x"\nrepeat = 3\n[[agents.a]]\ntext = "y"\n'
        '[[agents.a]]\ntext = "never"\nrepeat = 0\n'
    )
    p = pb.provider("a")
    texts = [p.complete([], cancel=CancelScope()).text for _ in range(5)]
    assert texts == ["x", "x", "x", "y", ""]


def test_a_childs_messages_are_found_by_its_name_through_for_agent() -> None:
    trunk = make_provider("scripted", scenario=parse_scenario(TRUNK))
    child = trunk.for_agent("counter")
    assert child.complete([], cancel=CancelScope()).tool_calls[0].arguments == {"script": "reply 3"}
    # the trunk's own cursor is untouched by the child's round-trip
    assert trunk.complete([], cancel=CancelScope()).text == "Let me look."


def test_a_pattern_gives_every_matching_agent_its_own_copy() -> None:
    pb = play('[[agents."worker-*"]]\ntext = "one"\n[[agents."worker-*"]]\ntext = "two"\n')
    a, b = pb.provider("worker-a"), pb.provider("worker-b")
    scope = CancelScope()
    assert [a.complete([], cancel=scope).text, b.complete([], cancel=scope).text] == ["one", "one"]
    assert [b.complete([], cancel=scope).text, a.complete([], cancel=scope).text] == ["two", "two"]
    assert pb.provider("helper").complete([], cancel=scope).text == ""


def test_two_providers_for_the_same_name_share_one_cursor() -> None:
    pb = play('[[agents.a]]\ntext = "1"\n[[agents.a]]\ntext = "2"\n')
    assert pb.provider("a").complete([], cancel=CancelScope()).text == "1"
    assert pb.provider("a").complete([], cancel=CancelScope()).text == "2"
    assert pb.remaining("a") == 0


def test_usage_tokens_sets_the_reported_usage_and_is_absent_otherwise() -> None:
    p = play('[[agents.a]]\nusage_tokens = 7100\n[[agents.a]]\ntext = "x"\n').provider("a")
    assert p.complete([], cancel=CancelScope()).usage == Usage(7100, 0)
    assert p.complete([], cancel=CancelScope()).usage is None


def test_window_tokens_comes_from_the_fleet_table() -> None:
    assert make_provider("scripted", scenario=parse_scenario(TRUNK)).window_tokens == 8000
    assert play("").provider("trunk").window_tokens is None


def test_fn_arguments_sends_the_raw_string_which_admission_repairs_to_an_empty_object() -> None:
    p = play('[[agents.a]]\nfn_arguments = "{not json"\n').provider("a")
    m = p.complete([], cancel=CancelScope())
    assert m.stop_reason is StopReason.TOOL_USE
    assert m.tool_calls[0].name == "ral"
    assert m.tool_calls[0].arguments == "{not json"
    assert admit_assistant(m).tool_calls[0].arguments == {}


def test_fn_arguments_replaces_the_arguments_of_every_ral_call_in_the_message() -> None:
    p = play('[[agents.a]]\nral = ["a", "b"]\nfn_arguments = "[1, 2]"\n').provider("a")
    m = p.complete([], cancel=CancelScope())
    assert [c.arguments for c in m.tool_calls] == ["[1, 2]", "[1, 2]"]


def test_stop_max_tokens_is_returned_for_the_driver_to_act_on() -> None:
    p = play('[[agents.a]]\ntext = "partial"\nstop = "max_tokens"\n').provider("a")
    m = p.complete([], cancel=CancelScope())
    assert (m.text, m.stop_reason) == ("partial", StopReason.MAX_TOKENS)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("rate_limit", RateLimited),
        ("transport", TransportError),
        ("truncated", Truncated),
        ("timeout", ProviderTimeout),
        ("malformed", MalformedReply),
    ],
)
def test_an_error_message_fails_that_round_trip_that_way_and_is_consumed(
    kind: str, error: type[Exception]
) -> None:
    p = play(f'[[agents.a]]\ntext = "half"\nerror = "{kind}"\n[[agents.a]]\ntext = "next"\n')
    with pytest.raises(error) as e:
        p.provider("a").complete([], cancel=CancelScope())
    assert "agents.a[0]" in str(e.value)
    assert p.provider("a").complete([], cancel=CancelScope()).text == "next"


def test_a_truncated_error_carries_the_partial_message() -> None:
    p = play('[[agents.a]]\ntext = "half done"\nerror = "truncated"\n').provider("a")
    with pytest.raises(Truncated) as e:
        p.complete([], cancel=CancelScope())
    assert e.value.partial.text == "half done"
    assert e.value.partial.stop_reason is StopReason.MAX_TOKENS
    assert e.value.partial.tool_calls == ()


def test_delay_ms_delays_the_message() -> None:
    p = play('[[agents.a]]\ntext = "late"\ndelay_ms = 120\n').provider("a")
    t0 = time.monotonic()
    assert p.complete([], cancel=CancelScope()).text == "late"
    assert time.monotonic() - t0 >= 0.12


def test_a_cancel_during_delay_ms_raises_cancelled_before_the_delay_ends() -> None:
    p = play('[[agents.a]]\ntext = "never"\ndelay_ms = 30000\n').provider("a")
    scope = CancelScope()
    started = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        started.set()
        try:
            p.complete([], cancel=scope.child())
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    scope.cancel("user interrupt")
    t.join(HANG_GUARD)  # well inside the 30 s delay
    assert not t.is_alive() and isinstance(outcome[0], Cancelled)


def test_an_already_cancelled_scope_consumes_nothing() -> None:
    pb = play('[[agents.a]]\ntext = "kept"\n')
    scope = CancelScope()
    scope.cancel()
    with pytest.raises(Cancelled):
        pb.provider("a").complete([], cancel=scope)
    assert pb.provider("a").complete([], cancel=CancelScope()).text == "kept"


def test_streaming_events_carry_the_text_and_each_tool_call() -> None:
    events: list[StreamEvent] = []
    p = make_provider("scripted", scenario=parse_scenario(TRUNK))
    p.complete([], cancel=CancelScope(), on_event=events.append)
    assert events == [
        TextDelta("Let me look."),
        ToolCallDelta(0, "call_trunk_0_0", "ral", '{"script": "let n = 3"}'),
        ToolCallDelta(1, "call_trunk_0_1", "ral", '{"script": "echo $n"}'),
    ]


def test_two_runs_of_one_scenario_produce_identical_messages(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(TRUNK)

    def run() -> list[object]:
        trunk = make_provider("scripted", scenario=f)
        child = trunk.for_agent("counter")
        return [
            trunk.complete([], cancel=CancelScope()),
            child.complete([], cancel=CancelScope()),
            trunk.complete([], cancel=CancelScope()),
        ]

    assert run() == run()


def test_summarize_is_deterministic_and_keeps_the_first_request_and_last_reply() -> None:
    p = make_provider("scripted", scenario=parse_scenario(TRUNK))
    scope = CancelScope()
    reply = p.complete([UserMessage("Count the files.")], cancel=scope)
    transcript: list[TranscriptItem] = [
        UserMessage("Count the files."),
        reply,
        ToolResult("call_trunk_0_0", "3"),
        ToolResult("call_trunk_0_1", "3"),
    ]
    s1 = p.summarize(transcript, scope)
    assert s1 == p.summarize(transcript, scope)
    assert "First request: Count the files." in s1
    assert "Last reply: Let me look." in s1
    assert "2 tool calls" in s1
    # summarising consumes no scripted message
    assert p.complete([], cancel=scope).tool_calls[0].arguments == {
        "script": "agent counter 'count again'"
    }


def test_a_provider_handle_swap_lands_on_the_next_current_read_only() -> None:
    pb = play('[[agents.a]]\ntext = "A"\n[[agents.b]]\ntext = "B"\n')
    handle = ProviderHandle(pb.provider("a"))
    in_force = handle.current()  # read once at the top of a turn
    previous = handle.swap(pb.provider("b"))
    assert previous is in_force
    assert in_force.complete([], cancel=CancelScope()).text == "A"
    assert handle.current().complete([], cancel=CancelScope()).text == "B"


def test_a_provider_handle_is_safe_under_concurrent_swaps_and_reads() -> None:
    pb = play("")
    providers = [pb.provider(f"p{i}") for i in range(4)]
    handle = ProviderHandle(providers[0])
    seen: set[int] = set()

    def churn(k: int) -> None:
        for i in range(500):
            handle.swap(providers[(i + k) % 4])
            seen.add(id(handle.current()))

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen <= {id(p) for p in providers}


def test_make_provider_refuses_scripted_without_a_scenario_and_unknown_names() -> None:
    from exarch_actors.runtime.providers import UnknownProvider

    with pytest.raises(UnknownProvider, match="needs a scenario"):
        make_provider("scripted")
    with pytest.raises(UnknownProvider, match="expected one of scripted, openai, anthropic"):
        make_provider("gpt")
