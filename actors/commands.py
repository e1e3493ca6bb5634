"""Slash commands, handled at a turn boundary against the agent the drive loop owns.

A slash command arrives as an inbox ``Command`` (or a user line starting with ``/``) and is run
between turns, never mid-turn: ``/model`` therefore lands on the next turn, and ``/clear`` never
races a tool call. None of them starts a model turn.

- ``/clear`` — workers on the old shell cancelled first, then a fresh shell; the event log
  restarted (the old file archived); schedules and pins cleared; the subtree cascaded. Nothing
  from before the clear can come back: the log mirror is empty, the shell is new, and results
  from the cleared generation are dropped by the registry (and recorded).
- ``/compact`` — summarise now if the log allows it (no pending tool results).
- ``/resources`` — the probe fold as one ``Resources`` event; renews nothing, never model-facing.
- ``/model NAME`` — swap this agent's provider handle; lands next turn.
- ``/branch [NAME]`` — a conversing peer with this agent's authority and context.
- ``/close`` — end this agent and its subtree; ``/quit`` — end the whole fleet.

A command that is refused (a typed refusal, an unknown command, ``/model`` without a name,
``/compact`` with results pending) publishes a ``Notice`` of kind :data:`REFUSED`, which the chat
shows on its error line (docs/chat.md), not in the tab; what a command did is a ``SystemNote``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.cancel import Cancelled
from runtime.errors import ExarchError
from runtime.events import Notice, SystemNote

if TYPE_CHECKING:
    from actors.agent import Agent
    from actors.fleet import Fleet


REFUSED = "Refused"
"""The ``Notice.notice`` of a refused slash command."""


COMMANDS = ("/branch", "/clear", "/compact", "/model", "/resources", "/close", "/quit")
"""Every command :func:`run_slash` knows, as the unknown-command refusal lists them."""


def refuse(fleet: Fleet, agent: Agent, text: str) -> None:
    fleet.publish(Notice(agent.name, notice=REFUSED, text=text))


def run_slash(fleet: Fleet, agent: Agent, text: str) -> None:
    """Run one slash command; a typed refusal becomes a refusal notice, never the agent's end."""
    head, _, rest = text.partition(" ")
    try:
        _dispatch(fleet, agent, head, rest.strip())
    except ExarchError as e:
        refuse(fleet, agent, f"{head} refused: {e}")


def _dispatch(fleet: Fleet, agent: Agent, head: str, rest: str) -> None:
    if head == "/clear":
        clear_agent(fleet, agent)
    elif head == "/compact":
        compact_agent(fleet, agent)
    elif head == "/resources":
        fleet.publish(agent.resources())
    elif head == "/model":
        if not rest:
            refuse(fleet, agent, "/model needs a model name")
            return
        provider = fleet.provider_named(rest, agent.name)
        agent.provider.swap(provider)
        fleet.publish(SystemNote(agent.name, text=f"model set to {rest}; lands on the next turn"))
    elif head == "/branch":
        child = fleet.branch(agent, rest or None)
        fleet.publish(SystemNote(agent.name, text=f"branched {child.name}"))
    elif head == "/close":
        fleet.registry.cancel(agent.name, "close")
    elif head == "/quit":
        fleet.cancel_all("quit")
    else:
        refuse(fleet, agent, f"unknown command {head} (known: {' '.join(COMMANDS)})")


def clear_agent(fleet: Fleet, agent: Agent) -> None:
    """``/clear``: see the module docstring for the order and why it matters."""
    generation = fleet.registry.clear_subtree(agent.name)
    agent.schedules.clear()
    agent.forget_before_clear(generation)
    agent.shell.clear().get()
    if agent.log.pending_tool_calls:
        agent.log.settle_pending()
    archive = agent.log.restart()
    fleet.publish(
        Notice(agent.name, notice="Cleared", text="context cleared", data={"archive": str(archive)})
    )


def compact_agent(fleet: Fleet, agent: Agent) -> None:
    if not agent.log.can_compact():
        refuse(fleet, agent, "/compact refused: tool results pending")
        return
    provider = agent.provider.current()
    try:
        reply = provider.summary_reply(
            agent.log.render_transcript(), agent.token, system=agent.system
        )
        agent._count_usage(reply, provider.model)  # a paid round trip: counted and budgeted
        summary = reply.text
    except Cancelled:
        fleet.publish(SystemNote(agent.name, text="/compact interrupted: nothing was dropped"))
        return
    agent.log.apply_compaction(summary)
    fleet.publish(Notice(agent.name, notice="Compacted", text="history compacted on request"))
