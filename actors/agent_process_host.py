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
- Bus events are batched, and always reach the control side before any request made after
  them (every site call and the end flush first). The drive thread sends its own batch itself
  when it is about to wait -- for its shell, its provider, its inbox (through the park reads) --
  if the batch's first item is :data:`FLUSH_EVERY` old; a younger batch that holds an event is
  left to the flusher, which sends it ``FLUSH_EVERY`` after that first item. An event another
  thread buffers wakes the flusher. So an event waits at most ``FLUSH_EVERY`` while the drive
  thread waits, and the common ral call (its ``Io`` and the next step's charge) costs no
  thread hand-off. A charge without a budget rides the same batches, in order, and never
  wakes the flusher on its own: alone in the buffer it waits for the next event or flush.
- A cancel frame (the one frame that bridges the agent's scope across the process boundary) is
  put on the agent's inbox's control lane as an exit signal, ahead of its queued turns; its
  arrival trips the agent's token and its shell's eval root (the trunk's as any other's),
  from the reader thread, while the main thread
  may be blocked in the very run it stops, and records the hop (a ``CancelHop``
  ``received``).
- The agent's own standing is answered here, without a round trip: every terminate-class
  cancel of it reaches the host as a cancel frame carrying the registry's recorded (first)
  cause, set before the token trips, and the control side deregisters a live agent only after
  cancelling it (``clear``, ``close``). A drive loop read it four or five times a turn.
- An orderly end stops the shell first, then is reported (``Ended``); the process then waits for
  ``Shutdown`` (sent once its slot is settled), recording what its inbox still holds; anything
  else the control side sees is a crash.
- Threads: main (the drive loop), the channel reader, the flusher, the shell actor's (and, at
  the start, the one that starts the shell host while the agent is built).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

import pykka

from exarch_actors.actors.agent import Agent, AgentOutcome, AgentSpec, AgentStats
from exarch_actors.actors.agent_executor import remove_scratch
from exarch_actors.actors.agent_shell import (
    WorkerCount,
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
from exarch_actors.actors.channel import AgentChannel
from exarch_actors.actors.host_start import HostStart
from exarch_actors.actors.priority import (
    REACHED_NICE,
    stand_aside,
    stand_back,
    yield_to_control,
)
from exarch_actors.actors.process import (
    ChildProcess,
    become_group_leader,
    die_with_parent,
    use_fork_server,
)
from exarch_actors.actors.shell import ShellActor
from exarch_actors.actors.traffic_gate import RemoteGate
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.drills.fault_switch import pause_point
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.events import CancelHop, Event, InboxRejected, Resources
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
from exarch_actors.runtime.fleet.fanin import ChildEnd, WaitAnswer
from exarch_actors.runtime.fleet.inbox import (
    ExitSignal,
    Inbox,
    InboxMsg,
    PushEffect,
    Surface,
    UserSteering,
)
from exarch_actors.runtime.mcp.replies import McpRequest
from exarch_actors.runtime.messages import AssistantMessage
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.governor import install_gate
from exarch_actors.runtime.providers.prices import PriceTable
from exarch_actors.runtime.providers.scripted import ScriptedProvider, played_rounds
from exarch_actors.runtime.replay.provider import RecordingProvider, unrecorded
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state import disk_full, durability
from exarch_actors.runtime.state.disk_full import EXIT_DISK_FULL, DiskFull
from exarch_actors.runtime.state.durability import Durability, ShippedRecord
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.snapshot import MobileSnapshot

log = logging.getLogger(__name__)

CALL_TIMEOUT = 120.0
"""Seconds a site call may wait for its answer (a spawn waits for its child's ``BornFrame``)."""

WAIT_TIMEOUT = float("inf")
"""An ``agent-wait`` request waits for its answer as long as its children run: its caller's
cancel (the pump's ``abandon``) or the channel's end is what stops it."""

FLUSH_EVERY = 0.005
"""Seconds a buffered bus event may wait for the rest of its batch while the drive thread waits
(a call boundary flushes sooner). The flusher sleeps until an event needs it: polling every 5 ms
woke each of 200 idle agent processes 200 times a second, and waking it for every batch cost
an agent process 0.12-0.14 ms of CPU and 3.2-3.5 context switches per ral call at 40 agents on
2 cores (docs/benchmarks.md): the drive thread now sends its own batches when they are due."""

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
    budget: bool = False
    """A ``--budget`` is set: each round trip's charge waits for the fleet's answer, so the one
    that reaches the budget has cancelled the tree before the agent's next step. Without one a
    charge only adds to the fleet's spend: it rides the next event batch (:class:`Charge`)."""
    record: bool = False
    """``--record``: every reply its provider returns goes to the control side's recorder
    (:class:`ChannelRecorder`) before the agent admits it."""


@dataclass(frozen=True)
class Charge:
    """One round trip's cost for the fleet's spend, in a publish batch beside the events (no
    budget set: nothing waits for the answer, which was one channel round trip per ral call)."""

    agent: str
    cost: Decimal | None


@dataclass(frozen=True)
class LiveFigures:
    """An agent's figures as its process reads them now (the chat's status line, Esc's "is
    there a turn to stop"): read racily, like the thread backend's live views read them."""

    state: str
    model: str
    used_tokens: int | None
    window: int | None
    running_workers: int | None
    """The shell's running workers as of its last answered probe (one probe outstanding)."""
    running_eval: bool
    """Whether its shell is evaluating a ral call right now."""
    stats: AgentStats


@dataclass(frozen=True)
class EndReport:
    """What the control side needs of an agent that ended in order."""

    outcome: AgentOutcome
    cause: str | None
    replied: bool
    reply_value: Any
    stats: AgentStats
    shell_stopped: bool = False
    """Its shell was stopped here before ``Ended`` was sent -- closed and reaped, or its
    host SIGKILLed (it runs no instruction more; reaped here after ``Ended``): the spawn
    site's teardown finds it stopped and need not wait for this process to exit."""
    shell_pid: int | None = None
    """Its shell host's pid at its end: a rollback replaced the one ``Born`` named, and the
    executor settles (and tears down) the current one."""
    scratch_kept: str | None = None
    """A host on another node removes its agent's scratch there once its shell stopped in
    order; why it could not (None: removed, or on this machine, where the teardown does it)."""
    eval_stopped_at: float | None = None
    """When a terminal cancel stopped its shell's running evaluation (``EvalRoot.killed_at``):
    the cascade's reach into it, read by the spawn site (None: no evaluation was running)."""


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
    return returned(method, channel.request(Call(method, pickle.dumps(args)), timeout))


def returned(method: str, reply: ChannelMessage) -> Any:
    """A call's value from its reply; the peer's error re-raised as itself."""
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
    _prepare_host(fork_address)
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
    _serve_host(conn, boot, "local", shell)


def agent_host_connect_main(
    address: tuple[str, int],
    key: bytes,
    fork_address: str,
    boot: HostBoot,
    node: str,
    ship: bool = False,
) -> None:
    """Process entry point of an agent host a node's launcher forked
    (``actors/ray_launcher.py``): it connects back to the driver at ``address``, both ends
    proving they hold the launch's ``key`` (``multiprocessing``'s HMAC challenge), and serves
    its agent over that socket; ``node`` is what its ``Born`` names. Its shell starts while it
    connects. ``ship``: every durable write under its session directory (the node's copy) is
    also sent to the driver (``runtime/state/record_mirror.py``)."""
    _prepare_host(fork_address)
    shell = HostStart(boot.spec.name, boot.limits.memory_bytes)
    try:
        sock = socket.create_connection(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the driver's end
        conn = Connection(sock.detach())
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
    except BaseException:
        shell.discard()
        raise
    _serve_host(conn, boot, node, shell, ship)


def _prepare_host(fork_address: str) -> None:
    become_group_leader()
    die_with_parent()
    yield_to_control()
    # started as a daemon (so the control process's exit terminates it), but a daemonic
    # multiprocessing process may not start children, and this one starts its shell host
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    use_fork_server(fork_address)


def _serve_host(
    conn: Connection, boot: HostBoot, node: str, shell: HostStart, ship: bool = False
) -> None:
    try:
        host = AgentProcess(conn, boot, node=node, shell_start=shell)
        disk_full.reset()  # a latch its fork server copied from the control process is not its
        disk_full.on_trip(host.stop_for_a_full_disk)
        files = durability.bind(
            boot.session.root, boot.durability, ship=host.ship if ship else None
        )
        try:
            host.serve()
        finally:
            durability.unbind(files)
    finally:
        shell.discard()  # never taken (the agent failed before its shell booted)


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
        self.inbox.bind_signal(self._arrived)
        self.agent: Agent | None = None
        self._launched = threading.Event()
        self._stop = threading.Event()
        self._cancel: str | None = None
        self._buffer: list[Event | Charge] = []
        self._buffer_lock = threading.Lock()
        self._first_at = 0.0
        """When the buffer's first item was buffered (``time.monotonic``)."""
        self._holds_event = False
        """The buffer holds an event, not only charges."""
        self._pending = threading.Event()
        """Set when the flusher must send the buffer (``FLUSH_EVERY`` after its first item)."""
        self._drive_thread: int | None = None
        """The drive thread's ident: it sends its own batches (:meth:`before_wait`)."""
        self._workers = WorkerCount()
        self._closing = False
        """:meth:`serve` is closing the channel itself: its end of file trips nothing."""
        self.channel = AgentChannel(
            conn,
            peer="control",
            on_control=self._control,
            on_request=self._request,
            on_notify=self._notify,
            on_eof=self._eof,
        )
        install_gate(RemoteGate(self.channel))  # the run's traffic governor, over the channel

    def serve(self) -> None:
        self._drive_thread = threading.get_ident()
        self.channel.start()
        agent: Agent | None = None
        try:
            spec = self.boot.spec
            if self.boot.restarted is not None:
                spec = replace(spec, prompt=None, resume=True)
            provider = self.boot.provider
            if self.boot.restarted is not None and isinstance(provider, ScriptedProvider):
                # its copy of the playback is the one it was born with: play on, not again
                # from its first round (the agent's log says how far it got; a scripted
                # ``error`` round leaves no assistant event and is played again: the bus's
                # ProviderError, which resume counts, is the control side's, not here)
                logs = self.boot.session.event_logs(self.name)
                played = played_rounds(r for log in logs for r in read_jsonl(log).records)
                provider.play_on_after(played)
            if self.boot.record:
                provider = RecordingProvider(provider, ChannelRecorder(self), self.name)
            agent = Agent(HostSite(self), spec, provider, self.token, self.inbox)
            self.agent = agent
            if self._cancel is not None:  # a cancel that overtook the boot
                self._trip(self._cancel)
            if self.boot.restarted is not None:
                self._after_restart(agent)
            born = BornFrame(self.name, os.getpid(), agent.shell_pid(), spec.generation, self.node)
            self.channel.send(born)
            # after Born: a thread's start waits for it to run, a scheduler hand-off on the
            # spawn's path (several ms under load); what was buffered before waits for it
            threading.Thread(target=self._flush_loop, name="flush", daemon=True).start()
            while not (self._launched.wait(0.05) or self._stop.is_set()):
                pass
            if self._launched.is_set():
                agent.drive()
                pause_point("drive-ended-before-report")  # tests/agent_host: killed here
                if self._cancel is not None:  # ended by a cancel: the reach first, the ends after
                    stand_back()
                # the shell goes first, here and in parallel with every other ending agent:
                # the settlement then finds the environment stopped (the 100-agent cascade
                # waited on each process's exit before, docs/benchmarks.md)
                shell_pid, stopped, dying = _end_shell(agent)
                kept = self._remove_node_scratch() if stopped and self.node != "local" else None
                report = EndReport(
                    agent.outcome or AgentOutcome.FAILED,
                    agent.terminated,
                    agent.replied,
                    agent.reply_value,
                    agent.stats,
                    shell_stopped=stopped,
                    shell_pid=shell_pid,
                    scratch_kept=kept,
                    eval_stopped_at=agent.eval_root.killed_at,
                )
                self.flush()
                self.channel.try_send(Ended(self.name, pickle.dumps(report)))
                if self.node == "local":  # a Ray worker's threads are Ray's, not ours to demote
                    stand_aside()  # the rest is housekeeping: behind every end still to come
                if dying is not None:  # killed behind the living: reaped after the report
                    dying.reap(grace=SHELL_STOP_TIMEOUT)
                _stop_shell_actor(agent)
                self._stop.wait()
                agent.record_leftovers()  # pushed between its end and its deregistration
        finally:
            if agent is not None:
                stop_agent_shell(self.name, agent.shell)
            self.flush()
            self._closing = True
            self.channel.close()
            self._pending.set()  # the flusher sees the channel closed and ends

    def _remove_node_scratch(self) -> str | None:
        """Remove this agent's scratch directory on this node (its shell stopped in order):
        the driver's teardown removes only its own copy. None once removed (or never made),
        else why it is kept -- the teardown receipt then says so."""
        try:
            remove_scratch(self.boot.session.scratch(self.name))
        except FileNotFoundError:
            pass
        except OSError as e:
            return str(e)
        return None

    def _after_restart(self, agent: Agent) -> None:
        """The per-agent half of ``resume``: pending calls settled, then a nudge to go on."""
        self._recover(self.boot.spec.prompt, RESTART_NOTE)

    def _recover(self, first: str | None, note: str) -> None:
        """An agent rebuilt from its files (a restart here, ``resume`` from the control side):
        its pending calls settled as interrupted; then ``first`` if its log is empty, else
        ``note`` if the model owes a response and nothing else waits in its inbox."""
        agent = self.agent
        assert agent is not None
        if agent.log.pending_tool_calls:
            agent.log.settle_pending()
        if agent.log.event_count == 0 and first is not None:
            self.inbox.push(UserSteering(first))
        elif agent.logged_reply is None and _owes_a_response(agent) and not self.inbox.items():
            self.inbox.push(UserSteering(note))  # (a child that replied ends at once)

    # -- bus events ----------------------------------------------------------------------------

    def buffer(self, item: Event | Charge) -> None:
        """Buffer one bus event or charge for the next batch (the module docstring's rule)."""
        with self._buffer_lock:
            if not self._buffer:
                self._first_at = time.monotonic()
            self._buffer.append(item)
            if isinstance(item, Charge):
                return
            self._holds_event = True
            if threading.get_ident() != self._drive_thread and not self._pending.is_set():
                self._pending.set()

    def before_wait(self) -> None:
        """The drive thread is about to wait: send the batch if it is due, else leave one that
        holds an event to the flusher."""
        with self._buffer_lock:
            if not self._buffer:
                return
            if time.monotonic() - self._first_at >= FLUSH_EVERY:
                self._send_locked()
            elif self._holds_event and not self._pending.is_set():
                self._pending.set()

    def flush(self) -> None:
        with self._buffer_lock:
            self._send_locked()

    def _send_locked(self) -> None:
        batch, self._buffer = self._buffer, []
        self._holds_event = False
        self._pending.clear()
        if batch:  # sent under the lock: batches keep their order
            self.channel.try_send(PublishFrame(self.name, pickle.dumps(batch)))

    def _flush_loop(self) -> None:
        """Send a batch ``FLUSH_EVERY`` after its first item once asked (unless the drive
        thread or a call boundary sent it first); sleep while nobody asks."""
        closed = self.channel.closed
        while not closed.is_set():
            self._pending.wait()
            with self._buffer_lock:
                due = self._first_at + FLUSH_EVERY if self._buffer else 0.0
            if closed.wait(max(0.0, due - time.monotonic())):
                return
            with self._buffer_lock:
                self._send_locked()

    def stop_for_a_full_disk(self, err: DiskFull) -> None:
        """A session file this host writes was refused for lack of space (the latch's
        listener, on the failing thread): tell the control side, which stops the run, and end
        here at once -- as a SIGKILL would, every record written so far intact and nothing
        more attempted (its shell sees end of file and goes with it)."""
        with contextlib.suppress(Exception):  # a control side already gone learns from the EOF
            self.channel.try_send(DiskFullFrame(self.name, err.path, err.reason, err.free_bytes))
        os._exit(EXIT_DISK_FULL)

    def call(self, method: str, *args: Any) -> Any:
        self.flush()
        return request_call(self.channel, method, *args)

    def ship(self, record: ShippedRecord) -> None:
        """Send one durable write made in this node's copy of the session directory to the
        control side, which makes it in the real one (``runtime/state/record_mirror.py``):
        under ``machine`` wait for its acknowledgement (fsync'd there), under ``process`` the
        control side writes it before it reads this host's next frame. A control side that is
        gone takes nothing: this host is being stopped (its end of file trips the cancel), and
        nothing it does from here on reaches the run."""
        frame = RecordFrame(self.name, record.op, record.path, record.data, record.to)
        if self.boot.durability is not Durability.MACHINE:
            self.channel.try_send(frame)
            return
        try:
            reply = self.channel.request(frame, CALL_TIMEOUT)
        except PeerGone:
            return
        if isinstance(reply, ReturnFrame) and reply.error is not None:
            raise unpickle(reply.error)

    # -- the reader thread's callbacks ---------------------------------------------------------

    @property
    def cancel_cause(self) -> str | None:
        """The terminate-class cause that stands against this agent (the registry's first)."""
        return self._cancel

    def _trip(self, cause: str) -> None:
        """A cancel reached this agent (the trunk as any other): its token, its shell's eval
        root, its inbox. The cancel ends the agent, so the root is made terminal first: its
        busy host is SIGKILLed rather than asked to unwind (:meth:`EvalRoot.make_terminal`)."""
        agent = self.agent
        if agent is not None:
            # before the token (see EvalRoot.make_terminal); reaped after Ended (serve)
            agent.eval_root.make_terminal(behind=True, after_kill=_stand_back_reached)
        self.token.cancel(cause)
        if agent is not None:
            agent.eval_root.cancel(cause)
            self.inbox.wake()

    def _arrived(self, sig: ExitSignal) -> None:
        """An exit signal arrived on this agent's inbox (its control lane): its scope tripped
        here, in the reader's thread, and the hop recorded where it landed -- first: the trip
        may end the agent (its ``Ended`` sent by the drive thread) before this thread goes on."""
        self.buffer(CancelHop(self.name, sender=sig.sender, phase="received", cause=sig.cause))
        self.flush()
        self._trip(sig.cause)

    def _control(self, msg: ChannelMessage) -> None:
        if isinstance(msg, CancelFrame):
            self._cancel = self._cancel or msg.reason
            self.inbox.signal(ExitSignal(msg.sender, self._cancel))
        elif isinstance(msg, InterruptFrame):
            if self.agent is not None:
                self.agent.interrupt(msg.reason)
        elif isinstance(msg, Shutdown):
            if self.agent is None or self.agent.outcome is None:  # still to end: it must
                self._cancel = self._cancel or msg.reason
                if self.agent is not None:
                    self.inbox.signal(ExitSignal(None, self._cancel))
            self._stop.set()

    def _request(self, env: Envelope) -> None:
        msg, rid = env.message, env.id
        assert rid is not None
        if not isinstance(msg, Call) or msg.method not in HOST_CALLS:
            self.channel.reply(rid, ReturnFrame(error=pickle.dumps(SiteRefused(f"no {msg.KIND}"))))
            return
        args = unpickle(msg.payload) or ()
        fn = HOST_CALLS[msg.method]
        if msg.method in WRITING_CALLS:  # off the reader, which must read the ship's acks
            threading.Thread(
                target=answer_call,
                args=(self.channel, rid, lambda: fn(self, *args)),
                name=f"host-call-{msg.method}",
                daemon=True,
            ).start()
            return
        answer_call(self.channel, rid, lambda: fn(self, *args))

    def _notify(self, msg: ChannelMessage) -> None:
        """One-way calls: only ``launch`` (:meth:`ProcessAgent.launch` waits for no answer)."""
        if isinstance(msg, Call) and msg.method == "launch":
            self._launch()

    def _eof(self, detail: str) -> None:
        if not self._closing:  # else this end closed it: nothing is left running to stop
            cause = f"control side gone ({detail})"
            self._cancel = self._cancel or cause
            self.inbox.signal(ExitSignal(None, self._cancel))
        self._stop.set()
        self._pending.set()  # the flusher sees the channel closed and ends

    # -- what the control side may ask ---------------------------------------------------------

    def _push(self, item: InboxMsg) -> PushEffect:
        return self.inbox.push(item)

    def _launch(self) -> None:
        self._launched.set()

    def _import_context(self, events: tuple[Any, ...], note: str | None) -> None:
        assert self.agent is not None
        self.agent.import_context(events, note)

    def _probe(self) -> dict[str, Any]:
        """Never waits: it runs on the reader thread, which must stay free to read the replies
        the drive loop waits for (a shell busy in a run answers its actor only afterwards)."""
        agent = self.agent
        return {
            "pid": os.getpid(),
            "shell_pid": agent.last_shell_pid if agent is not None else None,
            "inbox": self.inbox.depths(),
            "stats": agent.stats if agent is not None else None,
        }

    def _live(self) -> LiveFigures | None:
        agent = self.agent
        if agent is None:
            return None
        provider = agent.provider.current()
        return LiveFigures(
            state=agent.stats.state,
            model=provider.describe(),
            used_tokens=agent.log.used_tokens,
            window=provider.window_tokens,
            running_workers=self._workers.read(agent.shell, busy=agent.eval_root.busy),
            running_eval=agent.eval_root.busy,
            stats=agent.stats,
        )


SHELL_STOP_TIMEOUT = 15.0
"""Seconds an agent's end waits for its shell actor to stop (its close gives the shell host a
1 s grace before the kill, and reaps it), and after ``Ended`` for a host killed behind the
living to be reaped."""


def _end_shell(agent: Agent) -> tuple[int | None, bool, ChildProcess | None]:
    """Stop the agent's shell at its end: its host's pid as of the stop (a rollback's, not the
    one ``Born`` named), whether the shell was stopped, and its host if it is left to reap
    once ``Ended`` is sent. An idle shell actor (an ended agent's) is closed on this thread
    and its host killed behind the living (:meth:`ShellActor.end_here`: SIGKILLed, its
    memory's reclaim in the idle class; the 100-agent cascade settled in 281 ms against 318 when
    each end waited for that reclaim, docs/benchmarks.md; pykka's
    ``ActorRef._actor_weakref`` reaches the actor, as :func:`actors.shell.run_call` does):
    no hand-off to the actor thread and back; the actor itself is stopped after ``Ended``
    (:func:`_stop_shell_actor`). Otherwise (a message still queued) the same end is queued on
    the actor (:meth:`ShellActor.end_behind`): one hand-off, and the host still reaped after
    the report."""
    shell = agent.shell
    actor = getattr(getattr(shell, "actor_ref", None), "_actor_weakref", _no_actor)()
    if isinstance(actor, ShellActor):  # idle, as an ended agent's shell is: closed right here
        closed, host_pid, dying = actor.end_here()
        if closed:
            return (host_pid if host_pid is not None else agent.last_shell_pid), True, dying
    try:
        pid, dying = shell.end_behind().get(timeout=SHELL_STOP_TIMEOUT)
    except pykka.ActorDeadError:
        return agent.last_shell_pid, True, None
    except Exception:
        log.exception("stopping %s's shell at its end failed", agent.name)
        return agent.last_shell_pid, False, None
    return (pid if pid is not None else agent.last_shell_pid), True, dying


def _stop_shell_actor(agent: Agent) -> None:
    """Queue the stop of the agent's shell actor, closed at its end (:func:`_end_shell`): its
    thread ends while the control side settles, after ``Ended`` rather than before it, and
    :func:`stop_agent_shell` then finds it stopped. A tell, as pykka's own ``Actor.stop``
    sends it: no future nobody reads."""
    with contextlib.suppress(pykka.ActorDeadError):
        agent.shell.actor_ref.tell(pykka.messages._ActorStop())


def _no_actor() -> None:
    return None


def _stand_back_reached() -> None:
    """Once this agent's busy shell is killed: its end runs behind the rest of the cascade."""
    stand_back(REACHED_NICE)


HOST_CALLS: dict[str, Callable[..., Any]] = {
    "push": AgentProcess._push,
    "launch": AgentProcess._launch,
    "import_context": AgentProcess._import_context,
    "probe": AgentProcess._probe,
    "live": AgentProcess._live,
    "recover": AgentProcess._recover,
}
"""What the control side may call in a host, by name."""

WRITING_CALLS = frozenset({"recover", "import_context"})
"""Host calls that append to the agent's event log: each runs on a thread of its own, not on
the channel's reader. A host that ships its records (a Ray node's, ``--durability machine``)
waits for the driver's acknowledgement of each write, and that acknowledgement arrives on the
reader: run there, ``resume``'s ``recover`` waited on itself until its 120 s timeout."""


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
        self._commits = host.boot.session.commits(host.name)  # built once, not once per ral call

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
        self._host.before_wait()
        return run_agent_shell(self._agent(), self._commits, script)

    def before_wait(self) -> None:
        self._host.before_wait()

    def resources(self, name: str) -> Resources:
        lease = self._host.call("lease_figures", name)
        return agent_resources(self._agent(), self.session, self.disk_warn_bytes, lease)

    def prices(self) -> PriceTable:
        return self._host.boot.prices

    def charge(self, name: str, cost: Decimal | None) -> None:
        if self._host.boot.budget:
            self._host.call("charge", name, cost)
        else:
            self._host.buffer(Charge(name, cost))

    def publish(self, event: Event) -> None:
        self._host.buffer(event)

    def record_rejected(self, rejection: InboxRejected) -> None:
        self._host.buffer(rejection)

    def standing(self, name: str) -> Standing:
        if name == self._host.name:  # its own: the cancel frames keep it (module docstring)
            return Standing(registered=True, cancel_cause=self._host.cancel_cause)
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

    def wait_children(
        self,
        parent: str,
        wait_id: str,
        names: tuple[str, ...] | None,
        then: Callable[[WaitAnswer | BaseException], None],
    ) -> WaitAnswer | None:
        """Answered late by the control side (its ``DEFERRED_CALLS``): ``then`` runs on this
        process's channel reader when the reply comes (or the channel ends)."""

        self._late("wait_children", (parent, wait_id, names), then)
        return None

    def mcp_begin(self, request: McpRequest, then: Callable[[Any], None]) -> None:
        """Answered late by the control side, as ``wait_children`` is."""
        self._late("mcp_begin", (request,), then)

    def _late(self, method: str, args: tuple[Any, ...], then: Callable[[Any], None]) -> None:
        """A call the control side answers late (its deferred calls): ``then`` runs on this
        process's channel reader with the value, or the refusal re-raised here (``NotAChild``,
        ``NotGranted``, a tool's failure), or the channel's end."""

        def answered(reply: ChannelMessage | None, error: BaseException | None) -> None:
            if error is not None or reply is None:
                then(error or SiteRefused(f"{method}: no answer"))
                return
            try:
                then(returned(method, reply))
            except Exception as e:
                then(e)

        self._host.flush()
        self._host.channel.begin(Call(method, pickle.dumps(args)), WAIT_TIMEOUT, then=answered)

    def mcp_cancel(self, agent: str, call_id: str) -> None:
        """Sent without waiting for its answer: the caller is being cancelled."""
        self._host.channel.begin(
            Call("mcp_cancel", pickle.dumps((agent, call_id))),
            CALL_TIMEOUT,
            then=lambda reply, error: None,
        )

    def stop_wait(self, parent: str, wait_id: str, give_back: bool) -> WaitAnswer | None:
        result: WaitAnswer | None = self._host.call("stop_wait", parent, wait_id, give_back)
        return result

    def give_back(self, parent: str, ends: tuple[ChildEnd, ...]) -> None:
        self._host.call("give_back", parent, ends)

    def read_result(self, parent: str, child: str) -> tuple[dict[str, Any], int]:
        result: tuple[dict[str, Any], int] = self._host.call("read_result", parent, child)
        return result

    def spawn(self, request: SpawnRequest) -> dict[str, Any]:
        portable = replace(request, provider=unrecorded(request.provider))
        result: dict[str, Any] = self._host.call("spawn", portable)
        return result

    def branch(self, request: BranchRequest) -> str:
        portable = replace(request, provider=unrecorded(request.provider))
        return str(self._host.call("branch", portable))


class ChannelRecorder:
    """``--record`` in an agent process: what its :class:`RecordingProvider` records is written
    by the control side's recorder (one writer of the recording), synchronously, so a reply is
    recorded before the agent admits it, as in the thread backend."""

    def __init__(self, host: AgentProcess) -> None:
        self._host = host

    def spawned(self, child: str, parent: str) -> None:
        self._host.call("record_spawned", child, parent)

    def reply(self, agent: str, msg: AssistantMessage) -> None:
        self._host.call("record_reply", agent, msg)

    def failure(self, agent: str, kind: str, message: str, partial: AssistantMessage) -> None:
        self._host.call("record_failure", agent, kind, message, partial)
