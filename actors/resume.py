"""``resume``: rebuild a fleet from its session directory after the whole control process died.

The durable files are enough (docs/scenarios.md): ``run.json`` says how the run was started,
the spawn journal which children were admitted and which reached a terminal record, each
agent's ``events.jsonl`` is its conversation and ``snapshot.msgpack`` its shell at the last
clean call.

Order, and why:

0. **Reap**: any process the dead run named that still runs (pid + create time) is killed, and
   resume waits until it is gone (at most :data:`LEFTOVER_WAIT`), before any file is read: an
   agent process that outlives its control process by a few ms still closes its shell, and a
   snapshot read during that close's compaction (the base renamed, the log not yet) lost the
   bindings of a completed call; no stale shell writes next to the rebuilt one either, and a
   finished resume leaves none of them running.
1. **Read** (``runtime/state/session_read.py``): every file the plan builds on must read whole but
   for a torn last line; anything else refuses typed (:class:`DamagedSession`, file and line,
   exit 2), as does a finished run (:class:`NothingToResume`). A corrupt ``result.json`` is the
   one file healed: it is derived, so its bytes are set aside and it is written afresh.
2. **Plan** (:func:`plan_resume`, reads only): which agents were alive when the control process
   died (``Born`` without ``Died``; a trunk never ``Born`` -- a kill during start-up, after
   ``run.json`` -- is rebuilt too, from its start), which open journal slots can be *rebuilt*
   (dispatched, no execution result yet, parent rebuilt too — tree order; a child spawned and
   never admitted, whose birth the kill cut short, is *reborn* when its parent is rebuilt:
   admitted now and started on its journalled prompt) and which must be *healed* with
   ``resume_sweep`` semantics (a slot that finished but never settled, a slot whose environment
   died with no parent left to resume it, a slot that never got an environment and whose parent
   is not rebuilt, a retained-pending slot); each scripted agent's playback cursor; which child
   results never reached their parent's log.
3. **Heal** the slots that will not be rebuilt: every one reaches its terminal record now.
4. **Rebuild**: a ``Died`` (cause ``control process died``) closes each dead incarnation on the
   bus, then the trunk and the rebuilt children are registered in tree order, each from its
   durable files (:meth:`actors.fleet.Fleet.adopt_agent`); pending tool calls are settled as
   interrupted; results the journal settled but the parent never logged are re-delivered (or
   recorded as ``InboxRejected`` when the parent is gone); so is every agent ``message``
   recorded sent (``MessageSent``, written before its sender's call returned) that no log of
   its recipient holds (by ``messageId``) and no ``InboxRejected`` names, in the order sent; an
   agent that owed the model a response gets one resume note; then every agent is launched.
5. **Carry on** to the end exactly as ``run`` does, close (the release sweep) and write
   ``result.json`` (``resumed: true``). Every child ends settled: ``neverSettled`` is 0.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from exarch_actors.actors.agent import Agent, AgentSpec
from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.mcp_site import McpSetup
from exarch_actors.actors.pid_cgroup import sweep_session
from exarch_actors.actors.process_identity import kill_and_wait
from exarch_actors.runtime.constants import SCRATCH_ENV, TRUNK_NAME
from exarch_actors.runtime.credentials import SecretPolicy
from exarch_actors.runtime.errors import ExarchError, InboxFull, UnknownAgent
from exarch_actors.runtime.events import Died, InboxRejected, SystemNote
from exarch_actors.runtime.fleet.inbox import AgentMessage, AgentResult, UserSteering
from exarch_actors.runtime.fleet.park import Construction
from exarch_actors.runtime.mcp.config import servers_from_run
from exarch_actors.runtime.messages import AssistantMessage
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.scenario import Scenario, load_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback, played_rounds
from exarch_actors.runtime.providers.traffic import TrafficLimits
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.grants import GrantPolicy
from exarch_actors.runtime.ral.values import render
from exarch_actors.runtime.settlement.fleet_yield import FleetYield, settlement_status
from exarch_actors.runtime.settlement.release_sweep import (
    RetainedChild,
    adopt_local,
    release_sweep,
    spend_of,
)
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import Durability, bound_to, parse_durability
from exarch_actors.runtime.state.durable import write_json_document
from exarch_actors.runtime.state.eventlog import reply_of
from exarch_actors.runtime.state.journal import NodeState, SpawnJournal
from exarch_actors.runtime.state.run_processes import leftover_processes, still_running
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_read import (
    ResumeRefused,
    SessionFiles,
    load_snapshot,
    read_session,
    set_aside_result,
)
from exarch_actors.runtime.state.session_records import (
    CONTROL_DIED,
    logged_messages,
    logged_results,
    rejected_messages,
    sent_messages,
)
from exarch_actors.runtime.state.snapshot import MobileSnapshot

RESUME_NOTE = (
    "[system note] The run was resumed after its control process died. Any tool call that was "
    "in flight is marked interrupted; your shell holds every binding of the calls that "
    "completed. Continue where you left off."
)
LEFTOVER_WAIT = 30.0
"""Seconds resume waits at most for the dead run's killed processes to be gone (a hang guard:
under two CPU hogs one took over a second to exit after its SIGKILL, and ``check`` found it
still running after the resumed run had ended). One still there after it is logged."""

log = logging.getLogger(__name__)

__all__ = ["plan_resume", "resume_run"]


@dataclass
class ResumePlan:
    """What :func:`resume_run` will do; built from the files alone."""

    session: SessionDir
    files: SessionFiles
    run: dict[str, Any]
    alive_at_crash: list[str]
    rebuild_trunk: bool
    rebuild: list[str]  # children, tree order
    finished: list[str]  # open, with an execution result: settle from it
    orphaned: list[str]  # open, environment admitted, nobody left to resume it
    no_environment: list[str]
    retained: list[str]  # settled with retainedExecution pending
    cursors: dict[str, int] = field(default_factory=dict)
    trunk_outcome: str | None = None  # the trunk's Died outcome when it ended before the crash
    trunk_reply: str | None = None  # and the reply that Died carries
    snapshots: dict[str, MobileSnapshot | None] = field(default_factory=dict)
    redeliver: list[tuple[str, str]] = field(default_factory=list)  # (child, parent)
    unreachable: list[tuple[str, str]] = field(default_factory=list)  # parent not resumed
    messages: list[AgentMessage] = field(default_factory=list)  # to a rebuilt agent, in order
    messages_to: list[str] = field(default_factory=list)  # their recipients, one each
    lost_messages: list[tuple[str, AgentMessage]] = field(default_factory=list)  # not rebuilt
    trunk_unborn: bool = False  # killed during start-up: the trunk starts from its beginning
    reborn: list[str] = field(default_factory=list)  # in ``rebuild``, never admitted: born anew

    def to_json(self) -> dict[str, Any]:
        return {
            "aliveAtCrash": self.alive_at_crash,
            "rebuildTrunk": self.rebuild_trunk,
            "trunkUnborn": self.trunk_unborn,
            "reborn": self.reborn,
            "rebuild": self.rebuild,
            "finished": self.finished,
            "orphaned": self.orphaned,
            "noEnvironment": self.no_environment,
            "retained": self.retained,
            "cursors": self.cursors,
            "redeliver": [list(x) for x in self.redeliver],
            "unreachable": [list(x) for x in self.unreachable],
            "messages": [[to, m.id] for to, m in zip(self.messages_to, self.messages, strict=True)],
            "lostMessages": [[to, m.id] for to, m in self.lost_messages],
            "corruptResult": self.files.corrupt_result,
        }


@dataclass(frozen=True)
class ResumeOutcome:
    outcome: str
    reply: str | None
    fleet_yield: FleetYield
    session: SessionDir
    plan: ResumePlan


def _played_rounds(files: SessionFiles, agent: str) -> int:
    """:func:`runtime.providers.scripted.played_rounds` of ``agent``'s logs and bus errors."""
    errors = sum(
        1 for r in files.transcript if r.get("kind") == "ProviderError" and r["agent"] == agent
    )
    return played_rounds(files.events_of(agent), errors)


