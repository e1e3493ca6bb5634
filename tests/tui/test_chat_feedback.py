"""What the chat tells its human about their own actions: the error line and the turn count.

docs/chat.md: the error line shows what went wrong (a rejected slash command, a provider error)
or what just happened (an interrupt, a queued message); the status line counts the agent's
turns. A slash command is run at a turn boundary and starts no model turn.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.tui.conftest import BRANCH_SCENARIO, chat

ONE_REPLY = """
[[agents.trunk]]
text = "Still here."

[[agents.trunk]]
text = "Here again."
"""


@pytest.mark.slow
def test_a_refused_model_switch_and_an_unknown_command_show_on_the_error_line_not_in_the_tab(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, ONE_REPLY) as c:
            await c.say("/model bigger")
            await c.until(lambda: "/model refused" in c.app.error_text, what="the refusal")
            assert "bigger" in c.app.error_text
            await c.say("/frobnicate")
            await c.until(
                lambda: "unknown command /frobnicate" in c.app.error_text, what="the unknown"
            )
            await c.say("/model")
            await c.until(lambda: "needs a model name" in c.app.error_text, what="no name")
            await c.say("hello")
            await c.until(lambda: "Still here." in c.text(), what="the reply")
            shown = c.text()
            assert "refused" not in shown and "frobnicate" not in shown
            assert "needs a model name" not in shown

    asyncio.run(scenario())


@pytest.mark.slow
def test_slash_commands_and_unknown_commands_do_not_count_as_turns(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, ONE_REPLY) as c:
            for line in ("/model bigger", "/frobnicate", "/resources", "/compact"):
                await c.say(line)
            await c.say("hello")  # queued behind the four commands: its reply comes last
            await c.until(lambda: "Still here." in c.text(), what="the reply")
            await c.until(lambda: "turns 1" in c.app.status_line, what="the status line")
            trunk = c.fleet.agents["trunk"]
            assert trunk.stats.turns == 1
            assert trunk.stats.handled == 5

    asyncio.run(scenario())


def test_esc_on_an_idle_agent_says_it_is_idle_and_interrupts_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, ONE_REPLY) as c:
            trunk = c.fleet.agents["trunk"]
            await c.until(lambda: trunk.stats.state == "idle", what="the trunk idle")
            await c.pilot.press("escape")
            await c.until(lambda: "idle" in c.app.info_text, what="the idle note")
            assert "interrupted" not in c.app.info_text
            assert not c.app.error_text
            assert not trunk.token.cancelled
            await c.say("hello")
            await c.until(lambda: "Still here." in c.text(), what="the reply")

    asyncio.run(scenario())


def test_ctrl_c_on_an_idle_agent_says_it_is_idle_and_how_to_quit(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, ONE_REPLY, quit_window=30.0) as c:
            trunk = c.fleet.agents["trunk"]
            await c.until(lambda: trunk.stats.state == "idle", what="the trunk idle")
            await c.pilot.press("ctrl+c")
            await c.until(lambda: "again" in c.app.info_text, what="the quit hint")
            assert "idle" in c.app.info_text and "interrupted" not in c.app.info_text
            assert c.app.is_running and not trunk.token.cancelled

    asyncio.run(scenario())


def test_what_the_error_line_said_leaves_it_at_the_next_line_sent(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, ONE_REPLY) as c:
            await c.pilot.press("escape")
            await c.until(lambda: c.app.info_text != "", what="the Esc line")
            await c.say("hello")
            await c.until(lambda: "Still here." in c.text(), what="the reply")
            assert c.app.info_text == ""

    asyncio.run(scenario())


@pytest.mark.slow
def test_what_the_error_line_said_leaves_it_when_another_tab_is_shown(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, BRANCH_SCENARIO) as c:
            await c.say("/branch")
            await c.until(lambda: c.app.focused_agent == "trunk-branch", what="the branch tab")
            await c.pilot.press("escape")
            await c.until(lambda: "trunk-branch" in c.app.info_text, what="the Esc line")
            await c.pilot.press("ctrl+p")
            assert c.app.focused_agent == "trunk"
            assert c.app.info_text == ""

    asyncio.run(scenario())


def test_an_info_line_fades_on_its_own_and_an_error_does_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, ONE_REPLY) as c:
            c.app.info_secs = 0.3
            shown: list[tuple[str, bool]] = []  # every line, seen even if it fades between polls
            show = c.app._show

            def seen(text: str, *, error: bool) -> None:
                shown.append((text, error))
                show(text, error=error)

            c.app._show = seen  # type: ignore[method-assign]
            await c.pilot.press("escape")
            await c.until(lambda: any(not error for _, error in shown), what="the Esc line")
            await c.until(lambda: c.app.info_text == "", what="the Esc line to fade")
            await c.say("/frobnicate")
            await c.until(lambda: "frobnicate" in c.app.error_text, what="the error")
            await c.pilot.pause(0.6)  # twice the info fade: an error is not an info line
            assert "frobnicate" in c.app.error_text

    asyncio.run(scenario())
