"""The chat app driven headless by textual's pilot over a real fleet (scripted provider)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import InboxFull
from exarch_actors.runtime.fleet.inbox import Command
from exarch_actors.runtime.messages import AssistantMessage, TranscriptItem
from exarch_actors.runtime.providers.base import RAL_TOOL, OnEvent, Provider, ToolSpec
from exarch_actors.runtime.providers.scenario import Scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback, ScriptedProvider
from tests.support.waiting import pid_alive
from tests.tui.conftest import BRANCH_SCENARIO, Chat, chat, running, state


def _ral(c: Chat, name: str, script: str) -> Any:
    return next((e for e in c.app.entries(name) if e.kind == "ral" and e.text == script), None)


def test_a_typed_prompt_reaches_the_trunk_and_its_scripted_reply_and_ral_call_appear(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [fleet]
            prompt = "never sent without --send-prompt"

            [[agents.trunk]]
            text = "Let me look."
            ral = ["echo checked"]

            [[agents.trunk]]
            text = "All done: checked."
            """,
        ) as c:
            await c.say("hello there")
            await c.until(lambda: "All done: checked." in c.text(), what="the reply")
            kinds = [(e.kind, e.text) for e in c.app.entries("trunk") if e.key != "hint"]
            assert kinds[0] == ("user", "hello there")
            assert ("assistant", "Let me look.") in kinds
            call = _ral(c, "trunk", "echo checked")
            assert call is not None and call.result is not None and "checked" in call.result
            assert "never sent" not in c.text()
            # the status line is redrawn on its own tick: one drawn before the turn took the
            # prompt still shows it queued ("inbox 1 ... turns 0"; seen on a quiet box)
            await c.until(
                lambda: "scripted:chat" in c.app.status_line and "turns 1" in c.app.status_line,
                what="the status line after the turn",
            )
            assert "inbox 0" in c.app.status_line and "trunk" in c.app.status_line

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_branch_opens_a_focused_conversing_tab_that_answers_in_its_own_tab(
    tmp_path: Path, agents: Literal["thread", "process"]
) -> None:
    """Under ``--agents process`` the branch answers from a process of its own, neither the
    trunk's nor the UI's."""

    async def scenario() -> None:
        async with chat(tmp_path, BRANCH_SCENARIO, agents=agents) as c:
            await c.say("first")
            await c.until(lambda: "Trunk here." in c.text())
            await c.say("/branch")
            await c.until(lambda: c.app.focused_agent == "trunk-branch", what="the branch tab")
            assert c.app.tabs["trunk-branch"].role == "branch"
            await c.say("and you?")
            await c.until(lambda: "Branch here" in c.text("trunk-branch"), what="the branch")
            inherited = [e.text for e in c.app.entries("trunk-branch") if e.inherited]
            assert "first" in inherited and "Trunk here." in inherited
            own = [e.text for e in c.app.entries("trunk-branch") if not e.inherited]
            assert "and you?" in own
            assert "and you?" not in c.text("trunk") and "Branch here" not in c.text("trunk")
            assert c.fleet.registry.is_live("trunk-branch")
            if agents == "process":
                branch, trunk = c.fleet.hosted["trunk-branch"], c.fleet.hosted["trunk"]
                assert isinstance(branch, ProcessAgent) and isinstance(trunk, ProcessAgent)
                assert len({branch.pid, trunk.pid, os.getpid()}) == 3

    asyncio.run(scenario())


ESC_SCENARIO = """
[[agents.trunk]]
text = "A helper first, then a long wait."
ral = ["agent helper 'work a while, then reply'", "sleep 30"]

[[agents.helper]]
ral = ["sleep 20"]
"""