def plan_resume(session: SessionDir) -> ResumePlan:
    """Read the session and decide (see the module docstring); raises :class:`ResumeRefused`
    (:class:`DamagedSession` naming file and line when a file it builds on is damaged)."""
    files = read_session(session)
    transcript = files.transcript
    born = Counter(r["agent"] for r in transcript if r.get("kind") == "Born")
    died = Counter(r["agent"] for r in transcript if r.get("kind") == "Died")
    alive = sorted(a for a in born if born[a] > died[a])
    state = files.journal.state
    # a trunk never born (a kill during start-up: run.json, then nothing) never ended either:
    # it is rebuilt, from its start, and the run goes on as if it had just been started
    rebuild_trunk = TRUNK_NAME in alive or (TRUNK_NAME not in born and TRUNK_NAME not in died)
    resumed = {TRUNK_NAME} if rebuild_trunk else set()
    rebuild: list[str] = []
    finished: list[str] = []
    orphaned: list[str] = []
    no_env: list[str] = []
    retained: list[str] = []
    reborn: list[str] = []
    nodes = sorted(state.nodes.values(), key=lambda n: int(n.spawned["seq"]))
    with_files = set(session.agent_names())
    for n in nodes:
        if not n.open:
            continue
        parent = n.spawned.get("parent")
        if n.pending is not None:
            retained.append(n.id)
        elif n.environment is None and not n.phases and parent in resumed:
            # its parent holds a "started" receipt and goes on; the birth the kill cut short
            # (an agent process's children are born after their receipt) happens now, with the
            # prompt its spawned record keeps -- as the spawn would have done it
            rebuild.append(n.id)
            reborn.append(n.id)
            resumed.add(n.id)
        elif n.environment is None:
            no_env.append(n.id)
        elif n.results:
            finished.append(n.id)
        elif "dispatched" in n.phases and parent in resumed and n.id in with_files:
            rebuild.append(n.id)
            resumed.add(n.id)
        else:
            orphaned.append(n.id)
    plan = ResumePlan(
        session,
        files,
        files.run,
        alive,
        rebuild_trunk,
        rebuild,
        finished,
        orphaned,
        no_env,
        retained,
    )
    plan.trunk_unborn = TRUNK_NAME not in born
    plan.reborn = reborn
    for r in transcript:
        if r.get("kind") == "Died" and r["agent"] == TRUNK_NAME:
            plan.trunk_outcome = r.get("outcome")
            plan.trunk_reply = r.get("reply")
    for name in ([TRUNK_NAME] if rebuild_trunk else []) + rebuild:
        plan.cursors[name] = _played_rounds(files, name)
        plan.snapshots[name] = load_snapshot(files, name)
    rejected = {
        (r["agent"], str((r.get("message") or {}).get("child")))
        for r in transcript
        if r.get("kind") == "InboxRejected"
    }
    logged: dict[str, set[str]] = {}
    for n in nodes:
        parent = n.spawned.get("parent")
        if not isinstance(parent, str) or n.id in resumed:
            continue
        if parent not in logged:
            logged[parent] = logged_results(files.events_of(parent))
        if (parent, n.id) in rejected or n.id in logged[parent]:
            continue
        (plan.redeliver if parent in resumed else plan.unreachable).append((n.id, parent))
    _plan_messages(plan, resumed)
    return plan


