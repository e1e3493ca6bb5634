"""The agent process itself: the host side of the process backend (``actors/agent_process.py``).

Forked by the control process's one fork server, an agent process builds the very
:class:`actors.agent.Agent` of the thread backend with a :class:`HostSite` for its
:class:`actors.agent_site.AgentSite`: the agent's own half stays here -- its shell
(:mod:`actors.agent_shell`), its inbox, its event log and snapshot files -- and the fleet's half
crosses the channel (``runtime/fleet/agent_channel.py``) as :class:`Call` requests. The control side
(:class:`actors.agent_process.ProcessAgent`) calls back in through :data:`HOST_CALLS`.

Invariants:
- Handlers here never wait on the control side: inbox pushes, launch, context imports and
  probes are answered at once on the channel's reader thread.
- Bus events are batched (a flush every 5 ms, and before every call and the end), and always
  reach the control side before any request made after them.
- A cancel frame trips the agent's token, its shell's eval root (not the trunk's: its session
  outlives a cancel, as in the thread backend) and its inbox, from the reader thread, while the
  main thread may be blocked in the very run it stops.
- An orderly end stops the shell first, then is reported (``Ended``); the process then waits for
  ``Shutdown`` (sent once its slot is settled), recording what its inbox still holds; anything
  else the control side sees is a crash.
- Threads: main (the drive loop), the channel reader, the flusher, the shell actor's (and, at
  the start, the one that starts the shell host while the agent is built).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from multiprocessing.connection import Connection
from typing import Any

from actors.agent import Agent, AgentOutcome, AgentSpec, AgentStats
from actors.agent_shell import agent_resources, run_agent_shell, start_agent_shell, stop_agent_shell
from actors.agent_site import (
    BranchRequest,
    ParkReads,
    ShellOutput,
    ShellParts,
    SpawnRequest,
    Standing,
)
from actors.channel import AgentChannel
from actors.host_start import HostStart
from actors.process import become_group_leader, die_with_parent, use_fork_server
from runtime.cancel import CancelScope
from runtime.errors import ExarchError
from runtime.events import Event, InboxRejected, Resources
from runtime.fleet.agent_channel import (
    BornFrame,
    Call,
    CancelFrame,
    ChannelMessage,
    Ended,
    Envelope,
    InterruptFrame,
    PublishFrame,
    ReturnFrame,
    Shutdown,
)
from runtime.fleet.inbox import Inbox, InboxMsg, PushEffect, Surface, UserSteering
from runtime.messages import AssistantMessage
from runtime.providers.base import Provider
from runtime.providers.prices import PriceTable
from runtime.shell.limits import ShellLimits
from runtime.state import durability
from runtime.state.durability import Durability
from runtime.state.session_dir import SessionDir
from runtime.state.snapshot import MobileSnapshot

CALL_TIMEOUT = 120.0
"""Seconds a site call may wait for its answer (a spawn waits for its child's ``BornFrame``)."""

FLUSH_EVERY = 0.005
"""Seconds a buffered bus event may wait for the flush that sends it with any that follow."""

IDLE_CHECK = 1.0
"""Seconds between the idle flusher's looks at whether its channel closed."""

RESTART_NOTE = (
    "[system note] Your process was restarted after a crash. Any tool call that was in flight "
    "is marked interrupted; your shell holds every binding of the calls that completed. "
    "Continue where you left off."
)


class SiteRefused(ExarchError):
    """The other end's site refused a call with an error that could not cross as itself."""


@dataclass(frozen=True)
class HostBoot:
    """Everything an agent host is started with (pickled into the new process)."""

    spec: AgentSpec
    provider: Provider
    session: SessionDir
    disk_warn_bytes: int | None
    limits: ShellLimits
    durability: Durability
    """The run's policy: the host's own writers (event log, binding log, commit records) keep it."""
    prices: PriceTable
    restarted: str | None = None
    """The crash this start recovers from; None for a first start."""


@dataclass(frozen=True)
class EndReport:
    """What the control side needs of an agent that ended in order."""

    outcome: AgentOutcome
    cause: str | None
    replied: bool
    reply_value: Any
    stats: AgentStats
    shell_stopped: bool = False
    """Its shell was closed and reaped here before ``Ended`` was sent: the spawn site's
    teardown finds it stopped and need not wait for this process to exit."""


def unpickle(data: bytes) -> Any:
    return pickle.loads(data) if data else None


def pickled_error(error: BaseException) -> bytes:
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps(SiteRefused(str(error) or type(error).__name__))


def answer_call(channel: AgentChannel, rid: int, fn: Callable[[], Any]) -> None:
    try:
        value = fn()
    except Exception as e:  # the caller re-raises it: a typed refusal stays typed
        channel.reply(rid, ReturnFrame(error=pickled_error(e)))
        return
    channel.reply(rid, ReturnFrame(pickle.dumps(value)))


def request_call(
    channel: AgentChannel, method: str, *args: Any, timeout: float = CALL_TIMEOUT
) -> Any:
    reply = channel.request(Call(method, pickle.dumps(args)), timeout)
    if not isinstance(reply, ReturnFrame):
        raise SiteRefused(f"{method}: unexpected reply {reply.KIND}")
    if reply.error is not None:
        raise unpickle(reply.error)
    return unpickle(reply.payload)


# -- host side --------------------------------------------------------------------------------


def agent_process_main(
    conn: Connection,
    fork_address: str,
    boot: HostBoot | None,
    memory_bytes: int | None = None,
) -> None:
    """Process entry point of an agent host (runs in the fork-server child). ``boot`` None:
    the boot arrives pickled on ``conn`` (at once for a cold start; once a spawn takes it for a
    pooled process, ``actors/host_pool.py``), and its shell host, with ``memory_bytes``,
    starts while it waits."""
    become_group_leader()
    die_with_parent()
    # started as a daemon (so the control process's exit terminates it), but a daemonic
    # multiprocessing process may not start children, and this one starts its shell host
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    use_fork_server(fork_address)
    # the shell starts now, in parallel with everything below (its agent, its files)
    if boot is None:
        shell = HostStart(multiprocessing.current_process().name, memory_bytes)
        try:
            boot = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the pool closed before a spawn took this process
            shell.discard()
            return
        except BaseException:  # a boot that does not unpickle: nothing may stay behind
            shell.discard()
            raise
        assert isinstance(boot, HostBoot)
    else:
        shell = HostStart(boot.spec.name, boot.limits.memory_bytes)
    files = durability.bind(boot.session.root, boot.durability)
    try:
        AgentProcess(conn, boot, shell_start=shell).serve()
    finally:
        shell.discard()  # never taken (the agent failed before its shell booted)
        durability.unbind(files)


class AgentProcess:
    """The host's state: its channel, its agent, its event buffer. Threads: main (the drive
    loop), the channel reader, the flusher, and the agent's shell actor. ``node`` names where
    it runs (``"local"``, or the Ray node id of a host a ``HostBackend`` started)."""

    def __init__(
        self,
        conn: Connection,
        boot: HostBoot,
        node: str = "local",
        shell_start: HostStart | None = None,
    ) -> None:
        self.boot = boot
        self.shell_start = shell_start
        """Its shell host, started ahead (``agent_process_main``); None: the shell starts one."""
        self.node = node
        self.name = boot.spec.name
        self.token = CancelScope()
        self.inbox = Inbox(recipient=self.name)
        self.agent: Agent | None = None
        self._launched = threading.Event()
        self._stop = threading.Event()
        self._cancel: str | None = None
        self._buffer: list[Event] = []
        self._buffer_lock = threading.Lock()
        self._buffered = threading.Event()
        """Set while the buffer holds an event: the flusher sleeps until then."""
        self.channel = AgentChannel(
            conn,
            peer="control",
            on_control=self._control,
            on_request=self._request,
            on_eof=self._eof,
        )

    def serve(self) -> None:
        self.channel.start()
        threading.Thread(target=self._flush_loop, name="flush", daemon=True).start()
        agent: Agent | None = None
        try:
            spec = self.boot.spec
            if self.boot.restarted is not None:
                spec = replace(spec, prompt=None, resume=True)
            agent = Agent(HostSite(self), spec, self.boot.provider, self.token, self.inbox)
            self.agent = agent
            if self._cancel is not None:  # a cancel that overtook the boot
                self._trip(self._cancel)
            if self.boot.restarted is not None:
                self._after_restart(agent)
            born = BornFrame(self.name, os.getpid(), agent.shell_pid(), spec.generation, self.node)
            self.channel.send(born)
            while not (self._launched.wait(0.05) or self._stop.is_set()):
                pass
            if self._launched.is_set():
                agent.drive()
                # the shell goes first, here and in parallel with every other ending agent:
                # the settlement then finds the environment stopped (the 100-agent cascade
                # waited on each process's exit before, docs/benchmarks.md)
                stop_agent_shell(self.name, agent.shell)
                report = EndReport(
                    agent.outcome or AgentOutcome.FAILED,
                    agent.terminated,
                    agent.replied,
                    agent.reply_value,
                    agent.stats,
                    shell_stopped=True,
                )
                self.flush()
                self.channel.try_send(Ended(self.name, pickle.dumps(report)))
                self._stop.wait()
                agent.record_leftovers()  # pushed between its end and its deregistration
        finally:
            if agent is not None:
                stop_agent_shell(self.name, agent.shell)
            self.flush()
            self.channel.close()

    def _after_restart(self, agent: Agent) -> None:
        """The per-agent half of ``resume``: pending calls settled, then a nudge to go on."""
        if agent.log.pending_tool_calls:
            agent.log.settle_pending()
        if agent.log.event_count == 0 and self.boot.spec.prompt is not None:
            self.inbox.push(UserSteering(self.boot.spec.prompt))
        elif _owes_a_response(agent):
            self.inbox.push(UserSteering(RESTART_NOTE))

    # -- bus events ----------------------------------------------------------------------------

    def buffer(self, event: Event) -> None:
        with self._buffer_lock:
            self._buffer.append(event)
            if not self._buffered.is_set():
                self._buffered.set()

    def flush(self) -> None:
        with self._buffer_lock:
            batch, self._buffer = self._buffer, []
            if self._buffered.is_set():
                self._buffered.clear()
            if batch:  # sent under the lock: batches keep their order
                self.channel.try_send(PublishFrame(self.name, pickle.dumps(batch)))

    def _flush_loop(self) -> None:
        """Flush within :data:`FLUSH_EVERY` of the first buffered event; asleep while there is
        none. (A 5 ms tick whether or not anything was buffered cost each idle agent process
        about 5 ms of CPU a second: 100 idle agents, half a core of this 2-core box.)"""
        closed = self.channel.closed
        while not closed.is_set():
            if self._buffered.wait(IDLE_CHECK):
                closed.wait(FLUSH_EVERY)
                self.flush()

    def call(self, method: str, *args: Any) -> Any:
        self.flush()
        return request_call(self.channel, method, *args)

    # -- the reader thread's callbacks ---------------------------------------------------------

    def _trip(self, cause: str) -> None:
        """The registry's cascade reached this agent: its token, its shell's eval root (not
        the trunk's: its session outlives a cancel, as in the thread backend), its inbox."""
        self.token.cancel(cause)
        agent = self.agent
        if agent is not None:
            if agent.parent is not None:
                agent.eval_root.cancel(cause)
            self.inbox.wake()

    def _control(self, msg: ChannelMessage) -> None:
        if isinstance(msg, CancelFrame):
            self._cancel = self._cancel or msg.reason
            self._trip(msg.reason)
        elif isinstance(msg, InterruptFrame):
            if self.agent is not None:
                self.agent.interrupt(msg.reason)
        elif isinstance(msg, Shutdown):
            if self.agent is not None and self.agent.outcome is None:
                self._trip(msg.reason)
            self._stop.set()

    def _request(self, env: Envelope) -> None:
        msg, rid = env.message, env.id
        assert rid is not None
        if not isinstance(msg, Call) or msg.method not in HOST_CALLS:
            self.channel.reply(rid, ReturnFrame(error=pickle.dumps(SiteRefused(f"no {msg.KIND}"))))
            return
        args = unpickle(msg.payload) or ()
        answer_call(self.channel, rid, lambda: HOST_CALLS[msg.method](self, *args))

    def _eof(self, detail: str) -> None:
        self._trip(f"control side gone ({detail})")
        self._stop.set()

    # -- what the control side may ask ---------------------------------------------------------

    def _push(self, item: InboxMsg) -> PushEffect:
        return self.inbox.push(item)

    def _launch(self) -> None:
        self._launched.set()

    def _import_context(self, events: tuple[Any, ...], note: str | None) -> None:
        assert self.agent is not None
        self.agent.import_context(events, note)

    def _probe(self) -> dict[str, Any]:
        agent = self.agent
        return {
            "pid": os.getpid(),
            "shell_pid": agent.shell_pid() if agent is not None else None,
            "inbox": self.inbox.depths(),
            "stats": agent.stats if agent is not None else None,
        }


HOST_CALLS: dict[str, Callable[..., Any]] = {
    "push": AgentProcess._push,
    "launch": AgentProcess._launch,
    "import_context": AgentProcess._import_context,
    "probe": AgentProcess._probe,
}
"""What the control side may call in a host, by name."""


def _owes_a_response(agent: Agent) -> bool:
    """Whether the log ends where the model must speak next (not after an assistant message)."""
    for ev in reversed(agent.log.events):
        msg = ev.message()
        if msg is not None:
            return not isinstance(msg, AssistantMessage)
    return True


class HostSite:
    """The agent's site inside its host: its own half local, the fleet's half over the channel."""

    def __init__(self, host: AgentProcess) -> None:
        self._host = host

    @property
    def session(self) -> SessionDir:
        return self._host.boot.session

    @property
    def disk_warn_bytes(self) -> int | None:
        return self._host.boot.disk_warn_bytes

    def _agent(self) -> Agent:
        agent = self._host.agent
        assert agent is not None, "the agent is built before its shell runs"
        return agent

    def start_shell(
        self,
        name: str,
        desk: Any,
        context: Any,
        snapshot: MobileSnapshot | None,
    ) -> ShellParts:
        return start_agent_shell(
            name,
            self.session,
            desk,
            context,
            snapshot,
            limits=self._host.boot.limits,
            publish=self.publish,
            deliver=self.deliver,
            sync_log=self._host.boot.durability is Durability.MACHINE,
            host_start=self._host.shell_start,
        )

    def run_shell(self, name: str, script: str) -> ShellOutput:
        return run_agent_shell(self._agent(), self.session.record, script)

    def resources(self, name: str) -> Resources:
        lease = self._host.call("lease_figures", name)
        return agent_resources(self._agent(), self.session, self.disk_warn_bytes, lease)

    def prices(self) -> PriceTable:
        return self._host.boot.prices

    def charge(self, name: str, cost: Decimal | None) -> None:
        self._host.call("charge", name, cost)

    def publish(self, event: Event) -> None:
        self._host.buffer(event)

    def record_rejected(self, rejection: InboxRejected) -> None:
        self._host.buffer(rejection)

    def standing(self, name: str) -> Standing:
        result: Standing = self._host.call("standing", name)
        return result

    def park_reads(self, name: str) -> ParkReads:
        result: ParkReads = self._host.call("park_reads", name)
        return result

    def generation(self) -> int:
        return int(self._host.call("generation"))

    def deliver(self, name: str, item: Surface, sender: str) -> None:
        self._host.call("deliver", name, item, sender)

    def cancel_subtree(self, name: str, cause: str) -> None:
        self._host.call("cancel_subtree", name, cause)

    def cancel_descendant(self, name: str, target: str) -> bool:
        return bool(self._host.call("cancel_descendant", name, target))

    def cancel_all(self, cause: str) -> None:
        self._host.call("cancel_all", cause)

    def clear_subtree(self, name: str) -> int:
        return int(self._host.call("clear_subtree", name))

    def message(self, sender: str, target: str, text: str) -> None:
        self._host.call("message", sender, target, text)

    def spawn(self, request: SpawnRequest) -> dict[str, Any]:
        result: dict[str, Any] = self._host.call("spawn", request)
        return result

    def branch(self, request: BranchRequest) -> str:
        return str(self._host.call("branch", request))
