"""The chat app over a fleet whose agents run in processes of their own (``--agents process``).

The same pilot as ``test_chat_app.py`` (whose Esc, /branch, /clear and Ctrl-C tests run on
both backends); what these tests read of an agent they read as the UI does, through its
channel (:meth:`actors.agent_process.ProcessAgent.live`), never from an object in this
process: every agent here lives in another pid.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.agent_process import ProcessAgent
from tests.tui.conftest import Chat, chat


def _ral(c: Chat, name: str, script: str) -> Any:
    return next((e for e in c.app.entries(name) if e.kind == "ral" and e.text == script), None)


def _born_pid(session: Path, name: str) -> int | None:
    """The pid the transcript's ``Born`` record gives ``name``."""
    for line in (session / "transcript.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "Born" and rec.get("agent") == name:
            return int(rec["pid"])
    return None


def test_the_trunk_answers_in_the_chat_from_a_process_other_than_the_ui(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            text = "Let me look."
            ral = ["echo checked"]

            [[agents.trunk]]
            text = "All done."
            """,
            agents="process",
        ) as c:
            trunk = c.fleet.hosted["trunk"]
            assert isinstance(trunk, ProcessAgent)
            assert trunk.pid != os.getpid()
            assert "trunk" not in c.fleet.agents  # no agent object of it in this process
            await c.say("hello there")
            await c.until(lambda: "All done." in c.text(), what="the reply")
            kinds = [(e.kind, e.text) for e in c.app.entries("trunk") if e.key != "hint"]
            assert kinds[0] == ("user", "hello there")
            assert ("assistant", "Let me look.") in kinds
            await c.until(lambda: "scripted:chat" in c.app.status_line, what="the status line")
            assert "inbox 0" in c.app.status_line and "trunk" in c.app.status_line
            assert _born_pid(tmp_path / "session", "trunk") == trunk.pid
            shell = trunk.shell_pid()
            assert shell is not None and shell not in (trunk.pid, os.getpid())

    asyncio.run(scenario())


@pytest.mark.slow
def test_model_and_resources_typed_to_a_process_trunk_run_in_its_process(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            text = "Working."
            ral = ["sleep 1"]

            [[agents.trunk]]
            text = "First turn done."

            [[agents.alt]]
            text = "The alt model speaking."
            """,
            agents="process",
        ) as c:
            await c.say("one")
            await c.until(lambda: _ral(c, "trunk", "sleep 1") is not None, what="the call")
            await c.say("/model alt")
            await c.until(lambda: "First turn done." in c.text())
            await c.until(lambda: "model set to alt" in c.text(), what="the swap note")
            assert "alt model" not in c.text()  # a swap lands on the next turn, never mid-turn
            await c.say("two")
            await c.until(lambda: "The alt model speaking." in c.text(), what="the alt reply")
            await c.until(lambda: "scripted:alt" in c.app.status_line, what="the status line")
            await c.say("/resources")
            await c.until(
                lambda: any(e.kind == "resources" for e in c.app.entries("trunk")),
                what="the card",
            )
            card = next(e for e in c.app.entries("trunk") if e.kind == "resources").text
            assert "resources of trunk" in card

    asyncio.run(scenario())
