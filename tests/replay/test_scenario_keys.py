"""What a recording adds to the scenario format (ids, calls, usage_output_tokens, error_message,
[recording]): each is read, and each malformed one is refused with its position."""

from __future__ import annotations

import pytest

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import ScenarioError
from exarch_actors.runtime.messages import ToolCall, Usage
from exarch_actors.runtime.providers.scenario import ScriptedCall, parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback


def test_ids_calls_and_output_tokens_are_read_and_played() -> None:
    scenario = parse_scenario(
        """
[recording]
provider = "openai"

[[agents.trunk]]
ral = ["echo 1", "echo 2"]
ids = ["call_a", "call_b"]
usage_tokens = 7
usage_output_tokens = 3

[[agents.trunk]]
calls = [
  { id = "x1", name = "browse", arguments = '{"url": "u"}' },
  { name = "ral", arguments = "{oops" },
]
"""
    )
    assert scenario.warnings == ()
    first, second = scenario.agents["trunk"]
    assert first.ids == ("call_a", "call_b") and first.usage_output_tokens == 3
    assert second.calls == (
        ScriptedCall("browse", '{"url": "u"}', "x1"),
        ScriptedCall("ral", "{oops", None),
    )
    provider = ScenarioPlayback(scenario).provider("trunk")
    one = provider.complete([], cancel=CancelScope())
    two = provider.complete([], cancel=CancelScope())
    assert [c.id for c in one.tool_calls] == ["call_a", "call_b"]
    assert one.usage == Usage(7, 3)
    assert two.tool_calls == (
        ToolCall("x1", "browse", '{"url": "u"}'),
        ToolCall("call_trunk_1_1", "ral", "{oops"),
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            'ral = ["a", "b"]\nids = ["only-one"]',
            "s.toml:4: agents.trunk[0].ids: expected 2 ids (one per ral script), got 1",
        ),
        ('ral = ["a"]\nids = "x"', "s.toml:4: agents.trunk[0].ids: expected a list of strings"),
        (
            'ral = ["a"]\ncalls = [{ name = "ral" }]',
            "s.toml:4: agents.trunk[0].calls: a message has ral scripts or calls, not both",
        ),
        (
            "calls = [{ name = 3 }]",
            "s.toml:3: agents.trunk[0].calls[0].name: expected a string, got int 3",
        ),
        (
            'calls = [{ name = "ral", arguments = 5 }]',
            "s.toml:3: agents.trunk[0].calls[0].arguments: expected a string or a table",
        ),
        (
            "usage_output_tokens = -1",
            "s.toml:3: agents.trunk[0].usage_output_tokens: expected a non-negative integer",
        ),
        ("error_message = 1", "s.toml:3: agents.trunk[0].error_message: expected a string"),
    ],
)
def test_a_malformed_recorded_key_is_refused_with_its_position(entry: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(f"\n[[agents.trunk]]\n{entry}\n", source="s.toml")
    assert str(info.value).startswith(message)


def test_an_unknown_key_of_a_call_is_a_warning_and_recording_is_a_known_table() -> None:
    scenario = parse_scenario(
        '[recording]\nmodel = "m"\n[[agents.trunk]]\ncalls = [{ name = "ral", nmae = "x" }]\n',
        source="s.toml",
    )
    assert scenario.warnings == ("s.toml:4: agents.trunk[0].calls[0].nmae: unknown key (ignored)",)
    assert scenario.recording == {"model": "m"}


def test_cache_token_counts_are_recorded_and_played_back_as_they_came() -> None:
    from exarch_actors.runtime.messages import AssistantMessage
    from exarch_actors.runtime.replay.recording import reply_block

    usage = Usage(3000, 12, cache_write_tokens=200, cache_read_tokens=2500)
    block = reply_block("trunk", AssistantMessage("ok", usage=usage))
    assert "usage_cache_write_tokens = 200" in block
    assert "usage_cache_read_tokens = 2500" in block
    played = ScenarioPlayback(parse_scenario(block)).provider("trunk")
    assert played.complete([], cancel=CancelScope()).usage == usage


def test_cache_tokens_beyond_the_prompt_they_are_part_of_are_refused() -> None:
    with pytest.raises(ScenarioError, match="exceed"):
        parse_scenario(
            "[[agents.trunk]]\nusage_tokens = 10\nusage_cache_read_tokens = 11\ntext = 'x'\n"
        )
