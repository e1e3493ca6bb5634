"""Agents as processes: an agent's drive loop, its shell and its inbox in an OS process of its own.

The process backend of the fleet (``FleetConfig.agents == "process"``). The agent host is forked
by the control process's one preloaded fork server and starts its shell host from that same
server (:func:`actors.process.use_fork_server`); it builds the very same
:class:`actors.agent.Agent` as the thread backend, with a :class:`HostSite` for its
:class:`actors.agent_site.AgentSite`. The site keeps the agent's own half local -- its shell
(:mod:`actors.agent_shell`), its inbox, its event log and snapshot files -- and forwards the
fleet's half over the channel (``runtime/agent_channel.py``) as :class:`Call` requests, which
the control side answers with the fleet's own site methods through an explicit table.

On the control side a :class:`ProcessAgent` stands in for the agent in the fleet and the
registry: producers push into its :class:`RemoteInbox`, which waits for the host's verdict, so
the quota rule's ``InboxFull`` still reaches the producer synchronously; the registry's cancel
cascade and interrupts travel as control frames, read by the host's channel reader thread,
which trips the agent's token and its shell's eval root directly (no mailbox in the way).

Supervision (OTP style, ``runtime/supervision.py``): an end of file without ``Ended`` is a
crash -- SIGKILL, an exception escaping the drive loop, a C extension's crash. The control side
restarts the agent from its durable event log and snapshot in a new host (a ``Restarted``
notice on the bus), at most 3 times in 60 s; past that it settles the agent ``failed`` (its
slot ``down``) with the cause, and its parent is told as for any other end.

Invariants:
- Control-side handlers never run on a channel's reader thread (they may wait on another
  host's reply): requests and ends are served by the fleet's pool of threads.
- Host-side handlers never wait on the control side: inbox pushes, launch, context imports and
  probes are answered at once on the reader thread.
- Bus events are batched (a flush every 5 ms, and before every call and the end), and always
  reach the control side before any request made after them.
- No orphans: the host dies with the fork server (``PR_SET_PDEATHSIG``) and so with the control
  process; its shell sees end of file when its host dies; :meth:`ProcessAgent.shutdown` kills
  whatever of either is left.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

import psutil

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
from actors.frames import ChannelClosed
from actors.process import (
    become_group_leader,
    die_with_parent,
    fork_server_address,
    process_context,
    start_process,
    use_fork_server,
)
from runtime.agent_channel import (
    Born,
    Call,
    Cancel,
    Ended,
    Envelope,
    Interrupt,
    Message,
    PeerGone,
    Publish,
    Return,
    Shutdown,
)
from runtime.cancel import CancelScope
from runtime.errors import ExarchError
from runtime.events import Event, InboxRejected, Notice, Resources
from runtime.inbox import Inbox, InboxMsg, Outcome, Surface, UserSteering
from runtime.limits import ShellLimits
from runtime.messages import AssistantMessage
from runtime.park import returns_for
from runtime.providers.base import Provider
from runtime.session_dir import SessionDir
from runtime.snapshot import MobileSnapshot
from runtime.supervision import Action, RestartIntensity

log = logging.getLogger(__name__)

BORN_TIMEOUT = 60.0
"""Seconds a new agent host may take to report ``Born`` (its shell restored and ready)."""

CALL_TIMEOUT = 120.0
"""Seconds a site call may wait for its answer (a spawn waits for its child's ``Born``)."""

FLUSH_EVERY = 0.005
"""Seconds between bus-event flushes of a host."""

RESTART_NOTE = (
    "[system note] Your process was restarted after a crash. Any tool call that was in flight "
    "is marked interrupted; your shell holds every binding of the calls that completed. "
    "Continue where you left off."
)


class AgentProcessFailed(ExarchError):
    """An agent process could not start, or ended before it was born."""


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


def _loads(data: bytes) -> Any:
    return pickle.loads(data) if data else None


def _error_payload(error: BaseException) -> bytes:
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps(SiteRefused(str(error) or type(error).__name__))


def _answer(channel: AgentChannel, rid: int, fn: Callable[[], Any]) -> None:
    try:
        value = fn()
    except Exception as e:  # the caller re-raises it: a typed refusal stays typed
        channel.reply(rid, Return(error=_error_payload(e)))
        return
    channel.reply(rid, Return(pickle.dumps(value)))


def _call(channel: AgentChannel, method: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
    reply = channel.request(Call(method, pickle.dumps(args)), timeout)
    if not isinstance(reply, Return):
        raise SiteRefused(f"{method}: unexpected reply {reply.KIND}")
    if reply.error is not None:
        raise _loads(reply.error)
    return _loads(reply.payload)


# -- host side --------------------------------------------------------------------------------


def agent_process_main(conn: Connection, fork_address: str, boot: HostBoot) -> None:
    """Process entry point of an agent host (runs in the fork-server child)."""
    become_group_leader()
    die_with_parent()
    # started as a daemon (so the control process's exit terminates it), but a daemonic
    # multiprocessing process may not start children, and this one starts its shell host
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    use_fork_server(fork_address)
    AgentProcess(conn, boot).serve()


class AgentProcess:
    """The host's state: its channel, its agent, its event buffer. Threads: main (the drive
    loop), the channel reader, the flusher, and the agent's shell actor. ``node`` names where
    it runs (``"local"``, or the Ray node id of a host a :class:`HostBackend` started)."""

    def __init__(self, conn: Connection, boot: HostBoot, node: str = "local") -> None:
        self.boot = boot
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
            born = Born(self.name, os.getpid(), agent.shell_pid(), spec.generation, self.node)
            self.channel.send(born)
            while not (self._launched.wait(0.05) or self._stop.is_set()):
                pass
            if self._launched.is_set():
                agent.drive()
                report = EndReport(
                    agent.outcome or AgentOutcome.FAILED,
                    agent.terminated,
                    agent.replied,
                    agent.reply_value,
                    agent.stats,
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

    def flush(self) -> None:
        with self._buffer_lock:
            batch, self._buffer = self._buffer, []
            if batch:  # sent under the lock: batches keep their order
                self.channel.try_send(Publish(self.name, pickle.dumps(batch)))

    def _flush_loop(self) -> None:
        while not self.channel.closed.wait(FLUSH_EVERY):
            self.flush()

    def call(self, method: str, *args: Any) -> Any:
        self.flush()
        return _call(self.channel, method, *args)

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

    def _control(self, msg: Message) -> None:
        if isinstance(msg, Cancel):
            self._cancel = self._cancel or msg.reason
            self._trip(msg.reason)
        elif isinstance(msg, Interrupt):
            if self.agent is not None:
                self.agent.interrupt(msg.reason)
        elif isinstance(msg, Shutdown):
            if self.agent is not None and self.agent.outcome is None:
                self._trip(msg.reason)
            self._stop.set()

    def _request(self, env: Envelope) -> None:
        msg, rid = env.message, env.id
        assert rid is not None
        if not isinstance(msg, Call) or msg.method not in _HOST_CALLS:
            self.channel.reply(rid, Return(error=pickle.dumps(SiteRefused(f"no {msg.KIND}"))))
            return
        args = _loads(msg.payload) or ()
        _answer(self.channel, rid, lambda: _HOST_CALLS[msg.method](self, *args))

    def _eof(self, detail: str) -> None:
        self._trip(f"control side gone ({detail})")
        self._stop.set()

    # -- what the control side may ask ---------------------------------------------------------

    def _push(self, item: InboxMsg) -> Outcome:
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


_HOST_CALLS: dict[str, Callable[..., Any]] = {
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
        )

    def run_shell(self, name: str, script: str) -> ShellOutput:
        return run_agent_shell(self._agent(), self.session.record, script)

    def resources(self, name: str) -> Resources:
        lease = self._host.call("lease_figures", name)
        return agent_resources(self._agent(), self.session, self.disk_warn_bytes, lease)

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


# -- control side -----------------------------------------------------------------------------

_SITE_CALLS: dict[str, Callable[..., Any]] = {
    "standing": lambda site, name: site.standing(name),
    "park_reads": lambda site, name: site.park_reads(name),
    "generation": lambda site: site.generation(),
    "deliver": lambda site, name, item, sender: site.deliver(name, item, sender),
    "cancel_subtree": lambda site, name, cause: site.cancel_subtree(name, cause),
    "cancel_descendant": lambda site, name, target: site.cancel_descendant(name, target),
    "cancel_all": lambda site, cause: site.cancel_all(cause),
    "clear_subtree": lambda site, name: site.clear_subtree(name),
    "message": lambda site, sender, target, text: site.message(sender, target, text),
    "spawn": lambda site, request: site.spawn(request),
    "branch": lambda site, request: site.branch(request),
    "lease_figures": lambda site, name: site.lease_figures(name),
}
"""What a host may ask of the fleet, by name: the fleet's half of :class:`AgentSite`."""


class RemoteInbox:
    """The registry's handle on a host's inbox: a push waits for the host's verdict."""

    def __init__(self, agent: ProcessAgent) -> None:
        self._agent = agent

    def push(self, msg: InboxMsg) -> Outcome:
        """The host's verdict (``InboxFull`` re-raised as itself). A host already shut down
        takes nothing: the item is kept for :meth:`ProcessAgent.record_leftovers`."""
        try:
            result: Outcome = self._agent.call("push", msg)
        except (PeerGone, ChannelClosed):
            self._agent.late.append(msg)
            return Outcome.QUEUED
        return result

    def wake(self) -> None:
        """The host wakes its own inbox when a cancel reaches it."""

    def depths(self) -> dict[str, int]:
        figures = self._agent.probe()
        depths: dict[str, int] = figures.get("inbox") or {}
        return depths

    def __len__(self) -> int:
        return sum(self.depths().values())


class HostProcess(Protocol):
    """What the control side holds of a started host besides its channel: the part of
    ``multiprocessing``'s process handle it uses (``pid`` may be 0 until ``Born``)."""

    pid: int | None
    exitcode: int | None

    def join(self, timeout: float | None = None) -> None: ...

    def kill(self) -> None: ...


class HostBackend(Protocol):
    """Something that starts agent hosts somewhere else than this machine's fork server
    (``actors/ray_backend.py``): it runs :class:`AgentProcess` there on a connection back to
    here, so the channel protocol is the same frames over a socket instead of a pipe."""

    def launch(self, boot: HostBoot) -> tuple[Connection, HostProcess]: ...


class ProcessAgent:
    """The control side's stand-in for an agent that runs in its own process.

    It reads as an agent to the fleet, the registry and the executor (name, construction bits,
    token, inbox, outcome, reply, figures) and owns the host's lifetime: start, launch, the
    supervisor's restarts, shutdown. Figures (:attr:`stats`) are the host's at its end."""

    def __init__(
        self,
        site: Any,
        boot: HostBoot,
        token: CancelScope,
        *,
        pool: Executor,
        on_exit: Callable[[ProcessAgent, AgentOutcome], None],
        intensity: RestartIntensity | None = None,
        backend: HostBackend | None = None,
    ) -> None:
        spec = boot.spec
        self.backend = backend
        """Who starts its hosts: None for this machine's fork server."""
        self.site = site
        self.spec = spec
        self.name = spec.name
        self.parent = spec.parent
        self.interactive = spec.interactive
        self.returns = returns_for(spec.construction, interactive=spec.interactive)
        self.fuel = spec.fuel
        self.token = token
        self.inbox = RemoteInbox(self)
        self.stats = AgentStats()
        self.outcome: AgentOutcome | None = None
        self.reply_value: Any = None
        self._replied = False
        self._end_cause: str | None = None
        self.done = threading.Event()
        self.restarts = 0
        self.late: list[InboxMsg] = []
        self.pids: list[int] = []
        """Every host pid this agent ran in, first start first (a restart adds one)."""
        self._boot = boot
        self._pool = pool
        self._on_exit = on_exit
        self._intensity = intensity or RestartIntensity()
        self._lock = threading.Lock()
        self._closing = False
        self._launched = False
        self._host: _Host = self._start(boot)

    # -- the host's lifetime -------------------------------------------------------------------

    def _start(self, boot: HostBoot) -> _Host:
        host = _Host(self, boot)
        born = host.wait_born()
        self.pids.append(born.pid)
        return host

    def launch(self) -> None:
        """Start the drive loop (after the spawn site recorded the admission)."""
        self._launched = True
        self.call("launch")

    def call(self, method: str, *args: Any) -> Any:
        return _call(self._host.channel, method, *args)

    def probe(self) -> dict[str, Any]:
        try:
            figures: dict[str, Any] = self.call("probe")
        except ExarchError:
            return {}
        return figures

    def import_context(self, events: tuple[Any, ...], note: str | None = None) -> None:
        self.call("import_context", events, note)

    @property
    def pid(self) -> int:
        return self._host.pid

    @property
    def node(self) -> str:
        """Where its host runs: ``"local"``, or the Ray node id."""
        return self._host.node

    def shell_pid(self) -> int | None:
        return self._host.shell_pid

    def shell_healthy(self) -> bool:
        pid = self._host.shell_pid
        if pid is None:
            return False
        try:
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def shutdown(self, reason: str = "shutdown") -> None:
        """Stop the host and its shell (it records what its inbox still held); kill what is
        left after a grace. Idempotent."""
        with self._lock:
            self._closing = True
            host = self._host
        host.shutdown(reason)

    # -- control ------------------------------------------------------------------------------

    @property
    def terminated(self) -> str | None:
        if self._end_cause is not None:
            return self._end_cause
        standing = self.site.standing(self.name)
        return standing.cancel_cause if standing.registered else None

    @property
    def replied(self) -> bool:
        return self._replied

    def cancel(self, cause: str) -> None:
        self.site.cancel_subtree(self.name, cause)

    def send_cancel(self, cause: str) -> None:
        """The registry's cascade reached this agent (its ``on_cancel`` hook)."""
        self._host.channel.try_send(Cancel(self.name, cause))

    def interrupt(self, reason: str = "interrupt") -> None:
        self._host.channel.try_send(Interrupt(self.name, reason))

    def record_leftovers(self) -> None:
        """Record what reached this agent after its host shut down (the host records what its
        own inbox still held)."""
        late, self.late = self.late, []
        for item in late:
            self.site.record_rejected(InboxRejected.of(self.name, item, reason="recipient ended"))

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    # -- the host's reports, on the fleet's pool ----------------------------------------------

    def _ended(self, host: _Host, report: EndReport) -> None:
        self.stats = report.stats
        self.reply_value = report.reply_value
        self._replied = report.replied
        self._end_cause = report.cause
        self._finish(report.outcome)

    def _finish(self, outcome: AgentOutcome) -> None:
        self.outcome = outcome
        try:
            self._on_exit(self, outcome)
        finally:
            self.done.set()

    def _crashed(self, host: _Host, cause: str) -> None:
        """End of file without ``Ended``: restart from the durable files, or settle down."""
        host.reap()
        with self._lock:
            if self._closing or host is not self._host:
                return
        decision = self._intensity.crashed(time.monotonic(), cause)
        if decision.action is Action.RESTART:
            try:
                self._restart(cause, decision.detail)
                return
            except Exception as e:  # a host that cannot come back is down
                decision = self._intensity.crashed(time.monotonic(), f"restart failed: {e}")
                cause = f"restart failed: {e}"
        self._end_cause = f"down: {cause}"
        self.site.publish(Notice(self.name, notice="Down", text=decision.detail))
        self._finish(AgentOutcome.FAILED)

    def _restart(self, cause: str, detail: str) -> None:
        snap = self.site.session.snapshot(self.name)
        snapshot = MobileSnapshot.load(snap) if snap.exists() else self._boot.spec.snapshot
        boot = replace(self._boot, spec=replace(self._boot.spec, snapshot=snapshot))
        boot = replace(boot, restarted=cause)
        host = self._start(boot)
        with self._lock:
            if self._closing:
                host.shutdown("close")
                return
            self._host = host
            self.restarts += 1
        self.site.publish(
            Notice(
                self.name,
                notice="Restarted",
                text=detail,
                data={"pid": host.pid, "shell_pid": host.shell_pid, "cause": cause},
            )
        )
        standing = self.site.standing(self.name)
        if standing.cancel_cause is not None:  # cancelled while it was down
            self.send_cancel(standing.cancel_cause)
        if self._launched:
            self.call("launch")


class _Host:
    """One host process of a :class:`ProcessAgent` (a restart makes another)."""

    def __init__(self, agent: ProcessAgent, boot: HostBoot) -> None:
        self._agent = agent
        self._born = threading.Event()
        self._gone = threading.Event()
        self.ended = False
        self.born: Born | None = None
        self.shell_pid: int | None = None
        self.node = "local"
        self.proc: BaseProcess | HostProcess
        if agent.backend is not None:
            here, self.proc = agent.backend.launch(boot)
        else:
            here = self._fork(boot)
        self.pid: int = self.proc.pid or 0
        self.channel = AgentChannel(
            here,
            peer=f"agent process {boot.spec.name}",
            on_request=self._request,
            on_notify=self._notify,
            on_eof=self._eof,
        )
        self.channel.start()

    def _fork(self, boot: HostBoot) -> Connection:
        here, there = process_context().Pipe(duplex=True)
        try:
            self.proc = start_process(
                agent_process_main,
                (there, fork_server_address(), boot),
                name=f"agent-{boot.spec.name}",
            )
        except Exception as e:
            here.close()
            raise AgentProcessFailed(f"agent {boot.spec.name}: cannot start: {e}") from e
        finally:
            there.close()
        return here

    def wait_born(self) -> Born:
        deadline = time.monotonic() + BORN_TIMEOUT
        while not self._born.wait(0.05):
            if self._gone.is_set() or time.monotonic() > deadline:
                self.kill()
                self.reap()
                raise AgentProcessFailed(
                    f"agent {self._agent.name}: its process ended or stalled before it was born"
                )
        assert self.born is not None
        self.pid = self.pid or self.born.pid
        self.node = self.born.node
        return self.born

    def _request(self, env: Envelope) -> None:
        msg, rid = env.message, env.id
        assert rid is not None
        site = self._agent.site
        if not isinstance(msg, Call) or msg.method not in _SITE_CALLS:
            self.channel.reply(rid, Return(error=pickle.dumps(SiteRefused(f"no {msg.KIND}"))))
            return
        args = _loads(msg.payload) or ()
        fn = _SITE_CALLS[msg.method]
        self._agent._pool.submit(_answer, self.channel, rid, lambda: fn(site, *args))

    def _notify(self, msg: Message) -> None:
        if isinstance(msg, Born):
            self.born = msg
            self.shell_pid = msg.shell_pid
            self._born.set()
        elif isinstance(msg, Publish):
            site = self._agent.site
            for event in _loads(msg.payload) or ():
                if isinstance(event, InboxRejected):
                    site.record_rejected(event)
                else:
                    site.publish(event)
        elif isinstance(msg, Ended):
            self.ended = True
            self._agent._pool.submit(self._agent._ended, self, _loads(msg.payload))

    def _eof(self, detail: str) -> None:
        self._gone.set()
        if not self.ended and self._born.is_set():
            code = None
            with contextlib.suppress(Exception):
                self.proc.join(2.0)
                code = self.proc.exitcode
            if code is not None and code < 0:
                cause = f"the agent process died (signal {-code})"
            else:
                cause = f"the agent process ended without reporting (exit code {code})"
            self._agent._pool.submit(self._agent._crashed, self, cause)

    def shutdown(self, reason: str) -> None:
        self.channel.try_send(Shutdown(reason))
        if not self._gone.wait(10.0):
            self.kill()
        self.reap()

    def _reap_shell(self) -> None:
        """A shell whose host died sees end of file and exits; one that has not within the
        grace is killed (its workers see end of file in turn)."""
        if not self.shell_pid or self.node != "local":  # a remote shell is its backend's
            return
        with contextlib.suppress(psutil.Error, ValueError):
            shell = psutil.Process(self.shell_pid)
            with contextlib.suppress(psutil.TimeoutExpired):
                shell.wait(5.0)
            if shell.is_running() and shell.status() != psutil.STATUS_ZOMBIE:
                shell.kill()

    def kill(self) -> None:
        if self._agent.backend is not None:
            self.proc.kill()
            return
        for pid in (self.shell_pid, self.pid):
            with contextlib.suppress(psutil.Error, ValueError):
                if pid:
                    p = psutil.Process(pid)
                    if p.status() != psutil.STATUS_ZOMBIE:
                        p.kill()

    def reap(self) -> None:
        """Wait for the end of file, kill a shell its dead host left behind, close the handle."""
        if not self._gone.wait(10.0):
            self.kill()
            self._gone.wait(10.0)
        self._reap_shell()
        self.channel.close()
        with contextlib.suppress(Exception):
            self.proc.join(5.0)
        if self.proc.exitcode is None:
            self.kill()
            with contextlib.suppress(Exception):
                self.proc.join(5.0)