def _plan_messages(plan: ResumePlan, resumed: set[str]) -> None:
    """Every message recorded sent that no log of its recipient holds and no ``InboxRejected``
    names: delivered again to a rebuilt recipient, in the order sent, or recorded undelivered
    (``recipient ended``) when the recipient will not be rebuilt. A control kill between the
    record and the recipient's log line is the window this closes (``MessageSent``)."""
    files = plan.files
    rejected = rejected_messages(files.transcript)
    logged: dict[str, set[str]] = {}
    for r in sent_messages(files.transcript):
        to, mid = str(r["agent"]), str(r["id"])
        if to not in logged:
            logged[to] = logged_messages(files.events_of(to))
        if mid in rejected or mid in logged[to]:
            continue
        msg = AgentMessage(str(r["sender"]), str(r["text"]), mid)
        if to in resumed:
            plan.messages.append(msg)
            plan.messages_to.append(to)
        else:
            plan.lost_messages.append((to, msg))


# --------------------------------------------------------------------------- doing it


def _heal(journal: SpawnJournal, plan: ResumePlan) -> None:
    """Close every slot that will not be rebuilt (``resume_sweep`` semantics)."""
    sweep: list[RetainedChild] = []
    for nid in plan.no_environment:
        journal.settled(
            nid,
            "down",
            reason="control process died before an environment was provisioned",
            resumed=True,
        )
    for nid in plan.finished + plan.orphaned + plan.retained:
        node = journal.state.nodes[nid]
        ex = adopt_local(node)
        if nid in plan.retained:
            sweep.append(RetainedChild(nid, ex))
            continue
        outcome = (node.results[-1].get("outcome") if node.results else None) or "failed"
        if outcome == "cancelled":
            journal.cancelled(
                nid,
                ack="unknown",
                detail="cancelled before the control process died; settled on resume",
                spend=spend_of(None),
                resumed=True,
            )
            continue
        status = settlement_status(outcome)
        floor = (node.floor or {}).get("spend") or spend_of(None)
        journal.reconciled(nid, spend=floor, reason="retained: controller-died")
        journal.settled(
            nid,
            status,
            retained="pending",
            cause="controller-died",
            reason=outcome if node.results else CONTROL_DIED,
            resumed=True,
        )
        sweep.append(RetainedChild(nid, ex))
    if sweep:
        release_sweep(journal, sweep, retain="release")


