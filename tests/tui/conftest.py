"""Drive the chat app headless with textual's own pilot over a real fleet.

Tests are plain sync functions that ``asyncio.run`` a scenario coroutine (no pytest-asyncio).
:func:`chat` builds a real fleet — real shell processes, the scripted provider playing a scenario
written to ``tmp_path`` — runs the app under ``App.run_test`` and always closes the fleet, so the
suite's leak fixture sees every process reaped.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from textual.pilot import Pilot

from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.cli.runner import RunSpec, provider_factory, read_scenario
from exarch_actors.cli.tui.app import ChatApp
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.scenario import Scenario
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import HANG_GUARD

TIMEOUT = 3 * HANG_GUARD
"""Seconds :meth:`Chat.until` waits for a milestone of the chat before calling it hung: a
reply is a whole turn (the provider, a ral call in a shell process, the screen redrawn), not one
prompt operation, and 10 s of it failed on a box at load 100-250. A guard, never a latency
claim: a passing test waits only as long as the milestone takes."""

BRANCH_SCENARIO = """
[[agents.trunk]]
text = "Trunk here."

[[agents."trunk-branch"]]
text = "Branch here, with the trunk's context."
"""
"""One reply for the trunk and one for the branch ``/branch`` makes of it."""


@dataclass
class Chat:
    app: ChatApp
    pilot: Pilot[None]
    fleet: Fleet

    async def until(
        self, cond: Callable[[], Any], timeout: float = TIMEOUT, what: str = ""
    ) -> None:
        """Wait for ``cond`` while the app keeps running; fail with the screen's state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            await self.pilot.pause(0.02)
        tabs = {n: self.app.transcript_text(n) for n in self.app.tabs}
        raise AssertionError(
            f"timed out waiting for {what or cond}; error line {self.app.info_text!r}; tabs {tabs}"
        )

    async def say(self, text: str) -> None:
        """Type ``text`` key by key into the input box and press Enter."""
        await self.pilot.press(*("space" if c == " " else c for c in text), "enter")

    def text(self, name: str = "trunk") -> str:
        return self.app.transcript_text(name)


@asynccontextmanager
async def chat(
    tmp_path: Path,
    toml: str,
    *,
    provider_for: Callable[[Scenario], Callable[[str], Provider]] | None = None,
    quit_window: float = 2.0,
    size: tuple[int, int] = (120, 36),
    agents: Literal["thread", "process"] = "thread",
) -> AsyncIterator[Chat]:
    path = tmp_path / "chat.toml"
    path.write_text(textwrap.dedent(toml))
    scenario = read_scenario(str(path))
    spec = RunSpec(provider="scripted", prompt=None, scenario=scenario)
    factory = provider_for(scenario) if provider_for is not None else provider_factory(spec)
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), factory, FleetConfig(cwd=str(tmp_path), agents=agents)
    )
    app = ChatApp(
        fleet, start=lambda f: f.start_trunk(None, interactive=True), quit_window=quit_window
    )
    try:
        async with app.run_test(size=size) as pilot:
            c = Chat(app, pilot, fleet)
            await c.until(lambda: app.focused_agent == "trunk", what="the trunk's tab")
            yield c
    finally:
        app.control.close_fleet()


def running(c: Chat, name: str) -> bool:
    """Whether ``name``'s shell is running an evaluation, read as the UI reads it: an agent in a
    process of its own through its channel's live figures, one in this process from its eval
    root (False while it is not there yet)."""
    from exarch_actors.actors.agent_process import ProcessAgent

    agent = c.fleet.hosted.get(name)
    if isinstance(agent, ProcessAgent):
        figures = agent.live()
        return figures is not None and figures.running_eval
    local = c.fleet.agents.get(name)
    return local is not None and bool(local.eval_root.busy)


def state(c: Chat, name: str) -> str | None:
    """``name``'s state (``working``, ``idle``, ...), read as :func:`running` reads its eval."""
    from exarch_actors.actors.agent_process import ProcessAgent

    agent = c.fleet.hosted.get(name)
    if isinstance(agent, ProcessAgent):
        figures = agent.live()
        return figures.state if figures is not None else None
    local = c.fleet.agents.get(name)
    return str(local.stats.state) if local is not None else None
