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

The agent runs its own slash commands (``Agent`` calls :func:`run_slash` on its thread); what
a command needs of the fleet -- the cascade of ``/clear``, ``/close`` and ``/quit``, the new
peer of ``/branch``, the lease rows of ``/resources`` -- it asks through the agent's
:class:`actors.agent_site.AgentSite`. The route is one way: agent, then this module, then the
site; the fleet never calls in here.

A command that is refused (a typed refusal, an unknown command, ``/model`` without a name,
``/compact`` with results pending) publishes a ``Notice`` of kind :data:`REFUSED`, which the chat
shows on its error line (docs/chat.md), not in the tab; what a command did is a ``SystemNote``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from exarch_actors.actors.agent_site import BranchRequest
from exarch_actors.runtime.cancel import Cancelled
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.events import Notice, SystemNote
from exarch_actors.runtime.observe.round_trip import RoundTrip
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.ral.errors import DeskRefusal

if TYPE_CHECKING:
    from exarch_actors.actors.agent_site import AgentSite
    from exarch_actors.actors.schedules import Schedules
    from exarch_actors.runtime.cancel import CancelScope
    from exarch_actors.runtime.messages import AssistantMessage
    from exarch_actors.runtime.providers.base import ProviderHandle
    from exarch_actors.runtime.state.eventlog import AgentLog


REFUSED = "Refused"
"""The ``Notice.notice`` of a refused slash command."""


class SlashAgent(Protocol):
    """The parts of an agent its slash commands touch (:class:`actors.agent.Agent` is one)."""

    name: str
    site: AgentSite
    log: AgentLog
    provider: ProviderHandle
    schedules: Schedules
    turn: CancelScope
    system: str | None
    shell: Any

    def forget_before_clear(self, generation: int) -> None: ...

    def count_usage(
        self, msg: AssistantMessage, provider: Provider, trip: RoundTrip, operation: str = ...
    ) -> None: ...


def refuse(agent: SlashAgent, text: str) -> None:
    agent.site.publish(Notice(agent.name, notice=REFUSED, text=text))


def _note(agent: SlashAgent, text: str) -> None:
    agent.site.publish(SystemNote(agent.name, text=text))


def run_slash(agent: SlashAgent, text: str) -> None:
    """Run one slash command; a typed refusal becomes a refusal notice, never the agent's end."""
    head, _, rest = text.partition(" ")
    command = _COMMANDS.get(head)
    if command is None:
        refuse(agent, f"unknown command {head} (known: {' '.join(COMMANDS)})")
        return
    try:
        command(agent, rest.strip())
    except ExarchError as e:
        refuse(agent, f"{head} refused: {e}")


def clear_agent(agent: SlashAgent, rest: str = "") -> None:
    """``/clear``: see the module docstring for the order and why it matters."""
    generation = agent.site.clear_subtree(agent.name)
    agent.schedules.clear()
    agent.forget_before_clear(generation)
    agent.shell.clear().get()
    if agent.log.pending_tool_calls:
        agent.log.settle_pending()
    archive = agent.log.restart()
    agent.site.publish(
        Notice(agent.name, notice="Cleared", text="context cleared", data={"archive": str(archive)})
    )


def compact_agent(agent: SlashAgent, rest: str = "") -> None:
    if not agent.log.can_compact():
        refuse(agent, "/compact refused: tool results pending")
        return
    provider = agent.provider.current()
    try:
        trip = RoundTrip()
        reply = provider.summary_reply(
            agent.log.render_transcript(), agent.turn, system=agent.system
        )
        agent.count_usage(reply, provider, trip, "summary")  # paid: counted and budgeted
        summary = reply.text
    except Cancelled:
        _note(agent, "/compact interrupted: nothing was dropped")
        return
    agent.log.apply_compaction(summary)
    agent.site.publish(Notice(agent.name, notice="Compacted", text="history compacted on request"))


def _resources(agent: SlashAgent, rest: str) -> None:
    agent.site.publish(agent.site.resources(agent.name))


def _model(agent: SlashAgent, rest: str) -> None:
    """``/model NAME``: the same provider kind with another model; lands next turn."""
    if not rest:
        refuse(agent, "/model needs a model name")
        return
    agent.provider.swap(provider_named(agent.provider.current(), rest))
    _note(agent, f"model set to {rest}; lands on the next turn")


def provider_named(current: Provider, model: str) -> Provider:
    """``current``'s kind with another model, or a typed refusal when it cannot switch."""
    swap = getattr(current, "with_model", None)
    if callable(swap):
        new = swap(model)
        assert isinstance(new, Provider)
        return new
    raise DeskRefusal(f"/model: the {current.name} provider cannot switch models")


def _branch(agent: SlashAgent, rest: str) -> None:
    """``/branch [NAME]``: runs on the agent's own thread, so its log and shell are still."""
    request = BranchRequest(
        parent=agent.name,
        name=rest or None,
        snapshot=agent.shell.fork_snapshot().get(timeout=10.0),
        context=tuple(agent.log.fork_context()),
        provider=agent.provider.current(),
    )
    _note(agent, f"branched {agent.site.branch(request)}")


def _close(agent: SlashAgent, rest: str) -> None:
    agent.site.cancel_subtree(agent.name, "close")


def _quit(agent: SlashAgent, rest: str) -> None:
    agent.site.cancel_all("quit")


_COMMANDS: dict[str, Callable[[SlashAgent, str], None]] = {
    "/branch": _branch,
    "/clear": clear_agent,
    "/compact": compact_agent,
    "/model": _model,
    "/resources": _resources,
    "/close": _close,
    "/quit": _quit,
}

COMMANDS = tuple(_COMMANDS)
"""Every command :func:`run_slash` knows, as the unknown-command refusal lists them."""
