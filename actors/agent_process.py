"""Agents as processes, the control side: :class:`ProcessAgent` and its supervisor.

The process backend of the fleet (``FleetConfig.agents == "process"``). Each agent runs in an
agent process (``actors/agent_process_host.py``) forked by the control process's one preloaded
fork server; the agent process starts its shell host from that same server
(:func:`actors.process.use_fork_server`) and builds the very :class:`actors.agent.Agent` of the
thread backend. Here a :class:`ProcessAgent` stands in for it in the fleet and the registry:
producers push into its :class:`RemoteInbox`, which waits for the agent process's verdict, so
the quota rule's ``InboxFull`` still reaches the producer synchronously (a delivery nobody waits
on, a child's result, is sent and its refusal recorded when it arrives); the registry's cancel
cascade and interrupts travel as control frames; the agent's site calls (``Call``) are answered
with the fleet's own site methods through :data:`SITE_CALLS`.

Supervision (OTP style, ``runtime/fleet/supervision.py``): an end of file without ``Ended`` is a
crash -- SIGKILL, a C extension's crash, a memory blow-up. The control side restarts the agent
from its durable event log and snapshot in a new agent process (a ``Restarted`` notice on the
bus), at most 3 times in 60 s; past that the agent ends ``failed`` (its slot settled ``down``)
with the cause (a ``Down`` notice), and its parent is told as for any other end.

Invariants:
- Control-side handlers never run on a channel's reader (they may wait on another host's
  reply): requests, ends and a host lost without ``Ended`` are served by the fleet's pool of
  threads. A local host's channel is read by the fleet's one hub thread
  (:mod:`actors.channel_hub`), which must never wait: one reader per host process left ~200
  threads competing for the GIL in a 200-agent fleet, seconds behind under load.
- The agent process's events (``PublishFrame``) are queued on the bus in the order they were
  sent, before any request that followed them is answered, and written by the bus thread or
  by the next write of the bus, whichever comes first (:meth:`BusHandle.publish_queued`): a
  ``Died`` or a rejection is written after them. The charges in a batch (no ``--budget``) are
  added to the fleet's spend in that same order.
- No orphans: the host dies with the fork server (``PR_SET_PDEATHSIG``) and so with the control
  process; its shell sees end of file when its host dies; :meth:`ProcessAgent.shutdown` kills
  whatever of either is left.
- Settle first, reap after: a host that ended in order stopped its shell before ``Ended``, so
  its slot settles without waiting for the process; :meth:`ProcessAgent.release` then hands it
  to a :class:`HostReaper`, which tells it to exit once no other end is in flight and collects
  it off the settlement path (the 32 pool threads also answer every other agent's site calls:
  a thread blocked on one process's exit held up the others' ends; and exits told at once
  competed with a cascade's later ends for the cores, docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

import psutil

from exarch_actors.actors.agent import Agent, AgentOutcome, AgentStats
from exarch_actors.actors.agent_process_host import (
    CALL_TIMEOUT,
    Charge,
    EndReport,
    HostBoot,
    LiveFigures,
    SiteRefused,
    agent_process_main,
    answer_call,
    pickled_error,
    request_call,
    returned,
    unpickle,
)
from exarch_actors.actors.channel import AgentChannel
from exarch_actors.actors.channel_hub import ChannelHub
from exarch_actors.actors.frames import ChannelClosed
from exarch_actors.actors.host_pool import HostPool
from exarch_actors.actors.host_reaper import HostReaper
from exarch_actors.actors.process import fork_server_address, process_context, start_process
from exarch_actors.actors.ray_nodes import NodeChange, NodeWatch
from exarch_actors.actors.traffic_gate import ADMIT, NOTICES, serve_admit, serve_notice
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import ExarchError, UnknownAgent
from exarch_actors.runtime.events import Event, InboxRejected, Notice
from exarch_actors.runtime.fleet.agent_channel import (
    BornFrame,
    Call,
    CancelFrame,
    ChannelMessage,
    DiskFullFrame,
    Ended,
    Envelope,
    InterruptFrame,
    PeerGone,
    PublishFrame,
    RecordFrame,
    ReturnFrame,
    Shutdown,
)
from exarch_actors.runtime.fleet.fanin import WaitAnswer
from exarch_actors.runtime.fleet.inbox import (
    AgentMessage,
    AgentResult,
    ExitSignal,
    InboxFull,
    InboxMsg,
    PushEffect,
)
from exarch_actors.runtime.fleet.park import returns_for
from exarch_actors.runtime.fleet.supervision import Action, RestartIntensity
from exarch_actors.runtime.mcp.replies import McpRequest
from exarch_actors.runtime.replay.provider import RecordSink
from exarch_actors.runtime.state import disk_full
from exarch_actors.runtime.state.disk_full import DiskFull
from exarch_actors.runtime.state.durability import ShippedRecord
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.eventlog import event_logs
from exarch_actors.runtime.state.record_mirror import RecordRefused, apply_shipped
from exarch_actors.runtime.state.session_records import logged_messages, logged_results
from exarch_actors.runtime.state.snapshot import MobileSnapshot

log = logging.getLogger(__name__)

MESSAGES_CHECKED_AT = 64
"""Messages held (:attr:`ProcessAgent._unlogged_messages`) that make the supervisor read the
agent's log to let go of those it holds (off the sender's path, on the fleet's pool); the next
read is due at twice what is still held then, so a long chat holds no more than it must and a
busy agent's log is not read for every message sent to it."""

