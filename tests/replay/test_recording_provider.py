"""The recording provider (runtime/replay/provider.py): what the agent receives is what is
recorded, under the agent's name; failures are recorded and re-raised; a cancelled round-trip
and a compaction summary record nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.providers.base import Provider, TransportError
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.replay.provider import RecordingProvider, recorded
from exarch_actors.runtime.replay.recording import Recorder, RecordingHeader

SCENARIO = """
[[agents.trunk]]
text = "one"
ral = ["agent kid 'go'"]

[[agents.trunk]]
error = "transport"

[[agents.kid]]
ral = ["reply 1"]

[[agents.other]]
text = "from the other script"

[[agents.slow]]
delay_ms = 60000
text = "never"
"""


def _setup(tmp_path: Path) -> tuple[Recorder, Path, ScenarioPlayback]:
    path = tmp_path / "r.toml"
    recorder = Recorder([path], RecordingHeader("scripted", "s", "2024-05-01T10:00:00.000Z"))
    return recorder, path, ScenarioPlayback(parse_scenario(SCENARIO))


def test_each_reply_and_failure_is_recorded_under_the_agent_that_received_it(
    tmp_path: Path,
) -> None:
    recorder, path, playback = _setup(tmp_path)
    trunk = recorded(playback.provider, recorder)("trunk")
    got = trunk.complete([], cancel=CancelScope())
    kid = trunk.for_agent("kid")
    assert kid.complete([], cancel=CancelScope()).tool_calls[0].script == "reply 1"
    with pytest.raises(TransportError):
        trunk.complete([], cancel=CancelScope())
    recorder.close()
    scenario = parse_scenario(path.read_text())
    (first, failed) = scenario.agents["trunk"]
    assert (first.text, first.ral, first.ids) == ("one", ("agent kid 'go'",), ("call_trunk_0_0",))
    assert got.tool_calls[0].id == "call_trunk_0_0"
    assert (failed.error, failed.error_message) == (
        "transport",
        "scripted transport for trunk (agents.trunk[1])",
    )
    assert scenario.agents["kid"][0].ral == ("reply 1",)
    assert "# kid, reply 1 (spawned by trunk)" in path.read_text()


def test_a_model_switch_is_recorded_under_the_agent_and_a_summary_is_not(tmp_path: Path) -> None:
    recorder, path, playback = _setup(tmp_path)
    trunk = recorded(playback.provider, recorder)("trunk")
    swapped = trunk.with_model("other")  # type: ignore[attr-defined]
    assert isinstance(swapped, RecordingProvider)
    assert swapped.complete([], cancel=CancelScope()).text == "from the other script"
    assert "Summary of 0 earlier messages" in trunk.summarize([], CancelScope())
    recorder.close()
    scenario = parse_scenario(path.read_text())
    assert [m.text for m in scenario.agents["trunk"]] == ["from the other script"]
    assert "other" not in scenario.agents


def test_a_cancelled_round_trip_records_nothing(tmp_path: Path) -> None:
    recorder, path, playback = _setup(tmp_path)
    slow = recorded(playback.provider, recorder)("slow")
    scope = CancelScope()
    threading.Timer(0.05, scope.cancel, args=("stop",)).start()
    with pytest.raises(Cancelled):
        slow.complete([], cancel=scope)
    recorder.close()
    assert "agents" not in path.read_text().split("[fleet]", 1)[1]


class _Fixed(Provider):
    name = "fixed"

    def complete(self, *args: object, **kw: object) -> object:  # type: ignore[override]
        raise AssertionError("not called")


def test_a_model_switch_on_a_provider_without_models_is_refused_with_its_name(
    tmp_path: Path,
) -> None:
    recorder, _, _ = _setup(tmp_path)
    wrapped = RecordingProvider(_Fixed(), recorder, "trunk")
    with pytest.raises(ExarchError, match="the fixed provider cannot switch models"):
        wrapped.with_model("m")
    recorder.close()
