"""The agent's one way out: :class:`AgentSite`, everything an agent may ask of the fleet.

An :class:`actors.agent.Agent` never sees the fleet, its registry, bus, journal or
configuration: it holds an ``AgentSite`` and asks it. The interface belongs to the agent's side
(this module imports nothing above ``runtime/`` except for type names), so the fleet depends on
the agent and never the other way round, and an agent can be hosted anywhere that can answer
these calls -- the control process today (:class:`actors.fleet.Fleet` is a site), an agent host
process that forwards the fleet's half over its channel.

Invariants:
- Every argument and result is plain data (names, frozen dataclasses, events, snapshots) except
  a spawn's ``provider`` and the shell handles :meth:`AgentSite.start_shell` returns, which stay
  with whoever hosts the agent. Nothing here hands out a fleet object.
- Calls that decide something for the caller (a spawn, a message, a descendant's cancel) raise
  the typed refusal of the state that refused (``InboxFull``, ``NameUsed``, ``DeskRefusal``...),
  synchronously, to the agent that asked.
- Reads (:meth:`AgentSite.standing`, :meth:`AgentSite.park_reads`) renew nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from decimal import Decimal

    from exarch_actors.actors.eval_root import EvalRoot
    from exarch_actors.actors.shell_workers import WorkerSurfaces
    from exarch_actors.runtime.events import Event, InboxRejected, Notice, Resources
    from exarch_actors.runtime.fleet.fanin import ChildEnd, WaitAnswer
    from exarch_actors.runtime.fleet.inbox import Surface
    from exarch_actors.runtime.mcp.replies import McpRequest
    from exarch_actors.runtime.providers.base import Provider
    from exarch_actors.runtime.providers.prices import PriceTable
    from exarch_actors.runtime.ral.context import DynamicContext
    from exarch_actors.runtime.state.eventlog import LogEvent
    from exarch_actors.runtime.state.session_dir import SessionDir
    from exarch_actors.runtime.state.snapshot import MobileSnapshot


@dataclass(frozen=True)
class ShellOutput:
    """One ral call as the model sees it (already digested)."""

    content: str
    is_error: bool
    notices: tuple[Notice, ...] = ()
    """The call's shell notices (already on the bus): the agent reads LargeBinding and Prune."""
    defined: tuple[str, ...] = ()
    """Session names the call wrote, in order."""


@dataclass(frozen=True)
class ShellParts:
    """An agent's shell as its host started it: the actor proxy, the eval root a cancel trips,
    and the surfaces that carry worker completions to the agent's inbox."""

    eval_root: EvalRoot
    shell: Any
    """The shell actor's pykka proxy (``run``, ``clear``, ``probe``, ``park_workers`` ...)."""
    surfaces: WorkerSurfaces


@dataclass(frozen=True)
class Standing:
    """The registry's word on one agent: still registered, and the terminate-class cause that
    stands against it (cancel cascade, deadline, clear, close), if any."""

    registered: bool
    cancel_cause: str | None = None


@dataclass(frozen=True)
class ParkReads:
    """The registry reads the park verdict needs (``runtime/fleet/park.py``), taken together."""

    listed: bool
    engaged: bool
    live_descendants: bool


@dataclass(frozen=True)
class SpawnRequest:
    """The ``agent NAME PROMPT [memory: BOOL]`` verb, as the parent's desk asks the site.

    ``fork`` is the parent's live scope at the fork point; ``memory`` the parent's
    model-visible context when the child remembers (``None``: it starts with nothing)."""

    parent: str
    name: str
    prompt: str
    fork: MobileSnapshot | None
    provider: Provider
    """The parent's provider at the fork point; the child's is its ``for_agent(name)``."""
    memory: tuple[LogEvent, ...] | None = None


@dataclass(frozen=True)
class BranchRequest:
    """``/branch [NAME]``: a conversing peer of ``parent`` with its shell snapshot and its
    model-visible context; ``name`` ``None`` lets the site choose a free one."""

    parent: str
    name: str | None
    snapshot: MobileSnapshot | None
    context: tuple[LogEvent, ...]
    provider: Provider
    """The parent's provider; the branch's is its ``for_agent`` of the name the site chose."""


