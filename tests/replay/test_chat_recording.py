"""A conversation recorded in the chat UI plays back in the chat UI: each typed message is
answered with the reply the model gave it then."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

from exarch_actors.cli.runner import RunSpec, provider_factory
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.scenario import Scenario, load_scenario
from exarch_actors.runtime.replay.divergence import compare, read_facts
from exarch_actors.runtime.replay.provider import recorded
from exarch_actors.runtime.replay.recording import Recorder, RecordingHeader
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.tui.conftest import chat

CONVERSATION = """
[[agents.trunk]]
text = "Hello! What shall we count?"

[[agents.trunk]]
ral = ["len [1, 2, 3]"]

[[agents.trunk]]
text = "Three items."
"""


@pytest.mark.slow
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_a_chat_recording_answers_the_same_messages_with_the_same_replies(
    tmp_path: Path, agents: Literal["thread", "process"]
) -> None:
    path = tmp_path / "talk.toml"
    header = RecordingHeader("scripted", "demo", "2026-05-01T10:00:00.000Z", interactive=True)
    recorder = Recorder([path], header)

    def recording(scenario: Scenario) -> Callable[[str], Provider]:
        return recorded(provider_factory(RunSpec("scripted", None, scenario)), recorder)

    async def talk(directory: Path, toml: str, wrap: object = None) -> None:
        async with chat(directory, toml, provider_for=wrap, agents=agents) as c:  # type: ignore[arg-type]
            await c.say("hello")
            await c.until(lambda: "What shall we count?" in c.text(), what="the greeting")
            await c.say("count")
            await c.until(lambda: "Three items." in c.text(), what="the count")

    first = tmp_path / "first"
    first.mkdir()
    asyncio.run(talk(first, CONVERSATION, recording))
    recorder.close()
    text = path.read_text()
    assert "play it with `exarch-actors chat THIS.toml`" in text
    assert load_scenario(path).recording == {
        "provider": "scripted",
        "model": "demo",
        "started": "2026-05-01T10:00:00.000Z",
        "interactive": True,
    }
    again = tmp_path / "again"
    again.mkdir()
    asyncio.run(talk(again, text))
    then, now = read_facts(SessionDir(first / "session")), read_facts(SessionDir(again / "session"))
    assert [c.content for c in now.agents["trunk"].calls] == ["[value]\n3"]
    assert compare(then, now).divergences == ()
