"""The agent's desk: where the agent verbs (docs/language.md) are answered, outside the shell
process.

The shell host asks the desk through an enquiry frame while a run is in flight; the shell actor
calls :meth:`AgentDesk.call` on its own thread. The desk never blocks on the calling agent's own
actor (that thread is the one waiting for the run), only on the registry, the bus and the
journal, so an enquiry cannot deadlock its own turn.

Invariant: :meth:`verbs` is computed from the same construction bits the system prompt is built
from (:func:`runtime.prompt.advertised_verbs`), so the model is shown exactly the verbs this desk
accepts. An agent with no fuel still sees ``agent``; the desk is the wall and refuses it with
``spawn fuel exhausted``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from exarch_actors.actors.agent_site import SpawnRequest
from exarch_actors.actors.desk_mcp import PendingMcp
from exarch_actors.actors.desk_wait import PendingWait, wait_arguments
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.fleet.fanin import is_held_notice
from exarch_actors.runtime.fleet.inbox import AgentResult
from exarch_actors.runtime.mcp.values import VERBS as MCP_VERBS
from exarch_actors.runtime.prompt import advertised_verbs
from exarch_actors.runtime.ral.errors import DeskRefusal
from exarch_actors.runtime.ral.values import UNIT, render

if TYPE_CHECKING:
    from exarch_actors.actors.agent_site import AgentSite
    from exarch_actors.actors.schedules import Schedules
    from exarch_actors.runtime.fleet.inbox import Inbox
    from exarch_actors.runtime.providers.base import ProviderHandle
    from exarch_actors.runtime.state.eventlog import AgentLog
    from exarch_actors.runtime.state.snapshot import MobileSnapshot


SPAWN_OPTIONS = ("memory",)
"""The keys ``agent NAME PROMPT OPTIONS`` accepts in its options map."""


def spawn_memory(options: Any) -> bool:
    """The ``memory`` bit of ``agent``'s options map (``[memory: true]``); a typed refusal for
    anything else, so a misspelt option is an error the model sees, never silently ignored."""
    if not isinstance(options, dict):
        raise DeskRefusal(
            f"agent OPTIONS must be a map such as [memory: true], got {render(options)}"
        )
    unknown = sorted(set(options) - set(SPAWN_OPTIONS))
    if unknown:
        raise DeskRefusal(
            f"agent: unknown option {', '.join(unknown)} (known: {', '.join(SPAWN_OPTIONS)})"
        )
    memory = options.get("memory", False)
    if not isinstance(memory, bool):
        raise DeskRefusal(f"agent: memory must be true or false, got {render(memory)}")
    return memory


def _arity(verb: str, args: list[Any], n: int) -> None:
    if len(args) != n:
        raise DeskRefusal(f"{verb} takes {n} argument{'s' if n != 1 else ''}, got {len(args)}")


class DeskOwner(Protocol):
    """The parts of an agent its verbs touch (:class:`actors.agent.Agent` is one); the fleet's
    half goes through its :class:`actors.agent_site.AgentSite`."""

    name: str
    returns: bool
    site: AgentSite
    log: AgentLog
    provider: ProviderHandle
    schedules: Schedules
    pins: dict[str, str]
    inbox: Inbox
    results_seen: set[str]

    def record_reply(self, value: Any) -> None: ...


_Verb = Callable[["AgentDesk", str, list[Any]], Any]


class AgentDesk:
    """Answers one agent's verbs. Thread-safe: enquiries arrive on the shell actor's thread."""

    def __init__(self, agent: DeskOwner) -> None:
        self._agent = agent
        self._lock = threading.Lock()
        self._verbs = advertised_verbs(returns=agent.returns) | MCP_VERBS

    def verbs(self) -> frozenset[str]:
        return self._verbs

    def deferred_verbs(self) -> frozenset[str]:
        """The verbs answered late (:meth:`begin`): the shell actor's pump holds them."""
        return DEFERRED_VERBS & self._verbs

    def begin(
        self, verb: str, args: list[Any], wake: Callable[[], None]
    ) -> PendingWait | PendingMcp:
        """Start a deferred verb (``agent-wait``, ``mcp``, ``mcp-tools``); ``wake`` is called
        from any thread when its answer is ready (:class:`actors.desk_wait.PendingWait`,
        :class:`actors.desk_mcp.PendingMcp`). A bad argument is refused at once
        (:class:`DeskRefusal`)."""
        if verb not in self.deferred_verbs():
            raise DeskRefusal(f"{verb} is not available to this agent")
        if verb in MCP_VERBS:
            return PendingMcp(self._agent.site, self._agent.name, verb, list(args), wake)
        names, timeout = wait_arguments(list(args))
        return PendingWait(self._agent, names, timeout, wake)

    def call(self, verb: str, args: list[Any], fork: MobileSnapshot | None = None) -> Any:
        """Answer ``verb``. ``fork`` is the parent's live scope at the fork point (the shell host
        sends it with ``agent``), so a child inherits bindings made earlier in the same run."""
        if verb not in self._verbs:
            raise DeskRefusal(f"{verb} is not available to this agent")
        if verb in DEFERRED_VERBS:  # answered late, by the shell actor's pump (begin)
            raise DeskRefusal(f"{verb} is answered only in an agent's shell")
        try:
            with self._lock:
                if verb == "agent":
                    return self._agent_verb(verb, args, fork)
                return _VERBS[verb](self, verb, args)
        except DeskRefusal:
            raise
        except ExarchError as e:
            # Typed refusals already say what state refused (``spawn fuel exhausted: ...``,
            # ``inbox full: ...``, ``name taken: ...``): the ral error carries them verbatim.
            raise DeskRefusal(str(e)) from None

    # --- verbs -----------------------------------------------------------------------------

    def _agent_verb(self, verb: str, args: list[Any], fork: MobileSnapshot | None) -> Any:
        if len(args) not in (2, 3):
            raise DeskRefusal(f"agent takes NAME PROMPT [OPTIONS], got {len(args)} arguments")
        name, prompt = render(args[0]), render(args[1])
        memory = spawn_memory(args[2]) if len(args) == 3 else False
        agent = self._agent
        # The parent's own thread waits for this run, so its log is still: the context a
        # remembering child imports is exactly what the parent has seen so far.
        request = SpawnRequest(
            parent=agent.name,
            name=name,
            prompt=prompt,
            fork=fork,
            provider=agent.provider.current(),
            memory=tuple(agent.log.fork_context()) if memory else None,
        )
        return agent.site.spawn(request)

    def _message(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 2)
        self._agent.site.message(self._agent.name, render(args[0]), render(args[1]))
        return UNIT

    def _agent_cancel(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 1)
        return self._agent.site.cancel_descendant(self._agent.name, render(args[0]))

    def _agent_result(self, verb: str, args: list[Any]) -> Any:
        """One child's end (``[outcome: running]`` while it runs), a held reply included; its
        result queued in the inbox is taken: read here, it is never a turn too."""
        _arity(verb, args, 1)
        child = render(args[0])
        end, held = self._agent.site.read_result(self._agent.name, child)
        if end.get("outcome") != "running":
            self._agent.inbox.take(lambda i: isinstance(i, AgentResult) and i.child == child)
        if not held:  # nothing left to tell
            self._agent.inbox.take(is_held_notice)
        return end

    def _reply(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 1)
        self._agent.record_reply(args[0])
        return UNIT

    def _schedule(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 3)
        sid, seconds, prompt = render(args[0]), args[1], render(args[2])
        if sid.startswith("runtime:"):
            raise DeskRefusal(f"schedule: ids starting with runtime: are reserved, got {sid!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise DeskRefusal("schedule SECONDS must be a non-negative number")
        self._agent.schedules.arm(sid, float(seconds), prompt)
        return UNIT

    def _unschedule(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 1)
        return self._agent.schedules.disarm(render(args[0]))

    def _pin(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 2)
        self._agent.pins[render(args[0])] = render(args[1])
        return UNIT

    def _unpin(self, verb: str, args: list[Any]) -> Any:
        _arity(verb, args, 1)
        return self._agent.pins.pop(render(args[0]), None) is not None


_VERBS: dict[str, _Verb] = {
    "message": AgentDesk._message,
    "agent-cancel": AgentDesk._agent_cancel,
    "agent-result": AgentDesk._agent_result,
    "reply": AgentDesk._reply,
    "schedule": AgentDesk._schedule,
    "unschedule": AgentDesk._unschedule,
    "pin": AgentDesk._pin,
    "unpin": AgentDesk._unpin,
}
"""Every verb answered at once but ``agent`` (which also takes the fork scope), by its ral
name."""

DEFERRED_VERBS = frozenset({"agent-wait"}) | MCP_VERBS
"""The verbs answered late, through :meth:`AgentDesk.begin`."""
