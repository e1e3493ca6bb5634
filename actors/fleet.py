"""The Fleet: the run as a whole — registry, bus, journal, session directory — and the spawn site.

The fleet owns no turn logic: every agent drives itself on its own actor thread. The fleet is
each agent's :class:`actors.agent_site.AgentSite` -- where its verbs and slash commands reach
shared state (spawn, message, cancel, branch), always by name and plain data -- and where a
child is settled by its spawn site (journal terminal record, result to the parent's inbox,
Died on the bus), and where the frontend reads "all live agents" and "the bus to drain".

Invariants:
- The fleet is alive while the registry is non-empty; :meth:`wait_empty` returns when the last
  agent has deregistered.
- Every spawned child reaches exactly one terminal journal record: settled by its spawn site when
  it ends, or closed by the release sweep of :meth:`close` when its environment could not be
  observed (``neverSettled`` is 0 for every run that ends).
- A result that cannot be delivered (parent's inbox full, parent gone, cleared generation) is
  recorded in ``transcript.jsonl`` as ``InboxRejected`` — never dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal
from uuid import uuid4

import pykka

from exarch_actors.actors import pid_cgroup
from exarch_actors.actors.agent import Agent, AgentOutcome, AgentSpec
from exarch_actors.actors.agent_executor import AgentExecutor
from exarch_actors.actors.agent_process import (
    BORN_TIMEOUT,
    AgentProcessFailed,
    HostBackend,
    HostBoot,
    ProcessAgent,
)
from exarch_actors.actors.agent_shell import (
    agent_resources,
    run_agent_shell,
    start_agent_shell,
    stop_agent_shell,
)
from exarch_actors.actors.agent_site import (
    BranchRequest,
    ParkReads,
    ShellOutput,
    ShellParts,
    SpawnRequest,
    Standing,
)
from exarch_actors.actors.boot_watch import BootWatch
from exarch_actors.actors.bus import start_bus
from exarch_actors.actors.channel_hub import ChannelHub
from exarch_actors.actors.fanin_site import FanInSite
from exarch_actors.actors.host_pool import HostPool
from exarch_actors.actors.host_reaper import HostReaper
from exarch_actors.actors.mailbox import Cancel, QuotaActor
from exarch_actors.actors.mcp_site import McpSetup, McpSite
from exarch_actors.actors.process import keep_secrets_from_forks
from exarch_actors.actors.ray_nodes import NodeChange, NodeWatch
from exarch_actors.actors.registry import start_registry
from exarch_actors.runtime.constants import SCRATCH_ENV, SESSION_ENV, TRUNK_NAME
from exarch_actors.runtime.credentials import SecretPolicy
from exarch_actors.runtime.drills.fault_switch import crash_point, pause_point
from exarch_actors.runtime.errors import NameUsed, SpawnFailed
from exarch_actors.runtime.events import (
    Born,
    CancelHop,
    Died,
    Event,
    InboxRejected,
    MessageSent,
    Notice,
    Resources,
    SystemNote,
)
from exarch_actors.runtime.fleet.fanin import ChildEnd, WaitAnswer
from exarch_actors.runtime.fleet.inbox import AgentMessage, Surface
from exarch_actors.runtime.fleet.park import Construction
from exarch_actors.runtime.fleet.registry import Entry
from exarch_actors.runtime.mcp.replies import McpRequest
from exarch_actors.runtime.observe.otel import LIVE_BUFFER, LiveExport, SpanExport
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.governor import Governor
from exarch_actors.runtime.providers.prices import PriceTable
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.errors import DeskRefusal
from exarch_actors.runtime.ral.grants import GrantPolicy, Grants
from exarch_actors.runtime.ral.values import render
from exarch_actors.runtime.replay.provider import RecordingProvider, unrecorded
from exarch_actors.runtime.settlement.cost import FleetSpend, dollars
from exarch_actors.runtime.settlement.executor import ExecutionSpec
from exarch_actors.runtime.settlement.fleet_yield import (
    FleetCost,
    FleetYield,
    fleet_yield,
    settlement_status,
    write_result,
)
from exarch_actors.runtime.settlement.release_sweep import (
    RetainedChild,
    SweepPolicy,
    admit,
    cancel_child,
    release_sweep,
    settle_child,
)
from exarch_actors.runtime.shell import pid_cgroup as pid_groups
from exarch_actors.runtime.shell.confinement import Sandbox, SandboxMode
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import Durability, DurableFiles
from exarch_actors.runtime.state.eventlog import reply_fields
from exarch_actors.runtime.state.journal import SpawnJournal
from exarch_actors.runtime.state.private import private_dirs
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.snapshot import MobileSnapshot

log = logging.getLogger(__name__)

Hosted = Agent | ProcessAgent
"""An agent of the run: driven on a thread here, or in an OS process of its own."""

HOST_CALL_THREADS = 32
"""Threads that answer agent processes' site calls (a call may wait on another host's verdict,
never on this pool, so a bounded pool only delays)."""

BIRTHS_IN_FLIGHT = 8
"""Children of a deferred spawn started but not yet born, at most (a spawn past it waits for
a birth). 300 children of one ral call, 2 cores, one sitting: with 8, a birth every 34 ms at
the start and 36 ms at the end; unbounded, 43 ms and then 81 ms, every child's boot slowed by
all the others booting beside it (docs/benchmarks.md)."""

BIRTH_THREADS = 2
"""Threads that complete births (admission and launch: a few journal appends and a frame)."""


@dataclass(frozen=True)
class FleetConfig:
    """Run-wide settings."""

    disk_warn_bytes: int | None = None
    grants: GrantPolicy = field(default_factory=GrantPolicy)
    """Every agent's grants: the command line's, narrowed per agent by the scenario's tables."""
    cwd: str | None = None
    sweep: SweepPolicy = field(default_factory=SweepPolicy)
    lease_bound: float | None = None
    """Idle-lease bound of returning sub-agents in seconds; ``None``: ``IDLE_LEASE_SECS``."""
    clock: Callable[[], float] | None = None
    """The registry's lease clock; ``None``: ``time.monotonic`` (injectable for tests)."""
    limits: ShellLimits = field(default_factory=ShellLimits)
    agents: Literal["thread", "process"] = "thread"
    """Where each agent runs: a thread of this process, or an OS process of its own
    (``actors/agent_process.py``: its drive loop, inbox and shell there; supervised)."""
    """Every shell's memory, live-worker and binding-size limits (``runtime/shell/limits.py``)."""
    durability: Durability = DEFAULT_DURABILITY
    """What an acknowledged record of the session's files survives
    (``runtime/state/durability.py``):
    every writer under the session directory keeps it while the fleet is open."""
    prices: PriceTable = field(default_factory=PriceTable)
    """Dollars per million tokens by model (``runtime/providers/prices.py``)."""
    budget: Decimal | None = None
    """``--budget USD``: the fleet is cancelled when its known spend reaches this."""
    backend: HostBackend | None = None
    """Who starts the agent processes: None for this machine's fork server; a Ray backend
    (``actors/ray_backend.py``) starts each as a Ray actor on the cluster."""
    traffic: Governor | None = None
    """The run's traffic governor (``runtime/providers/governor.py``), which its network
    providers hold: agent processes reach it through their channels (``actors/traffic_gate.py``);
    the fleet reports its figures. Its owner (the command) closes it."""
    secrets: SecretPolicy = field(default_factory=SecretPolicy)
    """The variables no shell sees (``runtime/credentials.py``): every agent's environment is
    scrubbed by it where its grants are decided, and the fork server starts without them."""
    mcp: McpSetup = field(default_factory=McpSetup)
    """The run's MCP servers, their recorded replies and the recording's sink
    (``actors/mcp_site.py``, docs/mcp.md)."""
    otlp_endpoint: str | None = None
    """An OpenTelemetry collector (OTLP/HTTP base URL) the bus's events are exported to as
    spans while the fleet runs (``runtime/observe/otel.py``; needs the ``otel`` extra)."""


