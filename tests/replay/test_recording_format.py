"""The recorded form (runtime/replay/recording.py): every reply round-trips through the scenario
reader and the scripted provider, strings survive TOML, and any prefix of a recording reads as a
prefix of its replies."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    Usage,
    admit_assistant,
)
from exarch_actors.runtime.providers.base import (
    ProviderError,
    RateLimited,
    RequestRejected,
    Truncated,
)
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.replay.recording import (
    Recorder,
    RecordingHeader,
    drop_torn_tail,
    render_header,
    reply_block,
    reply_mark,
    toml_string,
)
from tests.agent.conftest import ROOT

HEADER = RecordingHeader(provider="openai", model="m", started="2024-05-01T10:00:00.000Z")

texts = st.text(max_size=40)
json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | texts
arguments = (
    st.builds(lambda s: {"script": s}, texts)
    | st.dictionaries(texts, json_scalars, max_size=3)
    | texts  # raw text that may not be a JSON object
)
calls = st.builds(
    ToolCall,
    st.text("abcxyz_-0189 .", max_size=12),
    st.sampled_from(["ral", "ral", "browse", ""]),
    arguments,
)
messages = st.builds(
    AssistantMessage,
    texts,
    st.lists(calls, max_size=3).map(tuple),
    st.sampled_from(list(StopReason)),
    st.none() | st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**6)),
)
agents = st.sampled_from(["trunk", "kid", "worker-1", "a.b", "naïve"])


def _play(text: str, agent: str, rounds: int = 1) -> list[AssistantMessage]:
    provider = ScenarioPlayback(parse_scenario(text)).provider(agent)
    return [provider.complete([], cancel=CancelScope()) for _ in range(rounds)]


@settings(max_examples=300)
@given(messages, agents)
def test_any_reply_played_back_from_its_block_is_admitted_to_the_same_message(
    msg: AssistantMessage, agent: str
) -> None:
    (played,) = _play(render_header(HEADER) + reply_block(agent, msg), agent)
    assert admit_assistant(played) == admit_assistant(msg)
    plain = all(c.name == "ral" and set(c.arguments) == {"script"} for c in msg.tool_calls)
    if plain and all(isinstance(c.arguments, dict) for c in msg.tool_calls):
        assert played == msg, "a plain ral reply plays back exactly, ids included"


@given(st.text())
def test_a_toml_string_reads_back_as_the_same_text_on_one_line(s: str) -> None:
    rendered = toml_string(s)
    assert "\n" not in rendered and "\r" not in rendered
    assert tomllib.loads(f"k = {rendered}")["k"] == s


def test_a_recorded_failure_fails_the_same_round_trip_with_the_same_kind_and_text() -> None:
    text = render_header(HEADER)
    text += reply_block("trunk", AssistantMessage(), error="rate_limit", error_message="HTTP 429")
    text += reply_block("trunk", AssistantMessage(), error="rejected", error_message="HTTP 401")
    partial = AssistantMessage("half an ans", stop_reason=StopReason.MAX_TOKENS)
    text += reply_block("trunk", partial, error="truncated", error_message="cut")
    text += reply_block("trunk", AssistantMessage(), error="budget", error_message="new kind")
    provider = ScenarioPlayback(parse_scenario(text)).provider("trunk")
    raised: list[ProviderError] = []
    for _ in range(4):
        with pytest.raises(ProviderError) as info:
            provider.complete([], cancel=CancelScope())
        raised.append(info.value)
    assert isinstance(raised[0], RateLimited) and str(raised[0]) == "HTTP 429"
    assert isinstance(raised[1], RequestRejected) and str(raised[1]) == "HTTP 401"
    assert isinstance(raised[2], Truncated) and raised[2].partial.text == "half an ans"
    assert raised[3].kind == "transport" and str(raised[3]) == "new kind"


def test_the_header_carries_the_provider_the_fleet_table_and_the_grant_tables() -> None:
    header = RecordingHeader(
        provider="anthropic",
        model="claude-x",
        started="2024-05-01T10:00:00.000Z",
        prompt='Say "hi"\nthen stop.',
        system="be brief",
        window_tokens=8000,
        grants=(("*", {"exec": ["printf"], "roots": None}), ("worker-*", {"exec": []})),
    )
    scenario = parse_scenario(render_header(header))
    assert scenario.warnings == ()
    assert scenario.recording == {
        "provider": "anthropic",
        "model": "claude-x",
        "started": "2024-05-01T10:00:00.000Z",
    }
    assert (scenario.prompt, scenario.system, scenario.window_tokens) == (
        'Say "hi"\nthen stop.',
        "be brief",
        8000,
    )
    assert [(t.pattern, t.exec, t.roots) for t in scenario.grants] == [
        ("*", ("printf",), None),
        ("worker-*", (), None),
    ]


def _blocks(replies: list[tuple[str, AssistantMessage]]) -> tuple[str, list[tuple[int, int]]]:
    """A whole recording, and each block's (header offset, offset just past its stop line)."""
    text = render_header(HEADER)
    spans: list[tuple[int, int]] = []
    for agent, msg in replies:
        block = reply_block(agent, msg, mark=reply_mark(agent, len(spans) + 1))
        start = len(text) + block.index("[[agents.")
        text += block
        spans.append((start, len(text) - 1))
    return text, spans