@pytest.mark.slow
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_esc_during_a_long_sleep_cancels_the_turn_while_an_earlier_sub_agent_keeps_running(
    tmp_path: Path, agents: Literal["thread", "process"]
) -> None:
    """Under ``--agents process`` the Esc reaches the trunk's own process, and what is read of
    the agents is read through their channels."""

    async def scenario() -> None:
        async with chat(tmp_path, ESC_SCENARIO, agents=agents) as c:
            await c.say("go")
            await c.until(lambda: _ral(c, "trunk", "sleep 30") is not None, what="the sleep")
            await c.until(lambda: _ral(c, "helper", "sleep 20") is not None, what="helper")
            await c.until(lambda: running(c, "trunk"), what="the run")
            assert _ral(c, "trunk", "sleep 30").result is None
            await c.pilot.press("escape")
            await c.until(lambda: _ral(c, "trunk", "sleep 30").result is not None, what="stop")
            assert "cancelled" in _ral(c, "trunk", "sleep 30").result
            await c.until(lambda: state(c, "trunk") == "idle", what="the trunk idle")
            # the sub-agent spawned before the Esc is untouched and still working
            assert c.fleet.registry.is_live("helper")
            assert state(c, "helper") == "working"
            assert _ral(c, "helper", "sleep 20").result is None
            assert "helper" not in c.app.ended and c.app.tabs["helper"].role == "sub"
            if agents == "process":
                return
            # its tab is read-only: a typed line is refused on the error line, nothing sent
            await c.pilot.press("ctrl+n")
            assert c.app.focused_agent == "helper"
            before = c.fleet.agents["helper"].inbox.depths()
            await c.say("hello helper")
            assert "read-only" in c.app.error_text
            assert c.fleet.agents["helper"].inbox.depths() == before

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_clear_empties_the_tab_and_nothing_from_before_returns(
    tmp_path: Path, agents: Literal["thread", "process"]
) -> None:
    """Nothing from before returns: not in the tab, not in the shell, not in what the agent
    keeps (its context in this process, or its event log under ``--agents process``)."""

    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            text = "Remembering alpha."
            ral = ["let secret = 'alpha-42'; echo stored"]

            [[agents.trunk]]
            text = "Stored alpha."

            [[agents.trunk]]
            text = "Checking what I remember."
            ral = ["echo $secret"]

            [[agents.trunk]]
            text = "Nothing remembered."
            """,
            agents=agents,
        ) as c:
            await c.say("remember alpha")
            await c.until(lambda: "Stored alpha." in c.text())
            await c.say("/clear")
            await c.until(lambda: "context cleared" in c.text(), what="the clear")
            assert "alpha" not in c.text()
            await c.say("what do you remember?")
            await c.until(lambda: "Nothing remembered." in c.text())
            assert "alpha" not in c.text()
            echo = _ral(c, "trunk", "echo $secret")
            assert echo is not None and echo.is_error and "secret" in echo.result
            if agents == "thread":
                context = c.fleet.agents["trunk"].log.render_transcript()
                assert not any("alpha" in str(m) for m in context)
            else:
                log = (tmp_path / "session" / "agents" / "trunk" / "events.jsonl").read_text()
                assert "alpha" not in log

    asyncio.run(scenario())


@pytest.mark.slow
def test_resources_shows_the_card_and_neither_it_nor_tab_focus_renews_anything(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            text = "Starting a helper."
            ral = ["agent helper 'wait'"]

            [[agents.trunk]]
            text = "Helper started."

            [[agents.helper]]
            ral = ["sleep 20"]
            """,
        ) as c:
            await c.say("start")
            await c.until(lambda: "Helper started." in c.text())
            await c.until(lambda: "helper" in c.app.tabs, what="the helper's tab")
            tree = c.fleet.registry.tree
            before = {n: tree.get(n).last_exchange for n in ("trunk", "helper")}
            entry = c.fleet.registry.lookup("helper")
            assert entry is not None and entry.lease is not None
            lease = entry.lease
            assert lease is not None
            lease_before = lease.last_exchange
            await c.say("/resources")
            await c.until(
                lambda: any(e.kind == "resources" for e in c.app.entries("trunk")),
                what="the card",
            )
            card = next(e for e in c.app.entries("trunk") if e.kind == "resources").text
            assert "resources of trunk" in card and "ui.tabs" in card
            for _ in range(4):  # focus every tab and back: presentation only
                await c.pilot.press("ctrl+n")
            await c.pilot.press("ctrl+p", "ctrl+p")
            assert {n: tree.get(n).last_exchange for n in ("trunk", "helper")} == before
            entry = c.fleet.registry.lookup("helper")
            assert entry is not None and entry.lease is not None
            assert entry.lease.last_exchange == lease_before
            assert not c.fleet.registry.engaged("helper")

    asyncio.run(scenario())


class _Swappable(ScriptedProvider):
    """The scripted provider plus ``with_model``; records which model served each round-trip."""

    def __init__(self, playback: ScenarioPlayback, name: str, served: list[tuple[str, str]]):
        super().__init__(playback, name)
        self.served = served

    def with_model(self, model: str) -> _Swappable:
        p = _Swappable(self.playback, self.agent_name, self.served)
        p.model = model
        return p

    def for_agent(self, agent_name: str) -> _Swappable:
        return _Swappable(self.playback, agent_name, self.served)

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        self.served.append((self.agent_name, self.model))
        return super().complete(
            transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
        )


