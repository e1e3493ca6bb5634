"""The agent node and its drive loop (docs/architecture.md, One turn, end to end).

An :class:`Agent` is the uniform node of a run: its event log, its persistent shell (a
:class:`actors.shell.ShellActor` owning one OS process), its quota inbox, its cancel scope (and
its current turn's, a child of it), its own hot-swappable provider handle, its pins and
schedules. There is no ``is_root``: every distinction is read from position (``parent``),
``interactive`` and the construction-fixed ``returns`` bit.

Three nested loops, the same for trunk and child:

- **drive** — the lifetime: pull the next turn from the inbox with the park verdict
  re-evaluated on every wake (an exit signal on its control lane first, ahead of every queued
  turn: the agent ends cancelled); a genuine turn boundary resets the nudge latches and gives
  the turn a fresh scope (a self-nudge does neither); ``reply`` ends a returning agent after its
  batch; the single exit settles any pending tool call so the log is always ready for the next
  user message, and records every inbox item no turn admitted.
- **apply** — provider round-trips: the provider is read once per *turn*, self-nudges included
  (a swap or ``/model`` lands next turn, never mid-turn); the disk warning and compaction are
  checked before every request; every reply is admitted (X2/X7) before it is committed;
  MaxTokens without a tool call appends the partial and ends the loop as truncated (a continue
  nudge follows), with tool calls it dispatches them; MAX_STEPS (250) bounds the whole turn
  across self-nudges and ends it Capped, which no nudge re-drives.
- **dispatch** — the tool-call batch in order, every id answered exactly once (an unknown tool
  or a call without a ``script`` is answered with an error, and the transcript's Io records the
  same text); then steering that arrived mid-turn is appended after the complete batch.

Reply rules: a headless trunk's first reply is turned back once for self-verification (the
reply is no longer standing, so the next tool batch does not end the loop on it); the second is
honoured; if the trunk ends without replying again, the first stands. ``--chat`` has no tool and
so no ``reply``: a headless chat trunk's answer is the text of its final message.

The drive loop runs on the agent actor's own thread as one long message. Its turn input and
its cancels arrive through :attr:`Agent.inbox`, the same inbox rule, pushed synchronously by
producers so a rejection reaches its sender; a cancel is an exit signal on that inbox's
control lane, whose arrival trips :attr:`Agent.token` in the sender's thread (the registry's
hop, ``runtime/fleet/registry.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pykka

from exarch_actors.actors.agent_site import AgentSite
from exarch_actors.actors.desk import AgentDesk
from exarch_actors.actors.schedules import Schedules
from exarch_actors.actors.slash_commands import run_slash
from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.constants import MAX_STEPS
from exarch_actors.runtime.events import InboxRejected, Io, Notice, ProviderFailed, SystemNote
from exarch_actors.runtime.fleet.compaction import compaction_due
from exarch_actors.runtime.fleet.digest import Section, clip_agent_reply, clip_section
from exarch_actors.runtime.fleet.diskwarn import DiskWarn
from exarch_actors.runtime.fleet.fanin import is_held_notice
from exarch_actors.runtime.fleet.inbox import (
    SURFACE,
    AgentMessage,
    AgentResult,
    Command,
    ExitSignal,
    InboxNudge,
    ScheduledWakeup,
    Surface,
    UserSteering,
)
from exarch_actors.runtime.fleet.nudge import (
    NudgeInputs,
    NudgeKind,
    NudgeLatches,
    Outcome,
    ResidencyLatch,
    Verdict,
    classify,
    decide,
    waiting_matters,
)
from exarch_actors.runtime.fleet.park import Construction, ParkMode, park_mode, returns_for
from exarch_actors.runtime.messages import AssistantMessage, ToolCall, ToolResult, admit_with_report
from exarch_actors.runtime.observe.round_trip import RoundTrip
from exarch_actors.runtime.prompt import build_system_prompt
from exarch_actors.runtime.providers.base import (
    RAL_TOOL,
    Provider,
    ProviderError,
    ProviderHandle,
    Truncated,
)
from exarch_actors.runtime.ral.values import render
from exarch_actors.runtime.settlement.cost import SpendMeter
from exarch_actors.runtime.shell.confinement import confined_line
from exarch_actors.runtime.shell.ledger import LargeBinding
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.eventlog import AgentLog, reply_fields

if TYPE_CHECKING:
    from exarch_actors.actors.agent_site import ShellOutput
    from exarch_actors.runtime.fleet.inbox import Inbox
    from exarch_actors.runtime.ral.context import DynamicContext
    from exarch_actors.runtime.state.snapshot import MobileSnapshot


log = logging.getLogger(__name__)

_RUN_POLL = 0.05
"""Seconds between interrupt re-sends while a run is in flight: half the 100 ms cancel bound."""


class AgentOutcome(StrEnum):
    """How an agent's drive ended (the run's outcome is the trunk's)."""

    REPLIED = "replied"
    QUIESCED = "quiesced"
    CAPPED = "capped"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True)