BORN_TIMEOUT = 60.0
"""Seconds a new agent host may take to report ``BornFrame`` (its shell restored and ready)."""


LIVE_TIMEOUT = 2.0
"""Seconds a live-figures read may wait (the host answers on its reader thread, at once)."""


class AgentProcessFailed(ExarchError):
    """An agent process could not start, or ended before it was born."""


# -- control side -----------------------------------------------------------------------------

SITE_CALLS: dict[str, Callable[..., Any]] = {
    "standing": lambda site, name: site.standing(name),
    "park_reads": lambda site, name: site.park_reads(name),
    "generation": lambda site: site.generation(),
    "deliver": lambda site, name, item, sender: site.deliver(name, item, sender),
    "cancel_subtree": lambda site, name, cause: site.cancel_subtree(name, cause),
    "cancel_descendant": lambda site, name, target: site.cancel_descendant(name, target),
    "cancel_all": lambda site, cause: site.cancel_all(cause),
    "clear_subtree": lambda site, name: site.clear_subtree(name),
    "message": lambda site, sender, target, text: site.message(sender, target, text),
    "spawn": lambda site, request: site.spawn(request, born_later=True),
    "branch": lambda site, request: site.branch(request),
    "charge": lambda site, name, cost: site.charge(name, cost),
    "lease_figures": lambda site, name: site.lease_figures(name),
    "stop_wait": lambda site, parent, wait_id, give_back: site.stop_wait(
        parent, wait_id, give_back
    ),
    "give_back": lambda site, parent, ends: site.give_back(parent, ends),
    "read_result": lambda site, parent, child: site.read_result(parent, child),
    "mcp_cancel": lambda site, agent, call_id: site.mcp_cancel(agent, call_id),
}
"""What a host may ask of the fleet, by name: the fleet's half of :class:`AgentSite`."""

RECORD_CALLS: dict[str, Callable[..., Any]] = {
    "record_spawned": lambda sink, child, parent: sink.spawned(child, parent),
    "record_reply": lambda sink, name, msg: sink.reply(name, msg),
    "record_failure": lambda sink, name, kind, text, partial: sink.failure(
        name, kind, text, partial
    ),
}
"""What a recording host (``--record``) asks of its agent's recorder, by name."""


class RemoteInbox:
    """The registry's handle on a host's inbox: a push waits for the host's verdict; an exit
    signal crosses as one :class:`CancelFrame` (the remote half of the agent's scope), which the
    host puts on its own inbox's control lane."""

    records_arrival = True
    """The host records its signal's arrival (a ``CancelHop`` ``received``) where it lands."""

    def __init__(self, agent: ProcessAgent) -> None:
        self._agent = agent
        self._on_signal: Callable[[ExitSignal], None] | None = None

    def bind_signal(self, hook: Callable[[ExitSignal], None] | None) -> None:
        self._on_signal = hook

    def signal(self, sig: ExitSignal) -> None:
        """Trip this side's half of the agent's scope (the hook), then send the frame."""
        hook = self._on_signal
        if hook is not None:
            hook(sig)
        self._agent.send_cancel(sig.cause, sig.sender)

    def push(self, msg: InboxMsg) -> PushEffect:
        """The host's verdict (``InboxFull`` re-raised as itself). A host already shut down
        takes nothing: the item is kept for :meth:`ProcessAgent.record_leftovers`. An agent
        ``message`` is held by the supervisor until the log accounts for it, as a child's
        result is (:meth:`ProcessAgent.sending`): a host that took it and died before it logged
        it took it along, and the restart is given it again."""
        agent = self._agent
        if not isinstance(msg, AgentMessage):
            try:
                result: PushEffect = agent.call("push", msg)
            except (PeerGone, ChannelClosed):
                agent.keep_late(msg)
                return PushEffect.QUEUED
            return result
        host = agent.sending(msg)
        try:
            result = request_call(host.channel, "push", msg)
        except InboxFull:
            agent.message_refused(msg)
            raise
        except (PeerGone, ChannelClosed):
            agent.keep_late(msg, host)
            return PushEffect.QUEUED
        return result

    def send_push(self, msg: InboxMsg, refused: Callable[[InboxFull], None]) -> None:
        """A push nobody waits on (the registry's ``deliver``): sent now, its verdict handled
        when it arrives -- ``refused`` with the host's ``InboxFull``, on the fleet's pool. The
        registry sends it under its lock, so the frame is ahead of the recipient's
        deregistration and ``Shutdown`` on the pipe (and of any reply the recipient's park
        read gets). Waiting for the verdict held a pool thread for a round trip per result:
        a cascade's 100 results to one parent took 15-41 ms each (load 16-23), and the 32
        pool threads that settle every end ran out."""
        agent = self._agent
        host = agent.sending(msg)

        def then(reply: ChannelMessage | None, error: BaseException | None) -> None:
            if error is not None or reply is None:  # the host is gone: the item is late
                agent.off_reader(agent.keep_late, msg, host)
                return
            try:
                returned("push", reply)
            except InboxFull as full:
                agent.off_reader(agent.refused_result, msg, refused, full)
            except Exception:
                log.exception("%s: a push's verdict", agent.name)

        try:
            host.channel.begin(Call("push", pickle.dumps((msg,))), CALL_TIMEOUT, then=then)
        except (PeerGone, ChannelClosed):
            agent.keep_late(msg, host)

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

    def born(self, pid: int, shell_pid: int | None) -> None:
        """The host reported ``Born`` (its pid, its shell's): a remote shell is its
        backend's to reap with its host."""