class AgentSite(Protocol):
    """What an agent may ask of the fleet (see the module docstring)."""

    @property
    def session(self) -> SessionDir:
        """The run's session directory: the agent's event log, snapshot and scratch live here."""
        ...

    @property
    def disk_warn_bytes(self) -> int | None:
        """The disk-warning ceiling (``--disk-warn``); ``None``: no warning."""
        ...

    # --- the agent's shell ------------------------------------------------------------------

    def start_shell(
        self,
        name: str,
        desk: Any,
        context: DynamicContext | None,
        snapshot: MobileSnapshot | None,
    ) -> ShellParts:
        """Start ``name``'s shell; ``desk`` answers its agent verbs (``actors/desk.py``)."""
        ...

    def run_shell(self, name: str, script: str) -> ShellOutput:
        """One ral call in ``name``'s shell, digested; commits are recorded for the drills."""
        ...

    def resources(self, name: str) -> Resources:
        """The probe fold for ``/resources``: read-only, renews nothing, never model-facing."""
        ...

    # --- money ------------------------------------------------------------------------------

    def prices(self) -> PriceTable:
        """The price table the agent's round trips are costed with (``docs/cost.md``)."""
        ...

    def charge(self, name: str, cost: Decimal | None) -> None:
        """One round trip's cost (``None``: unknown) into the fleet's spend; the round trip that
        brings the spend to ``--budget`` cancels the whole tree, once."""
        ...

    # --- the bus ----------------------------------------------------------------------------

    def publish(self, event: Event) -> None:
        """Put one event on the bus (the transcript and the live views)."""
        ...

    def record_rejected(self, rejection: InboxRejected) -> None:
        """An inbox item no turn will admit: recorded in the transcript, never silently lost."""
        ...

    def before_wait(self) -> None:
        """The drive loop is about to wait (a provider round trip; a shell run waits inside
        :meth:`run_shell`): a site that batches published events sends what is due, so none
        waits behind a round trip of unknown length."""
        ...

    # --- the registry -----------------------------------------------------------------------

    def standing(self, name: str) -> Standing:
        """Whether ``name`` is still registered and what terminate-class cause stands."""
        ...

    def park_reads(self, name: str) -> ParkReads:
        """The registry reads of ``name``'s park verdict."""
        ...

    def generation(self) -> int:
        """The registry's current generation (``/clear`` raises it; results carry theirs)."""
        ...

    def deliver(self, name: str, item: Surface, sender: str) -> None:
        """A surfaced worker completion into ``name``'s inbox: quota-checked, generation-
        guarded, recorded when refused."""
        ...

    def cancel_subtree(self, name: str, cause: str) -> None:
        """Terminate-class cancel of ``name`` and every descendant (the cascade)."""
        ...

    def cancel_descendant(self, name: str, target: str) -> bool:
        """``agent-cancel``: ``target`` must be a descendant of ``name``; an ended one is a
        no-op (False); a live non-descendant is refused."""
        ...

    def cancel_all(self, cause: str) -> None:
        """``/quit``: cancel the whole tree."""
        ...

    def clear_subtree(self, name: str) -> int:
        """``/clear``: reap ``name``'s descendants and return the new generation."""
        ...

    def message(self, sender: str, target: str, text: str) -> None:
        """``message NAME TEXT``: renews nothing; ``InboxFull`` / ``UnknownAgent`` reach the
        sender."""
        ...

    # --- fan-in (actors/fanin_site.py) ------------------------------------------------------

    def wait_children(
        self,
        parent: str,
        wait_id: str,
        names: tuple[str, ...] | None,
        then: Callable[[WaitAnswer | BaseException], None],
    ) -> WaitAnswer | None:
        """``agent-wait``: register a wait of ``parent`` on ``names`` (None: every child whose
        end it has not had). The answer now, or None and ``then`` called once (any thread,
        never blocking) with the answer or the refusal; no thread is held meanwhile."""
        ...

    def stop_wait(self, parent: str, wait_id: str, give_back: bool) -> WaitAnswer | None:
        """End a pending wait early: its partial answer (a timeout), or with ``give_back`` (a
        cancelled caller) what it collected is delivered to the inbox; None once answered."""
        ...

    def give_back(self, parent: str, ends: tuple[ChildEnd, ...]) -> None:
        """Ends an answered wait's caller never took: delivered to ``parent``'s inbox."""
        ...

    def read_result(self, parent: str, child: str) -> tuple[dict[str, Any], int]:
        """``agent-result``: one child's end as a ral map (a held reply is read here), and how
        many replies stay held for ``parent``."""
        ...

    # --- MCP servers (actors/mcp_hub.py) ----------------------------------------------------

    def mcp_begin(self, request: McpRequest, then: Callable[[Any], None]) -> None:
        """``mcp`` / ``mcp-tools``: start one request of an agent on the fleet's server;
        ``then`` gets its ral value or its error once, on any thread, never blocking. A server
        the agent's grants exclude (``NotGranted``) or the fleet lacks is refused at once."""
        ...

    def mcp_cancel(self, agent: str, call_id: str) -> None:
        """Abandon a request at once (its caller was cancelled): the server is told."""
        ...

    # --- the spawn site ---------------------------------------------------------------------

    def spawn(self, request: SpawnRequest) -> dict[str, Any]:
        """Register, admit and launch a returning child; its start receipt."""
        ...

    def branch(self, request: BranchRequest) -> str:
        """Start a conversing peer; the name it got."""
        ...