def _died_at_crash(node: NodeState | None, name: str) -> Died:
    """The ``Died`` of an agent that was alive on the bus when the control process died. A
    child whose end the journal already recorded (its execution result: the control process
    died between its settlement and its ``Died``) dies with that outcome, so its one terminal
    story agrees; any other incarnation died with the control process."""
    last = node.results[-1] if node is not None and node.results else None
    if last is None or not last.get("outcome"):
        return Died(name, outcome="failed", cause=CONTROL_DIED)
    outcome = str(last["outcome"])
    cause = None if outcome == "replied" else str(last.get("reason") or outcome)
    return Died(name, outcome=outcome, cause=cause)


def _result_of(node: NodeState) -> AgentResult:
    last = node.results[-1] if node.results else {}
    terminal = node.terminal or {}
    status = str(
        last.get("outcome") or ("cancelled" if terminal.get("kind") == "cancelled" else "failed")
    )
    reply = reply_of(last)
    return AgentResult(node.id, reply if reply is not None else "(no reply)", status=status)


def _owes_a_response(agent: Any) -> bool:
    """Whether the log ends where the model must speak next (not after an assistant message)."""
    for ev in reversed(agent.log.events):
        msg = ev.message()
        if msg is not None:
            return not isinstance(msg, AssistantMessage)
    return True