class _AgentActor(QuotaActor):
    """The agent's actor: one long ``drive`` message on its own thread; control on its mailbox."""

    def __init__(self, agent: Agent, on_exit: Callable[[Agent, AgentOutcome], None]) -> None:
        self.agent = agent  # before super(): the mailbox is named after the agent
        super().__init__()
        self.cancel_scope = agent.token
        self._on_exit = on_exit

    def mailbox_recipient(self) -> str:
        return self.agent.name

    def on_receive(self, message: Any) -> Any:
        if message == "drive":
            outcome = self.agent.drive()
            try:
                self._on_exit(self.agent, outcome)
            finally:
                self.agent.done.set()
                self.actor_ref.stop(block=False)
            return outcome
        return super().on_receive(message)


class Fleet:
    """One run. Build, :meth:`start_trunk`, :meth:`wait_empty`, :meth:`close`."""

    def __init__(
        self,
        session: SessionDir,
        provider_for: Callable[[str], Provider],
        config: FleetConfig | None = None,
    ) -> None:
        self.session = session
        self.config = config or FleetConfig()
        keep_secrets_from_forks(self.config.secrets)
        endpoint = self.config.otlp_endpoint  # refused (OtelMissing) before anything starts
        spans = SpanExport(session.root, endpoint) if endpoint else None
        self._session_marker = str(session.root.resolve())
        """``$EXARCH_SESSION`` in every agent's shell (``runtime/constants.py``)."""
        self._provider_for = provider_for
        self._files: DurableFiles | None = durability.bind(session.root, self.config.durability)
        self.bus = start_bus(session.transcript)
        self._otlp = (
            LiveExport(self.bus.subscribe(LIVE_BUFFER, name="otlp"), spans)
            if spans is not None
            else None
        )
        lease: dict[str, Any] = {}
        if self.config.lease_bound is not None:
            lease["lease_bound"] = self.config.lease_bound
        if self.config.clock is not None:
            lease["clock"] = self.config.clock
        self._registry = start_registry(on_dropped=self._rejected, on_hop=self._hopped, **lease)
        self.registry = self._registry.core
        """The registry's thread-safe core: reads and the cascade never wait on a mailbox."""
        self.journal, _ = SpawnJournal.in_session(session)
        self.fanin = FanInSite(self.registry, self.journal, self.publish)
        """Where each child's end goes (a wait of its parent, or its inbox) and where a parent
        reads a reply its full inbox refused (``actors/fanin_site.py``)."""
        self._lock = threading.Lock()
        self.agents: dict[str, Agent] = {}
        """The agents driven in this process (the thread backend): what the live views read."""
        self.hosted: dict[str, Hosted] = {}
        """Every agent of the run, wherever it runs."""
        self._actors: dict[str, pykka.ActorRef[Any] | ProcessAgent] = {}
        self._executors: dict[str, AgentExecutor] = {}
        self._retained: list[RetainedChild] = []
        self._granted: dict[str, Grants] = {}
        """Each agent's grants as this process decided them (:meth:`_granted_spec`)."""
        self.trunk: Hosted | None = None
        self._empty = threading.Event()
        self._empty.set()
        self._closed = False
        self._closing = False
        self.spend = FleetSpend(self.config.prices, self.config.budget)
        """Every agent's known spend, against the budget (``runtime/settlement/cost.py``)."""
        self._pool: ThreadPoolExecutor | None = None
        self._reaper: HostReaper | None = None
        self.host_pool: HostPool | None = None
        """Warm agent processes for spawns to take (the process backend on this machine)."""
        self.boot_watch: BootWatch | None = None
        """The deadlines of children born in the background (local agent processes)."""
        self._births: ThreadPoolExecutor | None = None
        """Where a deferred spawn's birth is completed: never the pool, whose threads a spawn
        waiting for a birth slot may all hold."""
        self._births_cond = threading.Condition()
        self._in_flight = 0
        """Children started and not yet born (or failed)."""
        self.mcp = McpSite(self.config.mcp, session, self._mcp_sandbox, self.config)
        """The fleet's MCP servers, started lazily and shared by every agent
        (``actors/mcp_site.py``)."""
        self.hub = ChannelHub("channel-hub")
        """The one thread reading every local agent process's channel (its thread starts with
        the first)."""
        if self.config.agents == "process":
            self._pool = ThreadPoolExecutor(HOST_CALL_THREADS, thread_name_prefix="site")
            self._reaper = HostReaper()
            if self.config.backend is None:  # warm agent processes for spawns to take
                self.host_pool = HostPool(self.config.limits.memory_bytes)
                self.boot_watch = BootWatch(BORN_TIMEOUT)
                self._births = ThreadPoolExecutor(BIRTH_THREADS, thread_name_prefix="birth")
        self.nodes: NodeWatch | None = None
        """The cluster's nodes joining and leaving (a backend's; ``actors/ray_nodes.py``):
        each change is a ``NodeJoined`` / ``NodeLeft`` notice, and the ``fleet`` view's roster."""
        if self.config.backend is not None:
            self.nodes = self.config.backend.watch_nodes(self._node_changed)

    # --- lifecycle --------------------------------------------------------------------------

    def _node_changed(self, change: NodeChange) -> None:
        """A node joined or left: a notice in the trunk's name (the run's, not an agent's)."""
        name = self.trunk.name if self.trunk is not None else TRUNK_NAME
        data = {"node": change.node, "address": change.address, "alive": change.alive}
        self.publish(Notice(name, notice=change.notice, text=change.describe(), data=data))

    def start_trunk(
        self,
        prompt: str | None,
        *,
        interactive: bool = False,
        chat: bool = False,
        system: str | None = None,
        name: str = TRUNK_NAME,
    ) -> Hosted:
        ctx = self._fresh_context(name)
        spec = AgentSpec(
            name=name,
            construction=Construction.TRUNK,
            interactive=interactive,
            prompt=prompt,
            chat=chat,
            system=system,
            context=ctx,
        )
        entry = self.registry.register(name, None, returns=not interactive, interactive=interactive)
        spec = replace(spec, fuel=entry.fuel)
        agent = self._build(spec, self._provider_for(name), entry)
        self.trunk = agent
        self._launch(agent)
        return agent

    def _fresh_context(self, name: str) -> DynamicContext:
        """The context of an agent that starts from nothing (a trunk started, or rebuilt by
        ``resume`` after a kill during start-up, before any snapshot): the run's cwd, and its
        scratch directory in its environment, made here."""
        ctx = DynamicContext(cwd=self.config.cwd or os.getcwd())
        ctx.env[SCRATCH_ENV] = self._scratch_for(name)
        private_dirs(self.session.scratch(name))
        return ctx

    def _scratch_for(self, name: str) -> str:
        """``$EXARCH_SCRATCH`` in the agent's shell: its scratch directory. A child's is made
        by its executor at admission and removed at teardown; the trunk's is made here."""
        return str(self.session.scratch(name).resolve())

    def _sandbox_for(self, name: str) -> Sandbox:
        """The agent's kernel confinement: the run's mode and workspace (the base grant roots,
        else the run's cwd; each agent's grant roots narrow it where its host builds the
        rules) and the agent's own scratch directory -- the fleet's, never its shell's
        environment, which ral may change."""
        base = self.config.grants.base.roots
        workspace = (
            base if base is not None else (os.path.realpath(self.config.cwd or os.getcwd()),)
        )
        mode = self.config.limits.sandbox or SandboxMode.FULL_ACCESS
        capped = pid_groups.hierarchy() is not None
        return Sandbox(
            mode,
            tuple(workspace),
            False,
            self._scratch_for(name),
            self.config.limits.max_processes if capped else None,
            pid_groups.agent_group(self._session_marker, name) if capped else None,
        )

    def _mcp_sandbox(self) -> Sandbox:
        """A stdio MCP server's confinement: a shell's of the run's mode and workspace, its
        scratch the session's ``mcp`` directory."""
        sandbox = self._sandbox_for("mcp")
        return replace(sandbox, scratch=str(self.session.mcp.resolve()))

    def _granted_spec(self, spec: AgentSpec) -> AgentSpec:
        """Decide the agent's grants, once, for every way an agent is made (trunk, fork,
        branch, resume): the policy's for its name met with its parent's (as recorded here, not
        as its shell reports them) and with whatever its snapshot carries. A meet of meets, so
        never wider than the parent, the command line or any matching scenario table. The
        grants go into both the initial context and the snapshot, so a shell rebuilt from
        either (a rollback, ``/clear``) keeps them. So does the environment, scrubbed here of
        the run's secrets (``FleetConfig.secrets``) whatever it came from (the control
        process's, a parent's live scope, a snapshot an older version wrote), and marked with
        the session (``SESSION_ENV``)."""
        parent = self._granted.get(spec.parent) if spec.parent is not None else None
        grants = self.config.grants.for_agent(spec.name, parent)
        snap = spec.snapshot
        base = spec.context
        if snap is not None and snap.context:
            base = DynamicContext.from_dict(dict(snap.context))
        if base is None:  # no snapshot yet (resume after a kill during start-up)
            base = self._fresh_context(spec.name)
        grants = grants.meet(base.grants)
        env = self.config.secrets.scrub(base.env)
        env[SESSION_ENV] = self._session_marker
        sandbox = self._sandbox_for(spec.name)
        if sandbox.confined:  # tools' temporary files go where the agent may write
            env["TMPDIR"] = sandbox.scratch or env.get("TMPDIR", "")
        ctx = DynamicContext(base.cwd, env, grants, sandbox)
        if snap is not None and snap.context:
            snap = replace(snap, context=ctx.to_dict())
        self._granted[spec.name] = grants
        return replace(spec, context=ctx, snapshot=snap, mcp=self.mcp.prompt_for(grants))

    def _build(
        self,
        spec: AgentSpec,
        provider: Provider,
        entry: Entry,
        restarted: str | None = None,
        *,
        wait_born: bool = True,
    ) -> Hosted:
        """Construct the node and attach its handles; deregister if that fails.

        Every node, the trunk included (an ordinary root), registers its shell's root, so a
        cancel's hop reaches its eval and its workers."""
        agent: Hosted
        try:
            spec = self._granted_spec(spec)
            if self._pool is not None:
                agent = self._build_process(spec, provider, entry, restarted, wait_born)
            else:
                agent = Agent(self, spec, provider, entry.token, entry.inbox)
        except BaseException:
            self.registry.deregister(spec.name)
            raise
        try:
            self._attach(spec, agent)
        except BaseException:
            # its name left the registry while it was built (a /clear or /close of an
            # ancestor reaps the subtree at once): the shell just started must not outlive
            # it. Left running, an idle shell actor's thread held a drill's exit for more
            # than 5 minutes, its host blocked reading a pipe nobody would close (issue 34).
            self.stop_shell(agent)
            self.registry.deregister(spec.name)
            raise
        if wait_born:  # one born later is hosted once born (``_born``): what the views read
            with self._lock:
                self.hosted[spec.name] = agent
                if isinstance(agent, Agent):
                    self.agents[spec.name] = agent
        return agent

    def _attach(self, spec: AgentSpec, agent: Hosted) -> None:
        """Hand the registry the built agent's handles (AgentEnded if its name left meanwhile)."""
        if isinstance(agent, ProcessAgent):
            self.registry.attach(
                spec.name,
                inbox=agent.inbox,  # type: ignore[arg-type]  # its signals cross as one frame
                interrupt=agent.interrupt,
            )
        else:
            # a cascade ends the agent, the trunk as any other: its busy host is killed, not
            # asked (EvalRoot.end), the root made terminal before the agent's token trips (the
            # ending hook, run first when the cancel's signal arrives on its inbox)
            self.registry.attach(
                spec.name,
                eval_root=agent.eval_root.end,
                interrupt=agent.interrupt,
                ending=agent.eval_root.make_terminal,
            )

    def _build_process(
        self,
        spec: AgentSpec,
        provider: Provider,
        entry: Entry,
        restarted: str | None = None,
        wait_born: bool = True,
    ) -> ProcessAgent:
        """An agent in an OS process of its own, started from the one fork server (or by
        the fleet's backend)."""
        assert self._pool is not None
        recorder = provider.recorder if isinstance(provider, RecordingProvider) else None
        boot = HostBoot(
            spec,
            unrecorded(provider),
            self.session,
            self.config.disk_warn_bytes,
            self.config.limits,
            self.config.durability,
            self.spend.prices,
            budget=self.spend.budget is not None,
            record=recorder is not None,
            restarted=restarted,
        )
        return ProcessAgent(
            self,
            boot,
            entry.token,
            pool=self._pool,
            on_exit=self._agent_exited,
            backend=self.config.backend,
            recorder=recorder,
            host_pool=self.host_pool,
            hub=self.hub,
            wait_born=wait_born,
        )

    def _as_recorded(self, parent: str, provider: Provider) -> Provider:
        """A provider from an agent process's request crosses without its recorder
        (``--record``): wrapped again here in the parent's, so the child is recorded too."""
        host = self.hosted.get(parent)
        if isinstance(host, ProcessAgent) and host.recorder is not None:
            return RecordingProvider(unrecorded(provider), host.recorder, parent)
        return provider

    def _launch(self, agent: Hosted) -> None:
        born = Born(
            agent.name,
            parent=agent.parent,
            returns=agent.returns,
            interactive=agent.interactive,
            fuel=agent.fuel,
            pid=agent.pid if isinstance(agent, ProcessAgent) else os.getpid(),
            node=agent.node if isinstance(agent, ProcessAgent) else "local",
        )
        if isinstance(agent, ProcessAgent):
            with self._lock:
                self._actors[agent.name] = agent
                self._empty.clear()
            self.publish(born)
            agent.launch()
            return
        ref = _AgentActor.start(agent, self._agent_exited)
        with self._lock:
            self._actors[agent.name] = ref
            self._empty.clear()
        self.publish(born)
        ref.tell("drive")

    def adopt_agent(
        self, spec: AgentSpec, provider: Provider, *, restarted: str | None = None
    ) -> Hosted:
        """``resume``: register ``spec`` (``resume=True``: log and snapshot from the durable
        files) in tree order and build it, without journalling a new spawn -- a child keeps the
        slot it was admitted with (same environment id, a new shell pid, as after a rollback).
        Launch with :meth:`launch_adopted` once the whole tree is registered. ``restarted``:
        the cause an agent host is told it recovers from (the process backends; a host then
        settles pending calls and queues what it owes, as after a crash)."""
        entry = self.registry.register(
            spec.name, spec.parent, returns=not spec.interactive, interactive=spec.interactive
        )
        spec = replace(spec, fuel=entry.fuel, generation=entry.generation)
        agent = self._build(spec, provider, entry, restarted=restarted)
        if spec.parent is None:
            self.trunk = agent
        else:
            self._executors[spec.name] = AgentExecutor(agent, self.stop_shell)
            if not spec.interactive:  # a returning child: its end is its parent's to collect
                self.fanin.spawned(spec.parent, spec.name)
        return agent

    def admit_adopted(self, name: str) -> None:
        """``resume``: the journal's admission of an adopted child whose birth a control kill
        cut short (spawned, never admitted), as :meth:`spawn` admits a child before its launch.
        A refusal settles it ``down`` (``admit``), told to its parent as any end."""
        admit(
            self.journal,
            name,
            self._executors[name],
            ExecutionSpec(node_id=name),
            parent=self.journal.state.nodes[name].spawned.get("parent"),
        )

    def launch_adopted(self, agent: Hosted) -> None:
        """Start an adopted agent's drive loop (Born on the bus, as for a fresh one)."""
        self._launch(agent)

    def cancel_all(self, cause: str) -> None:
        """Cancel the whole tree (Ctrl-C, close): every node's token and eval root."""
        if self.trunk is not None:
            self.registry.cancel(self.trunk.name, cause)

    def wait_empty(self, timeout: float | None = None) -> bool:
        """Block until every agent has ended."""
        return self._empty.wait(timeout)

    def close(self) -> FleetYield:
        """Cancel whatever still runs, sweep retained slots, stop the actors; return the yield."""
        if self.trunk is not None and not self._empty.is_set():
            self.registry.cancel(self.trunk.name, "close")
        self._empty.wait(10.0)
        with self._lock:  # a birth completed from now on is abandoned (``_born``)
            self._closing = True
        with self._births_cond:  # and no spawn waits for a birth slot any more
            self._births_cond.notify_all()
        with self._lock:
            retained, self._retained = self._retained, []
        if retained:
            release_sweep(self.journal, retained, policy=self.config.sweep)
        with self._lock:
            refs = list(self._actors.values())
            never_driven = [a for a in self.hosted.values() if not a.done.is_set()]
        for agent in never_driven:  # built but never launched (or stuck): stop their shells
            self.stop_shell(agent)
            self.registry.deregister(agent.name)
        for ref in refs:
            if isinstance(ref, ProcessAgent):
                ref.shutdown("close")
                continue
            try:  # a stop waits behind the actor's work: a Cancel first ends a stuck drive
                ref.tell(Cancel("close"))
                ref.stop(block=True, timeout=5.0)
            except Exception:  # already stopped (ActorDeadError): the state wanted
                pass
        if self.nodes is not None:
            self.nodes.close()
        if self.boot_watch is not None:
            self.boot_watch.close()
        if self._births is not None:
            self._births.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._reaper is not None:  # after the pool: a settlement on it may hand one over
            self._reaper.close()
        if self.host_pool is not None:
            self.host_pool.close()
        self.hub.close()  # after every host's shutdown: their ends of file are read on it
        self.mcp.close()  # after every agent: no request can begin once its servers stop
        pid_cgroup.sweep_session(self._session_marker)  # whatever a dead host left behind
        try:
            self._registry.stop()
            self.bus.stop()
            if self._otlp is not None:  # the bus is closed: its last events, then a flush
                self._otlp.close()
        finally:
            self._closed = True
            files, self._files = self._files, None
            if files is not None:  # every written record durable under the policy, files closed
                durability.unbind(files)
        return fleet_yield(self.journal.state)

    def prices(self) -> PriceTable:
        return self.spend.prices

    def charge(self, name: str, cost: Decimal | None) -> None:
        if self.spend.charge(cost):
            self.publish(SystemNote(name, text=self.spend.budget_message()))
            self.cancel_all("budget")

    @property
    def budget_reached(self) -> bool:
        return self.spend.reached

    def fleet_cost(self) -> FleetCost:
        """Money per agent: the live meters (an agent process's as of its end), and for a child
        settled before this process (``resume``) the cost its terminal record holds."""
        with self._lock:
            agents = dict(self.hosted)
        figures = {name: a.stats.spend.read().to_json() for name, a in agents.items()}
        for nid, record in self.journal.state.terminal_records().items():
            spend = record.get("spend")
            if nid not in figures and isinstance(spend, dict):
                usd = spend.get("costUsd")
                figures[nid] = {"usd": usd, "knownUsd": usd or "0"}
        budget = self.spend.budget
        return FleetCost(
            figures,
            self.spend.prices.date,
            dollars(budget) if budget is not None else None,
            self.spend.reached,
        )

    def write_result(self, outcome: str, reply: str | None, **extra: Any) -> FleetYield:
        traffic = self.config.traffic
        fy = fleet_yield(
            self.journal.state,
            self.fleet_cost(),
            traffic.figures() if traffic is not None else None,
        )
        with durability.bound_to(self.session.root, self.config.durability):
            write_result(self.session, outcome, reply, fy, **extra)
        return fy

    # --- the agents' site (actors/agent_site.py) --------------------------------------------

    @property
    def disk_warn_bytes(self) -> int | None:
        return self.config.disk_warn_bytes

    def publish(self, event: Event) -> None:
        self.bus.publish(event)

    def publish_queued(self, events: Iterable[Event]) -> None:
        """An agent process's event batch, from its channel's reader: queued for the bus
        thread, never written on the reader (:meth:`BusHandle.publish_queued`)."""
        self.bus.publish_queued(events)

    def record_rejected(self, rejection: InboxRejected) -> None:
        self.bus.record_rejected(rejection)

    def _hopped(self, hop: CancelHop) -> None:
        """A cancel's hop (``transcript.jsonl``'s ``CancelHop``): queued for the bus thread, so
        a cascade writes nothing on its own path."""
        self.bus.publish_queued((hop,))

    def _rejected(self, rejection: InboxRejected) -> None:
        """The registry's record of a delivery it could not make: written, then a child's
        result refused by a full inbox is held for its parent to read (``fanin``)."""
        self.bus.record_rejected(rejection)
        self.fanin.refused(rejection)

    # --- fan-in (actors/fanin_site.py) ------------------------------------------------------

    def wait_children(
        self,
        parent: str,
        wait_id: str,
        names: tuple[str, ...] | None,
        then: Callable[[WaitAnswer], None],
    ) -> WaitAnswer | None:
        """``agent-wait``: the answer now, or None and ``then`` called when it completes."""
        return self.fanin.wait_children(parent, wait_id, names, then)

    def stop_wait(self, parent: str, wait_id: str, give_back: bool) -> WaitAnswer | None:
        return self.fanin.stop_wait(parent, wait_id, give_back)

    def give_back(self, parent: str, ends: tuple[ChildEnd, ...]) -> None:
        self.fanin.give_back(parent, ends)

    def read_result(self, parent: str, child: str) -> tuple[dict[str, Any], int]:
        return self.fanin.read_result(parent, child)

    def mcp_begin(self, request: McpRequest, then: Callable[[Any], None]) -> None:
        """``mcp`` / ``mcp-tools`` of an agent, within its grants (``actors/mcp_site.py``)."""
        self.mcp.begin(self._granted.get(request.agent), request, then)

    def mcp_cancel(self, agent: str, call_id: str) -> None:
        self.mcp.cancel(agent, call_id)

    def before_wait(self) -> None:
        """Nothing to send: an agent in this process publishes on the bus directly."""

    def standing(self, name: str) -> Standing:
        entry = self.registry.lookup(name)
        if entry is None:
            return Standing(registered=False)
        return Standing(registered=True, cancel_cause=entry.cancel_cause)

    def park_reads(self, name: str) -> ParkReads:
        return ParkReads(
            listed=self.registry.is_live(name),
            engaged=self.registry.engaged(name),
            live_descendants=self.registry.has_live_descendants(name),
        )

    def generation(self) -> int:
        return self.registry.generation

    def deliver(self, name: str, item: Surface, sender: str) -> None:
        self.registry.deliver(name, item, sender=sender)

    def cancel_subtree(self, name: str, cause: str) -> None:
        self.registry.cancel(name, cause)

    def clear_subtree(self, name: str) -> int:
        return self.registry.clear_subtree(name)

    def start_shell(
        self,
        name: str,
        desk: Any,
        context: DynamicContext | None,
        snapshot: MobileSnapshot | None,
    ) -> ShellParts:
        """The agent's shell, its surfaced worker completions delivered through the registry."""
        return start_agent_shell(
            name,
            self.session,
            desk,
            context,
            snapshot,
            limits=self.config.limits,
            publish=self.publish,
            deliver=self.deliver,
            sync_log=self.config.durability is Durability.MACHINE,  # machine: survive power loss
        )

    def _local(self, name: str) -> Agent:
        """An agent driven in this process (the site's shell calls come only from those)."""
        agent = self.agents[name]
        assert isinstance(agent, Agent), f"{name} runs in its own process"
        return agent

    def run_shell(self, name: str, script: str) -> ShellOutput:
        return run_agent_shell(self._local(name), self.session.commits(name), script)

    def stop_shell(self, agent: Hosted) -> None:
        """Idempotent: a shell already stopped is the state wanted. An agent process that
        ended in order has stopped its own shell; any other is shut down with its shell."""
        if isinstance(agent, ProcessAgent):
            agent.stop_shell()
        else:
            stop_agent_shell(agent.name, agent.shell)

    def message(self, sender: str, name: str, text: str | AgentMessage) -> None:
        """Model-facing: renews nothing; InboxFull / UnknownAgent reach the sending script.

        A message the recipient's inbox took is recorded (``MessageSent``, acknowledged under
        the durability policy) before the sender's call returns, so a control process killed
        before the recipient logged it loses nothing: ``resume`` delivers each recorded one no
        log holds (``actors/resume.py``). Recorded after the push, not before: a refused one
        (full inbox, recipient ended) is the sender's error and nobody's to deliver, and one
        killed between the push and the record was never acknowledged to its sender (its call
        is settled interrupted on resume), as a record torn mid-write is not. An
        :class:`AgentMessage` is a message delivered again (an agent process's restart gives
        it once more what its dead process took): recorded when first sent, not again."""
        if isinstance(text, AgentMessage):
            self.registry.message(sender, name, text)
            return
        msg = AgentMessage(sender, text, uuid4().hex)
        self.registry.message(sender, name, msg)
        self.bus.record_sent(MessageSent(name, sender=sender, id=msg.id, text=text))
        crash_point("message-sent-before-logged")

    def cancel_descendant(self, name: str, target: str) -> bool:
        """``agent-cancel NAME``: resolves descendants only; an ended one is a no-op (False)."""
        if target in self.registry.live_descendants(name):
            self.registry.cancel(target, "agent-cancel")
            return True
        if self.registry.is_live(target):
            raise DeskRefusal(f"agent-cancel: {target!r} is not a descendant of {name}")
        return False

    def resources(self, name: str) -> Resources:
        """The probe fold for ``/resources``: read-only, renews nothing, never model-facing."""
        agent = self._local(name)
        lease = self.lease_figures(name)
        return agent_resources(agent, self.session, self.config.disk_warn_bytes, lease)

    def lease_figures(self, name: str) -> dict[str, Any]:
        """The fleet's rows of /resources: nearest time-to-reap among leased descendants, and
        the traffic governor's figures (``traffic``; absent for a run without one)."""
        now = self.registry.tree.clock()
        nearest: float | None = None
        for child in self.registry.live_descendants(name):
            entry = self.registry.lookup(child)
            if entry is not None and entry.lease is not None:
                left = entry.lease.remaining(now)
                nearest = left if nearest is None else min(nearest, left)
        figures: dict[str, Any] = {
            "nearest_reap_secs": nearest,
            "bound_secs": self.registry.tree.lease_bound,
        }
        if self.config.traffic is not None:
            figures["traffic"] = self.config.traffic.figures()
        return figures

    # --- spawn and settle -------------------------------------------------------------------

    def spawn(self, request: SpawnRequest, *, born_later: bool = False) -> dict[str, Any]:
        """The ``agent NAME PROMPT [memory: BOOL]`` verb: register, fork, admit, launch; a start
        receipt.

        ``request.fork`` is the parent's live scope at the fork point; the child's grants are
        the parent's narrowed by the fleet's policy (a meet: never wider; :meth:`_granted_spec`).
        A failure after the child is built tears it down (:meth:`_abandon_spawn`) and raises
        :class:`SpawnFailed`: a child that never runs must never be waited for. With
        ``request.memory`` the child's event log first imports the parent's model-visible
        context (:meth:`runtime.state.eventlog.AgentLog.fork_context`, taken by the parent's desk:
        the
        tool-call frame the parent is dispatching right now is left out, so the child inherits a
        request context, never a dangling protocol); without it the child inherits nothing.
        Either way the prompt enters through the child's inbox, the same turn path as any other
        input. Runs on the parent's shell thread while the parent's own thread waits for the
        run, so its log is still.

        ``born_later`` (an agent process's ``agent`` verb: ``SITE_CALLS``): a child in a local
        agent process returns its receipt once its process is started and its boot sent; its
        admission and launch follow its ``Born`` (:meth:`_born`), with at most
        :data:`BIRTHS_IN_FLIGHT` children being born at once, so a batch of ``agent`` verbs
        boots its children side by side instead of one after the other. Its parent's
        ``agent-wait`` counts it at once; a birth that fails ends it ``failed`` (its slot
        ``down``), told to the parent as any end, instead of raising here."""
        name, parent = request.name, request.parent
        if name in self.journal.state.nodes and self.registry.lookup(name) is None:
            raise NameUsed(name)
        entry = self.registry.register(name, parent, returns=True, interactive=False)
        try:
            snapshot = request.fork
            ctx = None
            if snapshot is not None and snapshot.context:
                ctx = DynamicContext.from_dict(dict(snapshot.context))
                ctx.env[SCRATCH_ENV] = self._scratch_for(name)  # its own, not the parent's
                snapshot = replace(snapshot, context=ctx.to_dict())
            spec = AgentSpec(
                name=name,
                parent=parent,
                construction=Construction.FORK,
                fuel=entry.fuel,
                prompt=request.prompt,
                context=ctx,
                snapshot=snapshot,
                generation=entry.generation,
            )
            provider = self._as_recorded(request.parent, request.provider).for_agent(name)
        except BaseException:
            self.registry.deregister(name)
            raise
        # a local agent process is born in the background: a batch of spawns boots side by side
        deferred = born_later and self.boot_watch is not None and request.memory is None
        if deferred:
            try:
                self._birth_slot(name)
            except BaseException:
                self.registry.deregister(name)
                raise
        try:
            agent = self._build(spec, provider, entry, wait_born=not deferred)
        except BaseException:
            if deferred:
                self._birth_done()
            raise
        receipt = {"agent": name, "status": "started", "fuel": entry.fuel, "parent": parent}
        if deferred:
            assert isinstance(agent, ProcessAgent) and self.boot_watch is not None
            executor = AgentExecutor(agent, self.stop_shell)
            with self._lock:
                closing = self._closing
                if not closing:  # else close's shutdown of every agent may have passed it by
                    self._executors[name] = executor
                    self._actors[name] = agent  # not empty while it is being born
                    self._empty.clear()
            if closing:
                agent.shutdown("close")
                self.registry.deregister(name)
                self._birth_done()
                raise SpawnFailed(name, AgentProcessFailed("the fleet is closing"))
            # its slot is on disk before the receipt: the parent may log "started" before the
            # birth admits it, and a control kill between the two left a child no journal
            # knew of -- resume never ran it, nor told the parent (its wait came back short)
            try:
                self.journal.spawned(name, parent=parent, prompt=request.prompt)
            except BaseException as e:
                with self._lock:
                    self._executors.pop(name, None)
                    self._actors.pop(name, None)
                agent.shutdown("close")
                self.registry.deregister(name)
                self._birth_done()
                if not isinstance(e, Exception):
                    raise
                raise SpawnFailed(name, e) from e
            self.fanin.spawned(parent, name)
            self.boot_watch.watch(name, agent.kill_unborn)
            assert self._births is not None
            agent.when_known(lambda: self._born(agent, executor), self._births)
            return receipt
        if request.memory is not None:
            try:
                agent.import_context(
                    request.memory, f"memory: inherited {len(request.memory)} events from {parent}"
                )
            except BaseException:  # never launched: nothing of it may stay behind
                self.stop_shell(agent)
                with self._lock:
                    self.agents.pop(name, None)
                    self.hosted.pop(name, None)
                self.registry.deregister(name)
                raise
        executor = AgentExecutor(agent, self.stop_shell)
        self._executors[name] = executor
        try:  # the prompt is journalled: a child killed before its log took it resumes with it
            self.journal.spawned(name, parent=parent, prompt=request.prompt)
            admit(self.journal, name, executor, ExecutionSpec(node_id=name), parent=parent)
        except Exception as e:
            self._abandon_spawn(agent, executor, e)
            raise SpawnFailed(name, e) from e
        except BaseException as e:  # cancellation: clean up, never swallow it
            self._abandon_spawn(agent, executor, e)
            raise
        self.fanin.spawned(parent, name)
        self._launch(agent)
        return {**receipt, "memory": True} if request.memory is not None else receipt

    def _born(self, agent: ProcessAgent, executor: AgentExecutor) -> None:
        """A deferred spawn's second half, on the fleet's pool once its host reported ``Born``
        (or ended before it): the journal's admission, then the launch -- as the synchronous
        spawn does them, in the same order, so a child never runs before ``dispatched``. A
        birth that failed settles the child ``down`` and tells its parent as for any end (its
        ``agent-wait`` or its inbox): the parent's verb already returned, so nothing else
        could."""
        assert self.boot_watch is not None
        pause_point("birth-before-admission")  # tests/drills/test_birth_kill.py kills here
        self.boot_watch.done(agent.name)
        self._birth_done()
        name, parent = agent.name, agent.parent
        assert parent is not None
        try:
            if self._closing:  # its launch would find the fleet's threads stopping
                raise AgentProcessFailed(f"agent {name}: the fleet closed before its birth")
            agent.take_birth()
            admit(self.journal, name, executor, ExecutionSpec(node_id=name), parent=parent)
        except BaseException as e:
            reason = f"spawn failed: {e}"
            if name not in self.journal.state.nodes:
                with contextlib.suppress(Exception):  # so its down settlement has a slot
                    self.journal.spawned(name, parent=parent)
            end = ChildEnd(name, "failed", None, reason, generation=agent.spec.generation)
            self._abandon_spawn(agent, executor, e, told=lambda: self.fanin.settle(parent, end))
            with self._lock:
                self._actors.pop(name, None)
                empty = not self._actors
            if empty:
                self._empty.set()
            if not isinstance(e, Exception):
                raise
            return
        with self._lock:
            self.hosted[name] = agent
        pause_point("admitted-before-launch")  # tests/drills/test_birth_kill.py kills here
        self._launch(agent)

    def _birth_slot(self, name: str) -> None:
        """Wait until fewer than :data:`BIRTHS_IN_FLIGHT` children are being born; a fleet
        closing starts no more (:class:`SpawnFailed`)."""
        with self._births_cond:
            self._births_cond.wait_for(lambda: self._in_flight < BIRTHS_IN_FLIGHT or self._closing)
            if self._closing:
                raise SpawnFailed(name, AgentProcessFailed("the fleet is closing"))
            self._in_flight += 1

    def _birth_done(self) -> None:
        with self._births_cond:
            self._in_flight -= 1
            self._births_cond.notify()

    def _abandon_spawn(
        self,
        agent: Hosted,
        executor: AgentExecutor,
        error: BaseException,
        told: Callable[[], None] | None = None,
    ) -> None:
        """Undo a spawn that failed before launch: the slot the journal opened (if any) settles
        ``down`` (tearing its environment down), the shell stops, the parent is ``told`` (a
        deferred birth's) and the child leaves the registry, so its parent's park verdict
        stops counting it and nothing waits for it. Each step runs even if an earlier one
        fails (a broken journal is why we are here)."""
        with self._lock:
            self._executors.pop(agent.name, None)
            self.agents.pop(agent.name, None)
            self.hosted.pop(agent.name, None)
        node = self.journal.state.nodes.get(agent.name)
        if node is not None and node.open:
            try:
                settle_child(
                    self.journal,
                    agent.name,
                    executor,
                    status="down",
                    reason=f"spawn failed: {error}",
                )
            except Exception:
                log.exception("settling the failed spawn of %s failed", agent.name)
        self.stop_shell(agent)
        if told is not None:
            try:
                told()
            except Exception:
                log.exception("telling %s's parent of its failed spawn failed", agent.name)
        self.registry.deregister(agent.name)

    def branch(self, request: BranchRequest) -> str:
        """``/branch``: a conversing peer of ``request.parent`` with its verbatim authority and
        context; the name it got.

        The branch forks the parent's durable shell snapshot and imports its model-visible
        context; it returns nothing (``returns`` is false for a branch), parks Held for its
        human, and is not journalled as a spawned child (it is a peer tab, not delegated work).
        The request is built on the parent's own thread (a slash command at its turn boundary).
        """
        base = request.name or f"{request.parent}-branch"
        name = base
        n = 1
        while self.registry.lookup(name) is not None:
            n += 1
            name = f"{base}-{n}"
        entry = self.registry.register(name, request.parent, returns=False, interactive=True)
        try:
            spec = AgentSpec(
                name=name,
                parent=request.parent,
                construction=Construction.BRANCH,
                interactive=True,
                fuel=entry.fuel,
                snapshot=request.snapshot,
                generation=entry.generation,
            )
            provider = self._as_recorded(request.parent, request.provider).for_agent(name)
        except BaseException:
            self.registry.deregister(name)
            raise
        agent = self._build(spec, provider, entry)
        agent.import_context(request.context)
        self._launch(agent)
        return name

    def _agent_exited(self, agent: Hosted, outcome: AgentOutcome) -> None:
        """The spawn site's settle: journal, result to the parent, deregister, Died."""
        try:
            if agent.parent is not None:
                self._settle_child(agent, outcome)
            else:
                pause_point("trunk-ended-before-died")  # tests/drills/test_reply_kill.py
        finally:
            self.stop_shell(agent)  # idempotent: a child's teardown already closed it
            self.mcp.agent_ended(agent.name)
            self.fanin.parent_ended(agent.name)
            # a cancelled parent passes its own cause on, as an exit signal carries its reason
            self.registry.cancel_descendants(agent.name, agent.terminated or "parent ended")
            self.registry.deregister(agent.name)
            agent.record_leftovers()  # delivered between the agent's exit and deregister
            if agent.parent is not None:
                crash_point("delivered-before-died")
            reply = render(agent.reply_value) if agent.parent is None and agent.replied else None
            self.publish(
                Died(agent.name, outcome=outcome.value, cause=agent.terminated, reply=reply)
            )
            with self._lock:
                self._actors.pop(agent.name, None)
                empty = not self._actors
            if isinstance(agent, ProcessAgent) and self._reaper is not None:
                agent.release(self._reaper)  # settled: now its process may go
            if empty:
                self._empty.set()

    def _settle_child(self, agent: Hosted, outcome: AgentOutcome) -> None:
        executor = self._executors.get(agent.name)
        if executor is None:
            return
        pause_point("ended-before-settlement")  # tests/durability/test_disk_full.py fills here
        executor.finished(outcome)
        text, value = reply_fields(agent.reply_value) if agent.replied else (None, None)
        self.journal.execution_result(
            agent.name,
            turn=agent.stats.turns,
            events=[],
            snapshot=executor.snapshot_at_end(),
            outcome=outcome.value,
            reply=text,
            replyValue=value,
            reason=None if agent.replied else self._end_reason(agent, outcome),
            eventLog=executor.event_log,
        )
        if outcome is AgentOutcome.CANCELLED:
            cancel_child(self.journal, agent.name, executor)
        else:
            status = settlement_status(outcome.value)
            observable = executor.observable()
            settle_child(
                self.journal,
                agent.name,
                executor,
                status=status,
                reason=outcome.value,
                observable=observable,
                cause=executor.unobservable_cause(),
            )
            if not observable:
                with self._lock:
                    self._retained.append(RetainedChild(agent.name, executor))
        crash_point("settled-before-delivery")
        replied = agent.replied and agent.reply_value is not None
        end = ChildEnd(
            agent.name,
            outcome.value,
            agent.reply_value if replied else None,
            None if replied else self._end_reason(agent, outcome),
            generation=agent.spec.generation,
        )
        parent = agent.parent
        assert parent is not None
        # To a wait of the parent, else its inbox; no synchronous caller is left there: a
        # refusal is recorded in transcript.jsonl by deliver, and held for the parent to read.
        self.fanin.settle(parent, end)

    @staticmethod
    def _end_reason(agent: Hosted, outcome: AgentOutcome) -> str:
        """Why a child ended without a reply, as its parent reads it."""
        cause = agent.terminated
        if cause is not None:
            return cause if outcome is not AgentOutcome.CANCELLED else f"cancelled: {cause}"
        if agent.stats.end_reason is not None:
            return agent.stats.end_reason
        return "ended without a reply" if outcome is AgentOutcome.QUIESCED else outcome.value