@settings(max_examples=200)
@given(st.lists(st.tuples(agents, messages), min_size=1, max_size=5), st.data())
def test_any_prefix_of_a_recording_reads_as_a_prefix_of_its_replies(
    replies: list[tuple[str, AssistantMessage]], data: st.DataObject
) -> None:
    text, spans = _blocks(replies)
    cut = data.draw(st.integers(len(render_header(HEADER)), len(text)), label="cut")
    scenario = parse_scenario(text[:cut])
    whole = [i for i, (_, end) in enumerate(spans) if end <= cut]
    assert whole == list(range(len(whole))), "blocks end in file order"
    expected: dict[str, list[AssistantMessage]] = {}
    for agent, msg in replies[: len(whole)]:
        expected.setdefault(agent, []).append(admit_assistant(msg))
    got = {name: len(entries) for name, entries in scenario.agents.items()}
    assert got == {name: len(msgs) for name, msgs in expected.items()}
    for agent, msgs in expected.items():
        played = _play(text[:cut], agent, len(msgs))
        assert [admit_assistant(m) for m in played] == msgs
    torn = any(start < cut < end for start, end in spans)
    assert any("torn final reply block" in w for w in scenario.warnings) == torn


def test_a_hand_written_scenario_is_never_repaired_only_refused() -> None:
    text = '[fleet]\nprompt = "x"\n[[agents.trunk]]\ntext = "cut sho'
    assert drop_torn_tail(text) == (text, None)


def test_a_block_a_person_added_to_a_recording_is_kept_without_a_stop_line() -> None:
    text = render_header(HEADER) + reply_block(
        "trunk", AssistantMessage("recorded"), mark="trunk, reply 1"
    )
    text += '\n[[agents.trunk]]\nral = ["reply 2"]\n'
    scenario = parse_scenario(text)
    assert scenario.warnings == ()
    assert [m.ral for m in scenario.agents["trunk"]] == [(), ("reply 2",)]


def test_the_recorder_writes_the_same_blocks_to_every_path_and_ignores_replies_after_close(
    tmp_path: Path,
) -> None:
    paths = [tmp_path / "asked.toml", tmp_path / "session" / "recording.toml"]
    recorder = Recorder([*paths, tmp_path / "asked.toml"], HEADER)
    assert recorder.paths == tuple(paths), "one path given twice is written once"
    recorder.spawned("kid", "trunk")
    recorder.reply("trunk", AssistantMessage("hello"))
    recorder.reply("kid", AssistantMessage("", (ToolCall("c1", "ral", {"script": "reply 1"}),)))
    recorder.close()
    recorder.reply("trunk", AssistantMessage("too late"))
    recorder.close()
    first, second = (p.read_text() for p in paths)
    assert first == second
    assert "# trunk, reply 1\n[[agents.trunk]]" in first
    assert "# kid, reply 1 (spawned by trunk)\n[[agents.kid]]" in first
    assert "too late" not in first
    scenario = parse_scenario(first)
    assert [m.text for m in scenario.agents["trunk"]] == ["hello"]
    assert scenario.agents["kid"][0].ids == ("c1",)
    assert recorder.replies == 2


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from exarch_actors.runtime.messages import AssistantMessage
from exarch_actors.runtime.replay.recording import Recorder, RecordingHeader

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
path = Path(sys.argv[1])
recorder = Recorder([path], RecordingHeader("openai", "m", "2024-05-01T10:00:00.000Z"))
recorder.reply("trunk", AssistantMessage("first"))
size = path.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 50, resource.RLIM_INFINITY))
recorder.reply("trunk", AssistantMessage("second " * 20))
recorder.reply("trunk", AssistantMessage("third"))
recorder.close()
print(recorder.error)
"""


def test_a_write_that_fails_stops_the_recording_and_leaves_a_readable_prefix(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.toml"
    p = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("recording stopped after 1 replies: "), p.stdout
    text = path.read_text()
    assert "second" in text and "third" not in text, "the second block was cut mid-write"
    scenario = parse_scenario(text, source="r.toml")
    assert [m.text for m in scenario.agents["trunk"]] == ["first"]
    line = text[: text.index("# trunk, reply 2")].count("\n") + 2
    assert scenario.warnings == (
        f"r.toml:{line}: [[agents.trunk]]: torn final reply block dropped (cut mid-write)",
    )