def resume_run(
    session: SessionDir,
    *,
    on_start: Callable[[Any], None] | None = None,
    poll: Callable[[], bool] | None = None,
    connection: dict[str, Any] | None = None,
    durability: Durability | None = None,
    agents: Literal["thread", "process"] | None = None,
    backend: Any = None,
    secret_env: tuple[str, ...] = (),
    otlp_endpoint: str | None = None,
) -> ResumeOutcome:
    """Resume the run in ``session`` to its end (see the module docstring).

    ``poll`` is called while waiting; returning True cancels the whole tree (Ctrl-C).
    ``connection`` overrides what ``run.json`` says of a network provider (``model``,
    ``base_url``, ``api_key``, constructor options such as ``read_timeout``); the key is never in
    ``run.json``, so without ``api_key`` it comes from the provider's variable. A provider that
    cannot be built (no key for the hosted service) refuses the resume. ``durability``
    overrides ``run.json``'s policy (absent there: ``process``), and is then written to it;
    ``agents`` likewise overrides where the agents run (absent there: ``thread``). An agent
    rebuilt in a process of its own settles its pending calls and takes its nudge there
    (:meth:`actors.agent_process.ProcessAgent.recover`). ``backend`` (a ``HostBackend``:
    ``actors/ray_backend.py``) starts each rebuilt agent's process (implies ``process``); its
    host begins from the driver's copy of the agent's files. ``secret_env`` marks more
    variables secret besides those ``run.json`` names (and is then written to it); the key in
    use, from ``connection`` or the provider's variable, is kept out of every shell as in the
    run (``runtime/credentials.py``). ``otlp_endpoint``: export the resumed run's spans there,
    into the session's one trace (``runtime/observe/otel.py``)."""
    from exarch_actors.actors.fleet import Fleet, FleetConfig

    # reap before reading (the module docstring, 0): 1 in ~25 random kills of a 4-child
    # fan-in lost a completed call's binding (``committed`` violated) when the plan came first
    _end_leftovers(session)
    plan = plan_resume(session)
    run = plan.run
    playback: ScenarioPlayback | None = None
    system: str | None = None
    prompt = run.get("prompt")
    governor = None
    replies: dict[str, Any] = {}
    if run.get("provider") == "scripted":
        scenario = _scenario_of(run)
        replies = dict(scenario.mcp_replies)
        playback = ScenarioPlayback(scenario)
        system = scenario.system
        prompt = prompt or scenario.prompt
        pb = playback

        def provider_for(name: str) -> Provider:
            return make_provider("scripted", scenario=pb, agent_name=name)

    else:
        options: dict[str, Any] = {}
        if run.get("windowTokens") is not None:
            options["window_tokens"] = run["windowTokens"]
        given = {"model": run.get("model"), "base_url": run.get("baseUrl"), **(connection or {})}
        if given.get("traffic") is None:  # the limits the run was given (learned ones relearn)
            given["traffic"] = TrafficLimits(**run.get("traffic") or {})
        try:
            base = make_provider(str(run["provider"]), **given, **options)
        except (ExarchError, ValueError) as e:
            raise ResumeRefused(f"cannot rebuild the {run['provider']} provider: {e}") from None

        governor = getattr(base, "governor", None)

        def provider_for(name: str) -> Provider:
            return base.for_agent(name)

    policy = durability or parse_durability(run.get("durability"))
    hosts: Literal["thread", "process"] = (
        "process"
        if backend is not None
        else agents or ("process" if run.get("agents") == "process" else "thread")
    )
    changed: dict[str, Any] = {}
    if durability is not None and policy.value != run.get("durability"):
        changed["durability"] = policy.value
    if agents is not None and agents != run.get("agents"):
        changed["agents"] = agents
    secrets = (
        SecretPolicy.from_json(run.get("secretEnv"))
        .marking(secret_env)
        .holding([(connection or {}).get("api_key")])
    )
    if secrets.to_json() != SecretPolicy.from_json(run.get("secretEnv")).to_json():
        changed["secretEnv"] = secrets.to_json()
    if changed:
        with bound_to(session.root, policy):  # what the run now keeps, for resume and check
            write_json_document(session.run_spec, {**run, **changed})
    extra: dict[str, Any] = {}
    if plan.files.corrupt_result is not None:  # derived data: set the bytes aside, rebuild it
        extra["corruptResultSetAside"] = set_aside_result(session).name
    if playback is not None:
        for name, n in plan.cursors.items():
            playback.advance(name, n)
    fleet = Fleet(
        session,
        provider_for,
        FleetConfig(
            disk_warn_bytes=run.get("diskWarnBytes"),
            cwd=run.get("cwd"),
            grants=GrantPolicy.from_dict(run.get("grants")),  # as resolved when the run began
            limits=ShellLimits.from_json(run.get("shellLimits")),
            durability=policy,
            agents=hosts,
            backend=backend,
            traffic=governor,
            secrets=secrets,
            mcp=McpSetup(servers_from_run(run.get("mcp"), os.environ), replies),
            otlp_endpoint=otlp_endpoint,
        ),
    )
    outcome, reply = (plan.trunk_outcome or "failed"), plan.trunk_reply
    try:
        _heal(fleet.journal, plan)
        for name in plan.alive_at_crash:
            fleet.publish(_died_at_crash(fleet.journal.state.nodes.get(name), name))
        adopted: list[Agent | ProcessAgent] = []
        order = ([TRUNK_NAME] if plan.rebuild_trunk else []) + plan.rebuild
        for name in order:
            node = fleet.journal.state.nodes.get(name)
            parent = node.spawned.get("parent") if node is not None else None
            spec = AgentSpec(
                name=name,
                parent=parent,
                construction=Construction.TRUNK if parent is None else Construction.FORK,
                system=system if parent is None else None,
                snapshot=plan.snapshots.get(name),
                context=_reborn_context(fleet, plan, name, parent),
                resume=True,
            )
            agent = fleet.adopt_agent(spec, provider_for(name))
            if name in plan.reborn:  # the admission its birth never reached
                fleet.admit_adopted(name)
            if isinstance(agent, Agent) and agent.log.pending_tool_calls:
                agent.log.settle_pending()
            adopted.append(agent)
        generation = fleet.registry.generation
        for child, parent in plan.redeliver:
            msg = _result_of(fleet.journal.state.nodes[child])
            fleet.registry.deliver(
                parent,
                AgentResult(msg.child, msg.value, msg.status, generation),
                sender=child,
            )
        for child, parent in plan.unreachable:
            fleet.bus.record_rejected(
                InboxRejected.of(
                    parent,
                    _result_of(fleet.journal.state.nodes[child]),
                    reason="recipient ended",
                    sender=child,
                )
            )
        _deliver_messages(fleet, plan)
        for agent in adopted:
            # a child's prompt is in its spawned record: one killed before its log took it
            # (an empty log) is given it again, as the trunk is given the run's
            first = (
                str(prompt) if agent.parent is None and prompt else _prompt_of(fleet, agent.name)
            )
            if isinstance(agent, ProcessAgent):
                agent.recover(first, RESUME_NOTE)
            elif agent.log.event_count == 0 and first is not None:
                agent.inbox.push(UserSteering(first))
            elif agent.logged_reply is None and _owes_a_response(agent) and not agent.inbox.items():
                agent.inbox.push(UserSteering(RESUME_NOTE))  # (one that replied ends at once)
            fleet.publish(SystemNote(agent.name, text="resumed from the session directory"))
        for agent in adopted:
            fleet.launch_adopted(agent)
        if on_start is not None:
            on_start(fleet)
        trunk = fleet.trunk
        while not fleet.wait_empty(0.1):
            if poll is not None and poll():
                fleet.cancel_all("interrupted")
        if trunk is not None:
            outcome = trunk.outcome.value if trunk.outcome is not None else "failed"
            if trunk.replied:
                value = trunk.reply_value
                reply = render(value)
    finally:
        fleet.close()
        if governor is not None:
            governor.close()
    fy = fleet.write_result(outcome, reply, resumed=True, **extra)
    return ResumeOutcome(outcome, reply, fy, session, plan)