class HostBackend(Protocol):
    """Something that starts agent hosts somewhere else than this machine's fork server
    (``actors/ray_backend.py``): it runs ``AgentProcess`` there on a connection back to here,
    so the channel protocol is the same frames over a socket instead of a pipe."""

    def launch(self, boot: HostBoot) -> tuple[Connection, HostProcess]: ...

    def watch_nodes(self, on_change: Callable[[NodeChange], None]) -> NodeWatch:
        """A watch of the nodes it starts hosts on, joining and leaving, for the fleet's
        notices and views (``actors/ray_nodes.py``); the caller closes it."""
        ...


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
        recorder: RecordSink | None = None,
        host_pool: HostPool | None = None,
        hub: ChannelHub | None = None,
        wait_born: bool = True,
    ) -> None:
        """``wait_born``: return once the host reported ``Born`` (or raise
        :class:`AgentProcessFailed`); False returns once the process is started and its boot
        sent -- the spawn site then finishes the birth with :meth:`when_known` and
        :meth:`take_birth`, so a batch of spawns boots its children side by side."""
        spec = boot.spec
        self.recorder = recorder
        """``--record``: the run's recorder, which writes what its host's provider returns."""
        self.backend = backend
        """Who starts its hosts: None for this machine's fork server."""
        self.host_pool = host_pool
        """Warm agent processes of this machine's fork server (``actors/host_pool.py``), taken
        before a cold start."""
        self.hub = hub
        """The reader thread of its local hosts' channels (None: a thread each)."""
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
        self._unlogged: dict[str, AgentResult] = {}
        """Children's results sent to a host of this agent that its event log may not hold yet
        (not refused by its inbox, not collected by a wait or a read): a host SIGKILLed before
        it logged one took it along, so a restart delivers each again that the log lacks, and a
        down records each as undelivered (:meth:`_redeliver`, :meth:`_give_up_results`)."""
        self._given_up: set[str] = set()
        """Children whose result a down recorded as undelivered (never recorded twice)."""
        self._unlogged_messages: dict[str, AgentMessage] = {}
        """Agent ``message`` items sent to a host of this agent, by id, in the order sent, that
        its event log may not hold yet: like :attr:`_unlogged`, a restart gives each again that
        the log lacks and a down records each as undelivered. Let go of once the log holds
        them (read when :attr:`_messages_checked_at` are held: :meth:`_let_go_of_logged`)."""
        self._messages_checked_at = MESSAGES_CHECKED_AT
        self._checking_messages = False
        self._given_up_messages: set[str] = set()
        """Messages a down recorded as undelivered, by id (never recorded twice)."""
        self.pids: list[int] = []
        """Every host pid this agent ran in, first start first (a restart adds one)."""
        self.site_calls: Counter[str] = Counter()
        """The site calls its hosts made, by method: each one a channel round trip (a probe
        for tests and ``benchmarks/agent_processes.py``)."""
        self._boot = boot
        self._pool = pool
        self._on_exit = on_exit
        self._intensity = intensity or RestartIntensity()
        self._lock = threading.Lock()
        self._supervise = threading.Lock()
        self._finished = False
        self._leftovers_recorded = False
        self._closing = False
        self._launched = False
        self._shell_stopped = False
        self.scratch_kept: str | None = None
        self.eval_stopped_at: float | None = None
        """When a cancel stopped its shell's running evaluation (its ``EndReport``'s)."""
        """Why its host on another node kept its scratch there at its end (``EndReport``)."""
        self.host_lost = False
        """Its last host died (a crash) and no restart took its place: the agent ended down,
        and whatever that host left on its node (shell, scratch) is out of reach."""
        if wait_born:
            self._host: _Host = self._start(boot)
        else:
            self._host = _Host(self, boot, pooled=False)
            self.pids.append(self._host.pid)  # a local process's pid is known at its fork

    # -- the host's lifetime -------------------------------------------------------------------

    def _start(self, boot: HostBoot) -> _Host:
        host = _Host(self, boot)
        born = host.wait_born()
        self.pids.append(born.pid)
        return host

    def when_known(self, then: Callable[[], None], on: Executor) -> None:
        """Call ``then`` on ``on`` once its first host reported ``Born`` or ended before it
        (at once if either happened already). Then :meth:`take_birth`."""
        self._host.when_known(then, on)

    def take_birth(self) -> None:
        """After :meth:`when_known`: record the birth, or raise :class:`AgentProcessFailed`
        (the host ended, or was killed by :meth:`kill_unborn`, before ``Born``)."""
        born = self._host.wait_born(timeout=0.0)
        if born.pid not in self.pids:
            self.pids.append(born.pid)

    def kill_unborn(self) -> None:
        """A host that has not reported ``Born`` in time is killed: its end of file makes
        :meth:`take_birth` fail."""
        if not self._host.is_born:
            self._host.kill()

    def launch(self) -> None:
        """Start the drive loop (after the spawn site recorded the admission). One way: the
        spawn returns without waiting for the host's answer (a round trip, ~1.4 ms of a
        back-to-back spawn); a host that died meanwhile is a crash like any other, handled at
        its end of file (and a restart launches the new host)."""
        self._launched = True
        self._host.channel.try_send(Call("launch", b""))

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        if timeout is None:
            return request_call(self._host.channel, method, *args)
        return request_call(self._host.channel, method, *args, timeout=timeout)

    def off_reader(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the fleet's pool, or here once the pool is shut down."""
        try:
            self._pool.submit(fn, *args)
        except RuntimeError:
            fn(*args)

    def probe(self) -> dict[str, Any]:
        try:
            figures: dict[str, Any] = self.call("probe")
        except ExarchError:
            return {}
        return figures

    def live(self) -> LiveFigures | None:
        """The agent's figures now, read in its process; None before it is built or once its
        process is gone (then :attr:`stats` holds its figures at its end)."""
        try:
            figures: LiveFigures | None = self.call("live", timeout=LIVE_TIMEOUT)
        except ExarchError:
            return None
        return figures

    def recover(self, first: str | None, note: str) -> None:
        """``resume``: settle the pending calls its files hold, then push ``first`` (an empty
        log) or ``note`` (the model owes a response), in its process, before its launch."""
        self.call("recover", first, note)

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

    @property
    def shell_stopped(self) -> bool:
        """Its host stopped its shell in order before reporting its end (closed and reaped, or
        SIGKILLed, to be reaped after)."""
        return self._shell_stopped

    def shell_healthy(self) -> bool:
        """Whether its shell can be observed: alive, or stopped in order by its own host (its
        end is known, so the settlement can tear the environment down at once). A host on
        another node (a backend's) answers for its shell while its channel stands: a local pid
        says nothing about another machine."""
        if self._shell_stopped:
            return True
        if self.backend is not None:
            return not self.host_lost and self._host.channel.eof is None
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

    def stop_shell(self) -> None:
        """The environment's half of a teardown: nothing to wait for when the host stopped its
        shell in order at its end; otherwise the host is shut down with its shell."""
        if not self._shell_stopped:
            self.shutdown()

    def release(self, reaper: HostReaper) -> None:
        """After its slot is settled: hand the host to ``reaper``, which tells it to exit once
        no other end is in flight and collects it, off the settlement path."""
        with self._lock:
            self._closing = True
            host = self._host
        reaper.reap(host)

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

    def send_cancel(self, cause: str, sender: str | None = None) -> None:
        """A cancel's hop reached this agent (:meth:`RemoteInbox.signal`): one frame. ``cause``
        is the one the registry recorded for it (the first; a later cascade's own cause does
        not replace it), since the host answers its agent's standing from it; ``sender`` the
        node it hopped from. Nothing else is read here: this runs once per agent inside the
        cascade."""
        self._host.channel.try_send(CancelFrame(self.name, cause, sender))

    def interrupt(self, reason: str = "interrupt") -> None:
        self._host.channel.try_send(InterruptFrame(self.name, reason))

    def record_leftovers(self) -> None:
        """Record what reached this agent after its host shut down (the host records what its
        own inbox still held); anything that follows is recorded as it comes
        (:meth:`keep_late`)."""
        with self._lock:
            late, self.late = self.late, []
            self._leftovers_recorded = True
        for item in late:
            self.site.record_rejected(InboxRejected.of(self.name, item, reason="recipient ended"))

    def keep_late(self, msg: InboxMsg, host: _Host | None = None) -> None:
        """An item its host did not take (gone): kept for :meth:`record_leftovers`, or recorded
        at once if that already ran (a push whose verdict came back after the deregistration
        that let the settlement record the leftovers). A child's result that a crashed host
        (no ``Ended``) did not take stays with the supervisor: the restart delivers it again,
        a down records it (``_unlogged``); so does an agent ``message`` (``_unlogged_messages``)."""
        with self._lock:
            if isinstance(msg, AgentResult):
                if msg.child in self._given_up:
                    return
                if msg.child in self._unlogged and (host is None or not host.ended):
                    return
            if isinstance(msg, AgentMessage) and msg.id:
                if msg.id in self._given_up_messages:
                    return
                if msg.id in self._unlogged_messages and (host is None or not host.ended):
                    return  # its host crashed: the restart gives it again, a down records it
            if not self._leftovers_recorded:
                self.late.append(msg)
                return
        self.site.record_rejected(InboxRejected.of(self.name, msg, reason="recipient ended"))

    def sending(self, msg: InboxMsg) -> _Host:
        """A push nobody waits on is about to be sent: the host it goes to (the current one),
        a child's result counted as not logged until the log, a refusal or a collection says
        otherwise. Under the lock that a restart switches hosts under, so a result is either
        sent to the new host or known to the restart that delivers the lost ones again."""
        check = False
        with self._lock:
            if isinstance(msg, AgentResult):
                self._unlogged[msg.child] = msg
            elif isinstance(msg, AgentMessage) and msg.id:
                self._unlogged_messages[msg.id] = msg
                if not self._checking_messages:
                    check = len(self._unlogged_messages) >= self._messages_checked_at
                    self._checking_messages = check
            host = self._host
        if check:
            self.off_reader(self._let_go_of_logged)
        return host

    @property
    def messages_held(self) -> int:
        """How many messages sent to it the supervisor holds (:attr:`_unlogged_messages`)."""
        with self._lock:
            return len(self._unlogged_messages)

    def message_refused(self, msg: AgentMessage) -> None:
        """Its host's full inbox refused ``msg``: the sender's script gets the error, so it is
        not this agent's to deliver."""
        with self._lock:
            self._unlogged_messages.pop(msg.id, None)

    def _let_go_of_logged(self) -> None:
        """Stop holding the messages its log holds (read on the fleet's pool); the next read is
        due at twice what is still held."""
        try:
            logged = self._logged_messages()
        except Exception:  # a log that cannot be read now is read at the next check
            log.exception("%s: reading its log for the messages it took", self.name)
            logged = set()
        with self._lock:
            for mid in logged:
                self._unlogged_messages.pop(mid, None)
            held = len(self._unlogged_messages)
            self._messages_checked_at = max(MESSAGES_CHECKED_AT, 2 * held)
            self._checking_messages = False

    def _logged_messages(self) -> set[str]:
        """The ids of the messages its event log holds, as the control side reads the files:
        the current ``events.jsonl`` and every log a ``/clear`` archived (a message logged
        before a clear is held until the next read, and is no less delivered for it)."""
        found: set[str] = set()
        for path in event_logs(self.site.session.events(self.name)):
            found |= logged_messages(read_jsonl(path).records)
        return found

    def refused_result(
        self, msg: InboxMsg, refused: Callable[[InboxFull], None], full: InboxFull
    ) -> None:
        """Its host's full inbox refused ``msg``: ``refused`` records it (and the registry holds
        a child's result for ``agent-result``), so it is no longer this agent's to deliver."""
        if isinstance(msg, AgentResult):
            with self._lock:
                self._unlogged.pop(msg.child, None)
        refused(full)

    def collected(self, children: tuple[str, ...]) -> None:
        """A wait's answer or a read reached its host with these children's ends (``Collected``
        on the bus): their results reached the agent by that way."""
        with self._lock:
            for child in children:
                self._unlogged.pop(child, None)

    def _logged_results(self) -> set[str]:
        """The children whose result its event log holds, as the control side reads the file
        (a dead host wrote, or shipped, everything it logged before its end of file)."""
        events = self.site.session.events(self.name)
        if not events.exists():
            return set()
        return logged_results(read_jsonl(events).records)

    def _redeliver(self, pending: list[AgentResult]) -> None:
        """After a restart, before its launch: every result sent to a dead host that its log
        lacks goes to the new host's inbox again, through the registry (a full inbox refuses
        it and the registry records and holds it, a stale one is recorded stale)."""
        if not pending:
            return
        logged = self._logged_results()
        for msg in pending:
            if msg.child in logged:
                with self._lock:
                    if self._unlogged.get(msg.child) is msg:
                        del self._unlogged[msg.child]
                continue
            self.site.deliver(self.name, msg, msg.child)

    def _redeliver_messages(self, pending: list[AgentMessage]) -> None:
        """After a restart, before its launch: every message sent to a dead host that its log
        lacks goes to the new host's inbox again, in the order sent, through the registry
        (its full inbox, or the agent's end meanwhile, records it undelivered: nobody waits)."""
        if not pending:
            return
        logged = self._logged_messages()
        for msg in pending:
            if msg.id in logged:
                with self._lock:
                    self._unlogged_messages.pop(msg.id, None)
                continue
            try:
                self.site.message(msg.sender, self.name, msg)
            except InboxFull as full:
                self.site.record_rejected(
                    InboxRejected.of(self.name, msg, reason="inbox full", cap=full.cap)
                )
            except UnknownAgent:
                self.site.record_rejected(
                    InboxRejected.of(self.name, msg, reason="recipient ended")
                )

    def _give_up_results(self) -> None:
        """A down: the results its dead host never logged are recorded as undelivered (with
        the leftovers, :meth:`record_leftovers`)."""
        logged = self._logged_results()
        messages = self._logged_messages()
        with self._lock:
            for child, msg in self._unlogged.items():
                if child not in logged:
                    self.late.append(msg)
                    self._given_up.add(child)
            self._unlogged.clear()
            for mid, message in self._unlogged_messages.items():
                if mid not in messages:
                    self.late.append(message)
                    self._given_up_messages.add(mid)
            self._unlogged_messages.clear()

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    # -- the host's reports, on the fleet's pool ----------------------------------------------

    def _ended(self, host: _Host, report: EndReport) -> None:
        self.stats = report.stats
        self._shell_stopped = report.shell_stopped
        self.scratch_kept = report.scratch_kept
        self.eval_stopped_at = report.eval_stopped_at
        if report.shell_pid is not None:  # after a rollback: not the shell Born named
            host.shell_pid = report.shell_pid
        self.reply_value = report.reply_value
        self._replied = report.replied
        self._end_cause = report.cause
        self._finish(report.outcome)

    def _finish(self, outcome: AgentOutcome) -> None:
        """The agent's one end (an orderly end, or down): the spawn site settles it once."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self.outcome = outcome
        try:
            self._on_exit(self, outcome)
        finally:
            self.done.set()

    def _crashed(self, host: _Host, cause: str) -> None:
        """End of file without ``Ended``: restart from the durable files, or settle down.

        One crash at a time (``_supervise``): the end of file of a process started by a
        restart still in progress waits here until that restart has made it the current one,
        so a kill that lands during a restart is answered, once, like any other crash."""
        host.reap()
        with self._supervise:
            with self._lock:
                if self._closing or self._finished or host is not self._host:
                    return
            while True:
                decision = self._intensity.crashed(time.monotonic(), cause)
                if decision.action is not Action.RESTART:
                    break
                try:
                    self._restart(cause, decision.detail)
                    return
                except Exception as e:  # it died before it was born, or its files refused
                    cause = f"restart failed: {e}"
            self._end_cause = f"down: {cause}"
            self.host_lost = True
            self._give_up_results()
            self.site.publish(Notice(self.name, notice="Down", text=decision.detail))
        self._finish(AgentOutcome.FAILED)

    def _restart(self, cause: str, detail: str) -> None:
        snap = self.site.session.snapshot(self.name)
        snapshot = MobileSnapshot.load(snap) if snap.exists() else self._boot.spec.snapshot
        boot = replace(self._boot, spec=replace(self._boot.spec, snapshot=snapshot))
        boot = replace(boot, restarted=cause)
        host = self._start(boot)
        with self._lock:
            closing = self._closing
            if not closing:
                self._host = host
                self.restarts += 1
            pending = list(self._unlogged.values())
            messages = list(self._unlogged_messages.values())
        if closing:
            host.shutdown("close")
            return
        self.site.publish(
            Notice(
                self.name,
                notice="Restarted",
                text=detail,
                data={
                    "pid": host.pid,
                    "shell_pid": host.shell_pid,
                    "node": host.node,
                    "cause": cause,
                },
            )
        )
        standing = self.site.standing(self.name)
        if standing.cancel_cause is not None:  # cancelled while it was down
            self.send_cancel(standing.cancel_cause)
        self._redeliver(pending)
        self._redeliver_messages(messages)
        if self._launched:
            try:
                self.call("launch")
            except (PeerGone, ChannelClosed):  # killed again at once: its end of file is
                pass  # the next crash, handled once this restart returns


def _submit(on: Executor, fn: Callable[[], None]) -> None:
    """``fn`` on ``on``, or here once ``on`` is shut down (the fleet is closing)."""
    try:
        on.submit(fn)
    except RuntimeError:
        fn()


def evaluating(agent: Agent | ProcessAgent, events: Path | None = None) -> bool:
    """Whether ``agent``'s shell is evaluating a ral call now, wherever it runs: read in its
    process for an agent process (False once that process is gone). What a cancel of the call
    reaches; a call already in the agent's event log may not have reached its shell yet.

    ``events``: the agent's event log, read first: no call in it, no question asked of the
    agent's process (a poller of a hundred booting agents asks none of them)."""
    if events is not None and not (events.exists() and b'"assistant"' in events.read_bytes()):
        return False
    if isinstance(agent, ProcessAgent):
        live = agent.live()
        return live is not None and live.running_eval
    return agent.eval_root.busy


class _Host:
    """One host process of a :class:`ProcessAgent` (a restart makes another)."""

    def __init__(self, agent: ProcessAgent, boot: HostBoot, *, pooled: bool = True) -> None:
        """``pooled``: may wait for the warm pool's refill in flight when it has no idle
        process (one spawn at a time: a pipeline); False takes an idle one or starts its own at
        once (spawns booting side by side)."""
        self._agent = agent
        self._born = threading.Event()
        self._gone = threading.Event()
        self._known = threading.Event()
        """Set by ``Born`` or an end of file, whichever comes first: what a birth waits on."""
        self._then: tuple[Callable[[], None], Executor] | None = None
        self._then_lock = threading.Lock()
        self.ended = False
        self.born: BornFrame | None = None
        self.shell_pid: int | None = None
        self.node = "local"
        self.proc: BaseProcess | HostProcess
        self._remote: HostProcess | None = None
        if agent.backend is not None:
            here, self._remote = agent.backend.launch(boot)
            self.proc = self._remote
        else:
            here = self._fork(boot, pooled)
        self.pid: int = self.proc.pid or 0
        self.channel = AgentChannel(
            here,
            peer=f"agent process {boot.spec.name}",
            on_request=self._request,
            on_notify=self._notify,
            on_eof=self._eof,
        )
        # a local host's frames are read by the fleet's one hub thread (actors/channel_hub.py)
        self.channel.start(hub=agent.hub if self._remote is None else None)

    def _fork(self, boot: HostBoot, pooled: bool) -> Connection:
        """A warm process from the pool, or a new one; either way the boot, pickled once,
        follows on the pipe, and the process starts its shell before it reads it."""
        name = boot.spec.name
        try:
            payload = HostPool.pickled(boot)
        except Exception as e:
            raise AgentProcessFailed(f"agent {name}: cannot start: {e}") from e
        pool = self._agent.host_pool
        taken = pool.boot(payload, wait=pooled) if pool is not None else None
        if taken is not None:
            here, self.proc = taken
            return here
        here, there = process_context().Pipe(duplex=True)
        try:
            self.proc = start_process(
                agent_process_main,
                (there, fork_server_address(), None, boot.limits.memory_bytes),
                name=f"agent-{name}",
            )
            here.send_bytes(payload)
        except Exception as e:
            here.close()
            raise AgentProcessFailed(f"agent {name}: cannot start: {e}") from e
        finally:
            there.close()
        return here

    @property
    def is_born(self) -> bool:
        return self._born.is_set()

    def wait_born(self, timeout: float = BORN_TIMEOUT) -> BornFrame:
        """Its ``Born``, waited for without polling (``Born`` and an end of file both set
        ``_known``); a host that ended or stalled before it is killed and reaped."""
        if not self._known.wait(timeout) or not self._born.is_set():
            self.kill()
            self.reap()
            raise AgentProcessFailed(
                f"agent {self._agent.name}: its process ended or stalled before it was born"
            )
        assert self.born is not None
        self.pid = self.pid or self.born.pid
        self.node = self.born.node
        return self.born

    def when_known(self, then: Callable[[], None], on: Executor) -> None:
        """``then`` on ``on`` once ``Born`` or an end of file came (see
        :meth:`ProcessAgent.when_known`)."""
        with self._then_lock:
            if not self._known.is_set():
                self._then = (then, on)
                return
        _submit(on, then)

    def _now_known(self) -> None:
        """On the reader: ``Born`` or an end of file came; never waits."""
        self._known.set()
        with self._then_lock:
            pending, self._then = self._then, None
        if pending is not None:
            _submit(pending[1], pending[0])

    def _request(self, env: Envelope) -> None:
        msg, rid = env.message, env.id
        assert rid is not None
        site: Any = self._agent.site
        if isinstance(msg, RecordFrame):  # on the reader: before this host's next frame
            answer_call(self.channel, rid, lambda: self._record(msg))
            return
        if isinstance(msg, Call) and msg.method == ADMIT:  # answered when granted, never waited on
            serve_admit(site.config.traffic, self.channel, rid, msg.payload)
            return
        if isinstance(msg, Call) and msg.method == "wait_children":
            self._agent.site_calls[msg.method] += 1
            self._agent._pool.submit(self._wait_children, rid, unpickle(msg.payload))
            return
        if isinstance(msg, Call) and msg.method == "mcp_begin":
            self._agent.site_calls[msg.method] += 1
            self._agent._pool.submit(self._mcp_begin, rid, unpickle(msg.payload))
            return
        table = SITE_CALLS
        if isinstance(msg, Call) and msg.method in RECORD_CALLS and self._agent.recorder:
            site, table = self._agent.recorder, RECORD_CALLS
        if not isinstance(msg, Call) or msg.method not in table:
            self.channel.reply(rid, ReturnFrame(error=pickle.dumps(SiteRefused(f"no {msg.KIND}"))))
            return
        args = unpickle(msg.payload) or ()
        fn = table[msg.method]
        self._agent.site_calls[msg.method] += 1  # the reader thread is its only writer
        if msg.method == "read_result":  # a child's end read: its result reached the agent
            fn = self._read_result
        self._agent._pool.submit(answer_call, self.channel, rid, lambda: fn(site, *args))

    def _read_result(self, site: Any, parent: str, child: str) -> tuple[dict[str, Any], int]:
        end, held = SITE_CALLS["read_result"](site, parent, child)
        if end.get("outcome") != "running":
            self._agent.collected((child,))
        return end, held

    def _wait_children(self, rid: int, args: tuple[str, str, tuple[str, ...] | None]) -> None:
        """``agent-wait``, answered late: registered here (the pool thread returns at once),
        replied to by the settlement that completes it. A wait answered to a host that is
        gone gives what it carried back to its parent's inbox (a restarted host's, or
        recorded as undelivered)."""
        site: Any = self._agent.site
        parent = args[0]
        channel = self.channel

        def answer(value: WaitAnswer) -> None:
            if not channel.reply(rid, ReturnFrame(pickle.dumps(value))):
                if value.ends:
                    self._agent.off_reader(site.give_back, parent, value.ends)
            elif value.ends:
                self._agent.collected(value.children)

        try:
            now = site.wait_children(*args, answer)
        except Exception as e:  # a refusal (NotAChild) crosses as itself
            channel.reply(rid, ReturnFrame(error=pickled_error(e)))
            return
        if now is not None:
            answer(now)

    def _mcp_begin(self, rid: int, args: tuple[McpRequest]) -> None:
        """``mcp`` / ``mcp-tools``, answered late (``actors/mcp_site.py``): the pool thread
        returns once the request is begun; the hub's answer is the reply, whatever thread
        it arrives on, the request's error crossing as itself."""
        channel = self.channel

        def answer(value: Any) -> None:
            if isinstance(value, BaseException):
                channel.reply(rid, ReturnFrame(error=pickled_error(value)))
            else:
                channel.reply(rid, ReturnFrame(pickle.dumps(value)))

        try:
            self._agent.site.mcp_begin(*args, answer)
        except Exception as e:  # refused at once (NotGranted, an unknown server)
            channel.reply(rid, ReturnFrame(error=pickled_error(e)))

    def _notify(self, msg: ChannelMessage) -> None:
        if isinstance(msg, Call) and msg.method in NOTICES:
            serve_notice(self._agent.site.config.traffic, msg.method, msg.payload)
        elif isinstance(msg, BornFrame):
            self.born = msg
            self.shell_pid = msg.shell_pid
            if self._remote is not None:
                self._remote.born(msg.pid, msg.shell_pid)
            self._born.set()
            self._now_known()
        elif isinstance(msg, PublishFrame):
            site = self._agent.site
            events: list[Event] = []
            for event in unpickle(msg.payload) or ():
                if isinstance(event, Charge):
                    site.charge(event.agent, event.cost)
                elif isinstance(event, InboxRejected):
                    site.publish_queued(events)  # queued first: written before the rejection
                    events = []
                    site.record_rejected(event)
                else:
                    events.append(event)
            if events:
                site.publish_queued(events)
        elif isinstance(msg, RecordFrame):
            try:
                self._record(msg)
            except RecordRefused as e:  # nothing written; the run goes on without it
                log.warning("%s", e)
        elif isinstance(msg, DiskFullFrame):  # the host has stopped: the run stops with it
            disk_full.trip(DiskFull(msg.path, msg.reason, msg.free_bytes))
        elif isinstance(msg, Ended):
            self.ended = True
            self._agent._pool.submit(self._agent._ended, self, unpickle(msg.payload))

    def _record(self, msg: RecordFrame) -> None:
        """A durable write the host made on its node, made in the session directory here: on
        the reader thread, so it is written before anything the host sent after it is read.
        The host may write only its own agent's files (by the name it was started as, not the
        one the frame claims) and ``record.jsonl``."""
        record = ShippedRecord(msg.op, msg.path, msg.data, msg.to)  # type: ignore[arg-type]
        apply_shipped(self._agent.site.session, self._agent.name, record)

    def _eof(self, detail: str) -> None:
        """On the reader (the hub's thread for a local host): never waits. A host that ended
        without reporting is supervised from the pool, where its exit is waited for."""
        self._gone.set()
        self._now_known()
        if not self.ended and self._born.is_set():
            self._agent._pool.submit(self._lost)

    def _lost(self) -> None:
        code = None
        with contextlib.suppress(Exception):
            self.proc.join(2.0)
            code = self.proc.exitcode
        if code is not None and code < 0:
            cause = f"the agent process died (signal {-code})"
        else:
            cause = f"the agent process ended without reporting (exit code {code})"
        self._agent._crashed(self, cause)

    def ask_to_exit(self, reason: str) -> None:
        self.channel.try_send(Shutdown(reason))

    def shutdown(self, reason: str) -> None:
        self.ask_to_exit(reason)
        self.collect()

    def collect(self) -> None:
        """Wait for a host told to exit; kill it past the grace; reap it and its shell."""
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