@pytest.mark.slow
def test_model_swap_typed_mid_turn_lands_on_the_next_turn_never_mid_turn(tmp_path: Path) -> None:
    served: list[tuple[str, str]] = []

    def provider_for(scenario: Scenario) -> Callable[[str], Provider]:
        playback = ScenarioPlayback(scenario)
        return lambda name: _Swappable(playback, name, served)

    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            text = "Working."
            ral = ["sleep 1"]

            [[agents.trunk]]
            text = "First turn done."

            [[agents.trunk]]
            text = "Second turn."
            """,
            provider_for=provider_for,
        ) as c:
            await c.say("one")
            await c.until(lambda: _ral(c, "trunk", "sleep 1") is not None, what="the call")
            await c.say("/model big-model")
            await c.until(lambda: "First turn done." in c.text())
            await c.until(lambda: "model set to big-model" in c.text(), what="the swap note")
            assert served == [("trunk", "chat"), ("trunk", "chat")]
            await c.say("two")
            await c.until(lambda: "Second turn." in c.text())
            assert served[-1] == ("trunk", "big-model")
            await c.until(lambda: "big-model" in c.app.status_line, what="the status line")

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_slash_command_rejected_by_a_full_inbox_shows_on_the_error_line(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            ral = ["sleep 30"]
            """,
        ) as c:
            await c.say("go")
            await c.until(lambda: _ral(c, "trunk", "sleep 30") is not None)
            trunk_entry = c.fleet.registry.lookup("trunk")
            assert trunk_entry is not None
            inbox = trunk_entry.inbox
            queued = 0
            try:
                while queued < 1000:
                    inbox.push(Command("/resources"))
                    queued += 1
            except InboxFull:
                pass
            assert queued == 64
            await c.say("/compact")
            await c.until(lambda: "/compact rejected" in c.app.error_text, what="the rejection")
            assert "full" in c.app.error_text
            assert inbox.depths()["command"] == 64

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_ctrl_c_once_interrupts_and_twice_quits_leaving_no_process(
    tmp_path: Path, agents: Literal["thread", "process"]
) -> None:
    """Under ``--agents process`` no agent process or shell is left either."""
    before = _descendants()
    started: set[int] = set()

    async def scenario() -> None:
        async with chat(
            tmp_path,
            """
            [[agents.trunk]]
            text = "A helper, then a long wait."
            ral = ["agent helper 'wait'", "sleep 30"]

            [[agents.helper]]
            ral = ["sleep 30"]
            """,
            quit_window=0.5,
            agents=agents,
        ) as c:
            await c.say("go")
            await c.until(lambda: _ral(c, "helper", "sleep 30") is not None)
            await c.until(lambda: _ral(c, "trunk", "sleep 30") is not None)
            await c.until(lambda: running(c, "trunk") and running(c, "helper"), what="the runs")
            started.update(_descendants() - before)
            await c.pilot.press("ctrl+c")
            await c.until(lambda: _ral(c, "trunk", "sleep 30").result is not None)
            await asyncio.sleep(0.6)  # past the quit window: the next Ctrl-C is a first one
            assert c.app.is_running and c.fleet.registry.is_live("helper")
            await c.pilot.press("ctrl+c")
            await c.pilot.press("ctrl+c")
            await c.until(lambda: not c.app.is_running, what="the app to exit")
            assert c.app.control.closed
            assert c.fleet.registry.is_empty()

    asyncio.run(scenario())
    # the trunk's and the helper's shell hosts, and under process their two agent processes
    assert len(started) >= (2 if agents == "thread" else 4)
    assert not [p for p in started if pid_alive(p)]


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


HIDDEN_TAB = """
[[agents.trunk]]
text = "Starting a helper."
ral = ["agent helper 'count the lines'"]

[[agents.trunk]]
text = "Started."

[[agents.trunk]]
text = "The helper is done.\\nline 1\\nline 2\\nline 3\\nline 4\\nline 5\\nline 6\\nThe last line."

[[agents.helper]]
ral = ["sleep 1", "reply 'counted'"]
"""


@pytest.mark.slow
def test_a_tab_hidden_while_its_agent_answers_shows_the_end_of_the_answer_when_shown_again(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, HIDDEN_TAB, size=(100, 24)) as c:
            await c.say("go")
            await c.until(lambda: "Started." in c.text() and "helper" in c.app.tabs)
            view = c.app.views["trunk"]
            await c.pilot.press("ctrl+n")
            assert c.app.focused_agent == "helper"
            await c.until(lambda: "The last line." in c.text(), what="the answer")
            await c.pilot.pause(0.3)  # every refresh after the answer runs while it is hidden
            await c.pilot.press("ctrl+p")
            await c.pilot.pause(0.3)  # the tab laid out again at its new size
            await c.until(lambda: view.max_scroll_y > 0, what="the trunk's tab to overflow")
            await c.until(lambda: view.scroll_y == view.max_scroll_y, what="the end in view")

    asyncio.run(scenario())


def test_a_sub_agents_tab_shows_its_task_as_given_by_its_parent_not_by_you(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with chat(tmp_path, HIDDEN_TAB) as c:
            await c.say("go")
            await c.until(
                lambda: any(e.kind == "user" for e in c.app.entries("helper")), what="the task"
            )
            task = next(e for e in c.app.entries("helper") if e.kind == "user")
            assert (task.text, task.speaker) == ("count the lines", "trunk")
            mine = next(e for e in c.app.entries("trunk") if e.kind == "user")
            assert (mine.text, mine.speaker) == ("go", None)

    asyncio.run(scenario())