def _reborn_context(
    fleet: Any, plan: ResumePlan, name: str, parent: str | None
) -> DynamicContext | None:
    """A child born anew by resume starts where a spawn starts it: in its parent's cwd,
    environment and grants (the parent's last snapshot: the one after its ``agent`` call),
    with a scratch directory of its own."""
    if name not in plan.reborn or parent is None:
        return None
    snap = plan.snapshots.get(parent)
    if snap is None or not snap.context:
        return None
    ctx = DynamicContext.from_dict(dict(snap.context))
    ctx.env[SCRATCH_ENV] = str(fleet.session.scratch(name).resolve())
    return ctx


def _deliver_messages(fleet: Any, plan: ResumePlan) -> None:
    """The messages :func:`_plan_messages` found undelivered: each pushed to its rebuilt
    recipient's inbox (before its launch, so its first turn takes them, in the order sent), or
    recorded ``InboxRejected`` -- nobody waits for them, as for a child's result."""
    for to, msg in zip(plan.messages_to, plan.messages, strict=True):
        try:
            fleet.registry.message(msg.sender, to, msg)
        except InboxFull as full:
            fleet.bus.record_rejected(
                InboxRejected.of(to, msg, reason="inbox full", cap=full.cap, sender=msg.sender)
            )
        except UnknownAgent:  # ended meanwhile (AgentEnded is one)
            fleet.bus.record_rejected(
                InboxRejected.of(to, msg, reason="recipient ended", sender=msg.sender)
            )
    for to, msg in plan.lost_messages:
        fleet.bus.record_rejected(
            InboxRejected.of(to, msg, reason="recipient ended", sender=msg.sender)
        )


def _prompt_of(fleet: Any, name: str) -> str | None:
    node = fleet.journal.state.nodes.get(name)
    prompt = node.spawned.get("prompt") if node is not None else None
    return prompt if isinstance(prompt, str) else None


def _end_leftovers(session: SessionDir) -> None:
    """Kill every process the dead run named that still runs and wait until each is gone."""
    procs = leftover_processes(session)
    left = kill_and_wait([(p.pid, partial(still_running, p)) for p in procs], LEFTOVER_WAIT)
    sweep_session(str(session.root.resolve()))  # and the dead run's (now empty) cgroups
    if left:
        log.warning(
            "the dead run's process(es) %s still run %.0f s after SIGKILL",
            ", ".join(map(str, left)), LEFTOVER_WAIT,
        )  # fmt: skip


def _scenario_of(run: dict[str, Any]) -> Scenario:
    """The scenario a scripted run was started with; :class:`ResumeRefused` when that file is
    gone or no longer reads (resume replays the run from it)."""
    try:
        return load_scenario(run["scenario"])
    except (ExarchError, OSError) as e:
        raise ResumeRefused(
            f"the scenario this run was started with cannot be read ({e}); "
            "resume replays it from that file"
        ) from None