class AgentSpec:
    """Everything fixed at construction."""

    name: str
    parent: str | None = None
    construction: Construction = Construction.TRUNK
    interactive: bool = False
    fuel: int = 0
    prompt: str | None = None
    chat: bool = False
    system: str | None = None
    context: DynamicContext | None = None
    snapshot: MobileSnapshot | None = None
    generation: int = 0
    resume: bool = False
    """Rebuild from the durable files (event log) instead of starting fresh (``resume``)."""
    mcp: str | None = None
    """The system prompt's lines on the MCP servers this agent may use (the fleet's, decided
    with its grants: ``runtime/mcp/values.py``'s ``prompt_section``); None: none."""


@dataclass
class AgentStats:
    """Figures the fleet view and fleetYield read; written only by the agent's own thread."""

    turns: int = 0
    """Model turns: inbox items that reached the model (a slash command never does)."""
    handled: int = 0
    """Inbox items taken at a turn boundary: model turns, slash commands, dropped stale results."""
    steps: int = 0
    ral_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tokens_known: bool = False
    spend: SpendMeter = field(default_factory=SpendMeter)
    """Tokens by kind and cost in money, per round trip at its model's price."""
    state: str = "starting"
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    end_reason: str | None = None
    """Why the agent ended without a reply, when no cancel says it (a provider failure, the
    step cap, a bug): what its parent's ``agent-wait`` reports as ``reason``."""


class Agent:
    """One node of the spawn tree, built by whoever hosts it (:class:`actors.fleet.Fleet`).

    Everything it asks of the fleet goes through ``site`` (:class:`actors.agent_site.AgentSite`);
    ``token`` and ``inbox`` are the registry's handles on it."""

    def __init__(
        self,
        site: AgentSite,
        spec: AgentSpec,
        provider: Provider,
        token: CancelScope,
        inbox: Inbox,
    ) -> None:
        self.site = site
        self.spec = spec
        self.name = spec.name
        self.parent = spec.parent
        self.interactive = spec.interactive
        self.returns = returns_for(spec.construction, interactive=spec.interactive)
        self.fuel = spec.fuel
        self.token: CancelScope = token
        """The agent's scope for its whole life (the registry's handle): tripped only by a
        cancel, which ends the agent; it stays cancelled."""
        self.turn: CancelScope = token.child()
        """The current turn's scope, a child of :attr:`token`: an interrupt (Esc) trips it,
        and the next genuine turn boundary replaces it with a fresh one (a cancelled scope
        stays cancelled)."""
        self.inbox: Inbox = inbox
        """The registry's handle too: producers push here and get InboxFull synchronously."""
        events = site.session.events(spec.name)
        self.log = AgentLog.load(events)[0] if spec.resume else AgentLog(events)
        self.logged_reply: Any = None
        """A rebuilt agent's reply, read from its log (:meth:`AgentLog.logged_reply`): it had
        replied, and its drive ends ``replied`` with it at once, no model turn (the record that
        carried the value may never have been written: a child's settlement or a trunk's
        ``result.json``, refused by a full disk, or the control process or the agent's own
        died first). None for a fresh agent. A headless trunk's reply counts only once it was
        verified (after its ``self_verify`` nudge): a control kill between the trunk's final
        reply and ``result.json`` resumed to ``quiesced`` before (1 of 25 random kills of
        examples/chain.toml)."""
        if spec.resume and spec.parent is not None and self.returns:
            self.logged_reply = self.log.logged_reply()
        elif spec.resume and spec.parent is None and not spec.interactive:
            self.logged_reply = self.log.logged_reply(final_after=NudgeKind.SELF_VERIFY.value)
        self.provider = ProviderHandle(provider)
        self.pins: dict[str, str] = {}
        self.schedules = Schedules(self.inbox.push)
        self.latches = NudgeLatches()
        self._suspended: Outcome | None = None
        """The outcome of the last turn whose nudge verdict was ``SUSPENDED`` (children or
        workers still live), until the next turn: :meth:`_resume_suspended` decides again once
        they settled without bringing this agent an inbox item."""
        self.residency = ResidencyLatch()
        self._residency_due: list[InboxNudge] = []
        """Residency nudges of the running batch, posted after it (the log awaits results)."""
        self.stats = AgentStats()
        self._trip = RoundTrip()
        """The provider round trip in flight (or the last one): its stream events count on it."""
        self.outcome: AgentOutcome | None = None
        self._ended_cause: str | None = None
        self.reply_value: Any = None
        self._replied = False
        self._reply_count = 0
        self._provisional: tuple[Any] | None = None
        """A headless trunk's first reply, turned back for self-verification; it stands if the
        agent ends without replying again (nothing the model delivered is lost)."""
        self._reply_lock = threading.Lock()
        self._generation_floor = 0
        self.results_seen: set[str] = set()
        """Children whose result this agent admitted as a turn: ``agent-wait`` with no name
        leaves them out (it returns only ends the agent has not had yet)."""
        self.desk = AgentDesk(self)
        self.disk_warn = DiskWarn(
            site.disk_warn_bytes,
            [site.session.root, site.session.scratch(spec.name)],
        )
        self.system = (
            None
            if spec.chat
            else spec.system
            or build_system_prompt(
                self.desk.verbs(),
                spec.name,
                self.returns,
                spec.fuel,
                chat=spec.chat,
                sandbox=confined_line(spec.context.sandbox if spec.context else None),
                mcp=spec.mcp,
            )
        )
        parts = site.start_shell(spec.name, self.desk, spec.context, spec.snapshot)
        self.eval_root, self.shell, self.surfaces = parts.eval_root, parts.shell, parts.surfaces
        self._last_pid: int | None = None
        self.done = threading.Event()

    # --- control from other threads ----------------------------------------------------------

    @property
    def terminated(self) -> str | None:
        """A terminate-class cause (cancel cascade, deadline, clear, close): the agent must end.

        Read from the registry, which marks the whole cancelled subtree before it trips any
        token, so an interrupt (which only trips the turn's scope) is never mistaken for it."""
        standing = self.site.standing(self.name)
        if not standing.registered:  # reaped mid-drive (clear_subtree deregisters at once):
            # the eval root keeps the cascade's cause; once the drive has ended, its end cause
            # stands
            return self._ended_cause if self.outcome is not None else self.eval_root.reason
        return standing.cancel_cause

    def cancel(self, cause: str) -> None:
        """Terminate-class cancel through the registry cascade (reaches the whole subtree)."""
        self.site.cancel_subtree(self.name, cause)

    def interrupt(self, reason: str = "interrupt") -> None:
        """Stop the current turn only (the registry's interrupt hook); descendants keep running
        and the next genuine turn gets a fresh scope."""
        self.turn.cancel(reason)
        self.eval_root.interrupt(reason)
        self.inbox.wake()

    def _fresh_turn(self) -> None:
        """A genuine turn boundary: a fresh scope for the turn (the last one, if an interrupt
        tripped it, stays cancelled), still a child of :attr:`token`."""
        old, self.turn = self.turn, self.token.child()
        old.detach()

    def record_reply(self, value: Any) -> None:
        with self._reply_lock:
            self.reply_value = value
            self._replied = True
            self._reply_count += 1

    def _reply_mark(self) -> int:
        with self._reply_lock:
            return self._reply_count

    def _turn_back_reply(self) -> None:
        """The self-verify latch fired: the reply is not final until the agent replies again."""
        with self._reply_lock:
            self._provisional = (self.reply_value,)
            self._replied = False

    def forget_before_clear(self, generation: int) -> None:
        """``/clear``: the nudge latches (self-verify included), the turned-back reply and the
        pins start over, and results stamped before ``generation`` are refused at admission
        (one can already sit in the inbox behind the ``/clear`` that reaped its sender)."""
        self.latches = NudgeLatches()
        self.residency = ResidencyLatch()
        self.pins.clear()
        self._generation_floor = generation
        with self._reply_lock:
            self._provisional = None

    def import_context(self, events: tuple[Any, ...], note: str | None = None) -> None:
        """Start from another agent's model-visible context (a memory fork, a branch), before
        the first turn; ``note`` says so in the log."""
        self.log.import_context(events)
        if note is not None:
            self.log.append_note(note)

    @property
    def replied(self) -> bool:
        with self._reply_lock:
            return self._replied

    # --- the park verdict -------------------------------------------------------------------

    def park_mode(self) -> ParkMode:
        if self.terminated is not None:
            return ParkMode.QUIESCE
        reads = self.site.park_reads(self.name)
        return park_mode(
            interactive=self.interactive,
            returns=self.returns,
            has_parent=self.parent is not None,
            listed=reads.listed,
            engaged=reads.engaged,
            live_descendants=reads.live_descendants,
            schedules_armed=self.schedules.armed(),
            live_workers=self.surfaces.waiting,
        )

    # --- drive ------------------------------------------------------------------------------

    def drive(self) -> AgentOutcome:
        """The agent's whole lifetime; returns how it ended. Never raises."""
        outcome = AgentOutcome.QUIESCED
        try:
            if self.logged_reply is not None:
                self.record_reply(self.logged_reply)
                self._note("rebuilt after its reply was logged: it ends replied with that reply")
                outcome = AgentOutcome.REPLIED
            else:
                outcome = self._drive_turns()
            outcome = self._provisional_stands(outcome)
        except Cancelled:  # a poll point outside apply (a slash command's summarise, ...)
            outcome = AgentOutcome.CANCELLED
        except Exception as e:  # a bug must end this agent cleanly, never strand the fleet
            outcome = AgentOutcome.FAILED
            self.stats.end_reason = f"agent failed: {type(e).__name__}: {e}"
            self._note(self.stats.end_reason)
        finally:
            self._ended_cause = self.terminated
            self._exit()
        self.outcome = outcome
        self.stats.state = outcome.value
        return outcome

    def _drive_turns(self) -> AgentOutcome:
        """Inbox turns until one ends the agent (or its inbox parks it for good)."""
        outcome = AgentOutcome.QUIESCED
        if self.spec.prompt is not None:
            self.inbox.push(UserSteering(self.spec.prompt))
        if self.spec.resume:  # workers its restored shell lost are news to it: they surface now
            self._park_workers()
        while True:
            self.stats.state = "idle"
            self._ready_boundary()
            item = self.inbox.next_or_idle(self.park_mode)
            if isinstance(item, ExitSignal):  # the control lane, ahead of queued turns
                outcome = AgentOutcome.CANCELLED
                break
            if item is None and self.terminated is None and self._suspended is not None:
                resumed = self._resume_suspended()
                if isinstance(resumed, AgentOutcome):
                    outcome = resumed
                    break
                if resumed is None and self._suspended is not None:
                    self._park_workers()  # waits again: settled results surface now
                    continue
                item = resumed
            if item is None or self.terminated is not None:
                if item is not None:  # popped but never admitted: recorded, not lost
                    self._record_undelivered([item])
                if self.terminated is not None:
                    outcome = AgentOutcome.CANCELLED
                break
            self.stats.state = "working"
            ended = self._turn(item)
            if ended is not None:
                outcome = ended
                break
            self._park_workers()
        return outcome

    def _nudge_inputs(self, loop: Outcome) -> NudgeInputs:
        """The nudge rules' inputs now, for a turn that ended ``loop``; what is still running
        is read only when the rules would look at it (:func:`waiting_matters`)."""
        returns = self.returns and not self.spec.chat
        headless_trunk = self.parent is None and not self.interactive
        read = waiting_matters(
            loop,
            self.latches,
            replied=self.replied,
            returns=returns,
            headless_trunk=headless_trunk,
        )
        return NudgeInputs(
            outcome=loop,
            returns=returns,
            replied=self.replied,
            pins=tuple(f"{k}: {v}" for k, v in self.pins.items()),
            live_descendants=read and self.site.park_reads(self.name).live_descendants,
            live_workers=read and self._workers_pending(),
            headless_trunk=headless_trunk,
        )

    def _resume_suspended(self) -> InboxNudge | AgentOutcome | None:
        """The nudge rules again for a turn suspended on live children or workers that have all
        settled with nothing new in the inbox (nudge.py: the driver re-runs ``decide`` when
        they settle). A child's result reaches its parent before the child deregisters, so the
        turn that admitted the result can still have seen the child live: without this a
        returning agent that had not replied quiesced instead of being asked to reply.
        Returns the nudge to continue with (the rest already logged), the outcome to end with,
        or None (nothing to post: the park verdict stands)."""
        loop, self._suspended = self._suspended, None
        assert loop is not None
        decision = decide(self._nudge_inputs(loop), self.latches)
        self.latches = decision.latches
        if decision.verdict is Verdict.HONOUR_REPLY:
            return AgentOutcome.REPLIED
        if decision.verdict is Verdict.SUSPENDED:  # something started meanwhile: park again
            self._suspended = loop
            return None
        if decision.verdict is not Verdict.CONTINUE_TURN or not decision.nudges:
            return None
        if any(n.kind is NudgeKind.SELF_VERIFY for n in decision.nudges):
            self._turn_back_reply()
        *first, last = decision.nudges
        for n in first:
            self.log.append_nudge(n.kind.value, n.text)
        self.latches = self.latches.after_self_nudge()
        return InboxNudge(last.kind.value, last.text)

    def _provisional_stands(self, outcome: AgentOutcome) -> AgentOutcome:
        """A reply turned back for self-verification stands when no second reply came."""
        if outcome is not AgentOutcome.QUIESCED or self.replied or self._provisional is None:
            return outcome
        self.record_reply(self._provisional[0])
        self._note("self-verification ended without a second reply; the first reply stands")
        return AgentOutcome.REPLIED

    def _ready_boundary(self) -> None:
        """Ready-boundary housekeeping that is the agent's, not the shell's: the disk warning.

        Run at drive's top and before every provider round-trip (the log is ReadyForUser at
        both), so a long headless turn is checked too. Unconfigured it returns at once."""
        # ral_calls is +1 per ral tool call, like the shell's epoch: one clock for both.
        warning = self.disk_warn.check(self.stats.ral_calls)
        if warning is not None:
            self.site.publish(SystemNote(self.name, text=warning.text))

    def _park_workers(self) -> None:
        """The turn ended and the agent goes back to its inbox: its running workers are watched
        and their completions (and any result it never claimed) surface into the inbox, each as
        a ``Surface`` stamped with the current generation (so ``/clear`` drops older ones)."""
        self.shell.park_workers(self.site.generation()).get()

    def _workers_pending(self) -> bool:
        """Whether worker results are still coming to this agent — running, settled but not yet
        surfaced, or surfaced and queued in its inbox: the nudge rules wait for them."""
        if self.inbox.depths().get(SURFACE, 0):
            return True
        return bool(self.shell.pending_workers().get())

    def _exit(self) -> None:
        """The single exit: settle pending calls (turn-ends-ready) and disarm schedules.

        The shell (and with it every worker still registered on it) is closed by the spawn
        site right after: a child's through its executor's teardown, so the receipt says what
        happened to the environment; the trunk's directly."""
        try:
            if self.log.pending_tool_calls:
                self.log.settle_pending()
        except Exception:  # the exit must still disarm schedules and record leftovers
            log.exception("agent %s: settling pending tool calls at exit failed", self.name)
        self.schedules.clear(close=True)
        self.record_leftovers()

    def record_leftovers(self) -> None:
        """Remove and record the inbox items no turn will admit (never silently lost).

        Called at the single exit and again by the spawn site once the agent is deregistered:
        a result delivered in between is in the inbox, not yet refused by the registry."""
        items = []
        while (item := self.inbox.try_pop()) is not None:
            items.append(item)
        if items:
            self._record_undelivered(items)

    def _record_undelivered(self, items: list[Any]) -> None:
        for item in items:
            self.site.record_rejected(InboxRejected.of(self.name, item, reason="recipient ended"))

    @property
    def conversing(self) -> bool:
        """Built to converse with its human: a capped or failed turn ends the turn, not it."""
        return self.interactive and not self.returns

    # --- one turn ---------------------------------------------------------------------------

    def _turn(self, item: object) -> AgentOutcome | None:
        """Run one inbox turn; return an outcome if the agent must end."""
        if isinstance(item, InboxNudge):
            # A queued runtime nudge is the same turn continuing: it resets nothing.
            self.log.append_nudge(item.kind, item.text)
            self.surfaces.unpark()
        else:
            # A genuine turn boundary: the latches reset and the turn gets a fresh scope.
            self.latches = self.latches.at_turn_boundary()
            self._suspended = None
            self._fresh_turn()
            if self.terminated is not None:
                self._record_undelivered([item])
                return AgentOutcome.CANCELLED
            self.stats.handled += 1
            if not self._admit_input(item):
                return None  # a slash command or a refused item: no model turn, still parked
            self.stats.turns += 1
            self.surfaces.unpark()  # completions now wait for this turn's end
        turn = _Turn(self.provider.current())  # read once: a swap lands next turn
        while True:
            loop = self._apply(turn)
            if self.terminated is not None:
                return AgentOutcome.CANCELLED
            if self.spec.chat and loop is Outcome.END_TURN and self.returns:
                # --chat has no tool, so no `reply`: a headless chat's answer is its text.
                self.record_reply(turn.last_text)
                return AgentOutcome.REPLIED
            decision = decide(self._nudge_inputs(loop), self.latches)
            self.latches = decision.latches
            if decision.verdict is Verdict.SUSPENDED:
                self._suspended = loop
            if decision.verdict is Verdict.HONOUR_REPLY:
                return AgentOutcome.REPLIED
            if loop is Outcome.CAPPED:  # terminal: re-driving would spend the ceiling again
                return None if self.conversing else AgentOutcome.CAPPED
            if loop is Outcome.PROVIDER_ERROR:  # a provider fact, never a nudge
                return None if self.conversing else AgentOutcome.FAILED
            if decision.verdict is Verdict.CONTINUE_TURN:
                if any(n.kind is NudgeKind.SELF_VERIFY for n in decision.nudges):
                    self._turn_back_reply()
                for n in decision.nudges:
                    self.log.append_nudge(n.kind.value, n.text)
                self.latches = self.latches.after_self_nudge()
                continue
            return None

    def _admit_input(self, item: object) -> bool:
        """Append a turn's input to the log; False when it needs no model turn."""
        if isinstance(item, UserSteering):
            if item.is_slash:
                run_slash(self, item.text.strip())
                return False  # no slash command needs a model turn
            self.log.append_user(item.text)
        elif isinstance(item, Command):
            run_slash(self, item.text.strip())
            return False
        elif isinstance(item, AgentResult | Surface) and item.generation < self._generation_floor:
            sender = item.child if isinstance(item, AgentResult) else None
            self.site.record_rejected(
                InboxRejected.of(self.name, item, reason="stale generation", sender=sender)
            )
            return False
        elif isinstance(item, AgentResult):
            self.results_seen.add(item.child)
            text = clip_agent_reply(render(item.value))
            self.log.append_user(
                f"[agent {item.child} finished: {item.status}]\n{text}", source="agent_result"
            )
        elif isinstance(item, AgentMessage):
            self.log.append_user(
                f"[message from agent {item.sender}]\n{item.text}",
                source="agent_message",
                message_id=item.id or None,
            )
        elif is_held_notice(item):
            assert isinstance(item, ScheduledWakeup)
            self.log.append_user(f"[held replies]\n{item.prompt}", source="held_replies")
            return True
        elif isinstance(item, ScheduledWakeup):
            self.log.append_user(
                f"[scheduled wakeup {item.schedule_id}]\n{item.prompt}", source="wakeup"
            )
        elif isinstance(item, Surface):
            self.log.append_user("\n".join(str(x) for x in item.batch), source="surface")
        else:
            self._note(f"unknown inbox item {type(item).__name__} ignored")
            return False
        for notice in self.inbox.take(is_held_notice):  # told with this turn, not 64 later
            assert isinstance(notice, ScheduledWakeup)
            self.log.append_user(f"[held replies]\n{notice.prompt}", source="held_replies")
        return True

    # --- apply ------------------------------------------------------------------------------

    def _apply(self, turn: _Turn) -> Outcome:
        """Provider round-trips until the model stops calling tools (or the turn must stop).

        ``turn`` carries the provider read at the top of the turn and the step count, which
        spans self-nudges: MAX_STEPS bounds the whole turn, so an unbudgeted reminder loop
        (a pin never unpinned) ends Capped instead of running forever."""
        provider = turn.provider
        tools = () if self.spec.chat else (RAL_TOOL,)
        self.stats.in_flight = []  # this turn's provider events: what a release persists
        while True:
            if self.turn.cancelled:
                return Outcome.CANCELLED
            self._ready_boundary()
            self._maybe_compact(provider)
            if self.turn.cancelled:
                return Outcome.CANCELLED
            if turn.steps >= MAX_STEPS:
                self._note(f"turn capped after {MAX_STEPS} provider round-trips")
                self.stats.end_reason = f"capped after {MAX_STEPS} provider round-trips"
                return Outcome.CAPPED
            turn.steps += 1
            self.stats.steps += 1
            raw: AssistantMessage
            self.site.before_wait()  # a round trip can take minutes: batched events go first
            self._trip = RoundTrip()
            try:
                raw = provider.complete(
                    self.log.render_transcript(),
                    system=self.system,
                    tools=tools,
                    cancel=self.turn,
                    on_event=self._on_stream_event,
                )
            except Cancelled:
                return Outcome.CANCELLED
            except Truncated as t:
                raw = t.partial
            except ProviderError as e:
                self.site.publish(ProviderFailed(self.name, error=e.kind, message=str(e)))
                self.stats.end_reason = f"provider {e.kind}: {e}"
                return Outcome.PROVIDER_ERROR
            empty = raw.is_empty
            msg, unencodable = admit_with_report(raw)  # X2/X7 at the commit boundary
            committed = self.log.append_assistant(msg)
            self.count_usage(msg, provider, self._trip)
            self.stats.in_flight.append({"committed": committed.data["message"]})
            turn.last_text = msg.text
            if msg.tool_calls:  # MaxTokens with tool calls dispatches them (X6)
                mark = self._reply_mark()
                self._dispatch(msg, unencodable)
                if self.returns and self._reply_mark() > mark:
                    return Outcome.END_TURN  # reply ends a returning agent after its batch
                continue
            return classify(msg.stop_reason.value, has_tool_calls=False, empty=empty)

    def _on_stream_event(self, ev: Any) -> None:
        self._trip.note(ev)
        to_dict = getattr(ev, "to_dict", None)
        self.stats.in_flight.append(to_dict() if callable(to_dict) else {"event": repr(ev)})

    def count_usage(
        self, msg: AssistantMessage, provider: Provider, trip: RoundTrip, operation: str = "chat"
    ) -> None:
        """One round trip's tokens and money on this agent's meter and the fleet's spend, and
        its ``ModelCall`` event (``trip``: when it began, its attempts and rate waits)."""
        model = provider.model
        cost = self.stats.spend.charge(model, msg.usage, self.site.prices())
        self.site.charge(self.name, cost)
        self.site.publish(
            trip.event(
                self.name, msg, model=model, provider=provider.name, cost=cost, operation=operation
            )
        )
        if msg.usage is not None:
            self.stats.tokens_known = True
            self.stats.input_tokens += msg.usage.input_tokens
            self.stats.output_tokens += msg.usage.output_tokens

    def _maybe_compact(self, provider: Provider) -> None:
        if (
            not compaction_due(self.log.used_tokens, provider.window_tokens, self.log.history_bytes)
            or not self.log.can_compact()
        ):
            return
        if self.turn.cancelled:  # an interrupt at the boundary bails before summarising
            return
        self.site.before_wait()
        try:
            trip = RoundTrip()
            reply = provider.summary_reply(
                self.log.render_transcript(), self.turn, system=self.system
            )
            self.count_usage(reply, provider, trip, "summary")  # a paid round trip too
            summary = reply.text
        except Cancelled:
            return
        except ProviderError as e:
            self.site.publish(ProviderFailed(self.name, error=e.kind, message=str(e)))
            return
        self.log.apply_compaction(summary)
        self.site.publish(Notice(self.name, notice="Compacted", text="history compacted"))

    # --- dispatch ---------------------------------------------------------------------------

    def _dispatch(self, msg: AssistantMessage, unencodable: dict[str, str]) -> None:
        """The batch in order, every requested id answered once; then tool-boundary steering.

        A call whose arguments held a lone surrogate (``unencodable``: committed as U+FFFD) is
        answered with an error and never run: the script the model sent is not one a shell can
        be given, and the repaired one is not what it sent."""
        for call in msg.tool_calls:
            with durability.one_commit():  # the call's records: one fsync round (machine)
                mark = self._reply_mark()
                result = self._answer(call, unencodable)
                # the reply rides the call's own record: durable before any settlement
                text, value = (
                    reply_fields(self.reply_value) if self._reply_mark() > mark else (None, None)
                )
                self.log.append_tool_result(result, reply=text, value=value)
        due, self._residency_due = self._residency_due, []
        for nudge in due:
            self.log.append_nudge(nudge.kind, nudge.text)
        for steering in self.inbox.drain_steering():
            self.log.append_steering(steering.text)

    def _answer(self, call: ToolCall, unencodable: dict[str, str]) -> ToolResult:
        """One requested call's result: run, or refused with the reason."""
        script = call.script
        if self.turn.cancelled:
            return self._refused(call.id, script, "cancelled: the turn was interrupted")
        if call.id in unencodable:
            return self._refused(
                call.id,
                script,
                f"the call was not run: its arguments hold {unencodable[call.id]}, a lone "
                "surrogate, which is not a character (no file, pipe or frame can carry "
                "it); send the script again without it",
            )
        if call.name != RAL_TOOL.name:
            return self._refused(
                call.id, script, f"unknown tool {call.name!r}: the only tool is ral"
            )
        if script is None:
            return self._refused(
                call.id,
                None,
                "the ral call is missing its script: the arguments must be a JSON object "
                'with a string "script", e.g. {"script": "echo hi"}',
            )
        return self.run_ral(call.id, script)

    def _refused(self, call_id: str, script: str | None, text: str) -> ToolResult:
        """A call answered without running: the transcript records the same text."""
        content = "[error]\n" + clip_section(text, Section.ERROR)
        self.site.publish(
            Io(self.name, call_id=call_id, script=script or "", value=content, error="error")
        )
        return ToolResult(call_id, content, is_error=True)

    def run_ral(self, call_id: str, script: str) -> ToolResult:
        """One ral tool call through the shell; the digest is what the model and transcript see."""
        self.stats.ral_calls += 1
        began = time.monotonic()
        out = self.site.run_shell(self.name, script)
        seconds = round(time.monotonic() - began, 6)
        self._note_residency(out)
        self.site.publish(
            Io(
                self.name,
                call_id=call_id,
                script=script,
                value=out.content,
                error="error" if out.is_error else None,
                seconds=seconds,
            )
        )
        return ToolResult(call_id, out.content, is_error=out.is_error)

    def _note_residency(self, out: ShellOutput) -> None:
        """Fold one call's large-binding notices into the residency latch; queue its nudges."""
        large: list[LargeBinding] = []
        gone: list[str] = []
        for n in out.notices:
            if n.notice == "LargeBinding":
                d = n.data
                large.append(LargeBinding(str(d["name"]), int(d["size"]), int(d["limit"])))
            elif n.notice == "Prune":
                gone.extend(str(x) for x in n.data.get("names") or ())
        if not (large or self.residency.latched):
            return
        self.residency, nudges = self.residency.after_run(large, out.defined, gone)
        self._residency_due.extend(InboxNudge(x.kind.value, x.text) for x in nudges)

    def await_run(self, future: pykka.Future[Any]) -> Any:
        """Wait for one shell run, re-sending an interrupt while the turn's scope stands cancelled.

        An interrupt can land between dispatch's token check and the run attaching to the
        shell host, where :meth:`EvalRoot.interrupt` has no run to stop; re-sending it every
        ``_RUN_POLL`` until the run returns closes that window. A finished run returns at
        once: ``get`` wakes on the result, not on the poll."""
        while True:
            try:
                return future.get(timeout=_RUN_POLL)
            except pykka.Timeout:
                if self.turn.cancelled:
                    self.eval_root.interrupt(self.turn.reason or "interrupt")

    # --- helpers ----------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        self.site.publish(SystemNote(self.name, text=text))

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    # --- the shell, as the executor and the spawn site see it -------------------------------

    def shell_pid(self) -> int | None:
        """The current shell host pid (it changes after a rollback); the last known once closed."""
        try:
            pid = self.shell.host_pid().get(timeout=5.0)
        except Exception:
            return self._last_pid
        if pid is not None:
            self._last_pid = pid
        return pid if pid is not None else self._last_pid

    @property
    def last_shell_pid(self) -> int | None:
        """The shell host pid as :meth:`shell_pid` last read it; never waits (a busy shell
        actor answers ``shell_pid`` only after its run)."""
        return self._last_pid

    shell_stopped = False
    """The thread backend's shell is stopped by its spawn site's teardown, never before the
    agent's end is settled (an agent process stops its own: ``actors/agent_process.py``)."""

    def shell_healthy(self) -> bool:
        """Whether the shell host can still be observed (alive, not killed for good)."""
        pid = self.shell_pid()
        if pid is None:
            return False
        try:
            import psutil

            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except Exception:
            return False


@dataclass
class _Turn:
    """One turn's fixed provider (read once at its top) and its step count across nudges."""

    provider: Provider
    steps: int = 0
    last_text: str = ""
