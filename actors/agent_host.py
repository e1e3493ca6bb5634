"""The agent host: one OS process per agent, started from the control process's fork server.

Groundwork for running each agent in its own process (not yet used by the fleet). Today the
host runs a minimal loop around one agent's shell: it answers pings and probes, runs ral
scripts on its :class:`~actors.shell.ShellActor` (whose shell host is its own child process as
in the fleet), admits results, messages and commands into the agent's quota :class:`Inbox`
with a synchronous verdict, handles cancel / interrupt on its channel reader thread, reports
``BornFrame`` and ``DiedFrame``, and exits on ``Shutdown`` or at the channel's end of file.

Control side: :class:`AgentHost` starts one and is its handle. Host side:
:func:`agent_host_main` is the process entry point.

Invariants:

- **One fork server.** The host is forked by the control process's preloaded fork server, and
  so is its shell host (:func:`actors.process.use_fork_server`): no process ever forks after it
  has started threads, and no agent re-imports the runtime. The alternative -- the control side
  starts the shell host and passes its pipe ends with ``socket.send_fds`` -- was measured
  slower (``benchmarks/agent_host.py``) and would spend control-process CPU on every spawn.
- **No orphans.** The host dies with the fork server (``PR_SET_PDEATHSIG``) and so with the
  control process; its shell host dies with the fork server too, and sees end of file on its
  pipes when its agent host dies; :meth:`AgentHost.kill` also kills the shell named in
  ``BornFrame``.
- **Control frames bypass the main loop.** Cancel and interrupt trip the shell's eval root from
  the channel's reader thread, while the main thread is blocked in the run they stop.
- **A crash is an end of file without ``DiedFrame``.** :attr:`AgentHost.exit` then carries the exit
  status, the supervisor's input (``runtime/fleet/supervision.py``).
- Threads in the host: main (the run loop), the channel reader, the shell actor's thread.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil

from exarch_actors.actors.channel import AgentChannel
from exarch_actors.actors.priority import yield_to_control
from exarch_actors.actors.process import (
    become_group_leader,
    die_with_parent,
    fork_server_address,
    process_context,
    start_process,
    use_fork_server,
)
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.errors import ExarchError, InboxFull
from exarch_actors.runtime.fleet.agent_channel import (
    BornFrame,
    CancelFrame,
    ChannelMessage,
    DeliverResult,
    DiedFrame,
    Envelope,
    Failed,
    InterruptFrame,
    Ping,
    Pong,
    Probe,
    ProbeReply,
    RunScript,
    ScriptResult,
    SendMessage,
    Shutdown,
    SlashCommand,
    Steer,
    VerdictFrame,
    rejection_of,
)
from exarch_actors.runtime.fleet.inbox import (
    AgentMessage,
    AgentResult,
    Command,
    Inbox,
    InboxMsg,
    UserSteering,
)
from exarch_actors.runtime.state.session_dir import SessionDir

BORN_TIMEOUT = 30.0
"""Seconds a new agent host may take to report ``BornFrame`` (its shell restored and ready)."""


class AgentHostFailed(ExarchError):
    """An agent host could not start, or ended before it was born."""


# -- host side --------------------------------------------------------------------------------


def agent_host_main(conn: Connection, fork_address: str, name: str, session: SessionDir) -> None:
    """Process entry point of an agent host (runs in the fork-server child)."""
    become_group_leader()
    die_with_parent()
    yield_to_control()
    # started as a daemon (so the control process's exit terminates it), but a daemonic
    # multiprocessing process may not start children, and this one starts its shell host
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    use_fork_server(fork_address)
    HostLoop(conn, name, session).serve()


_STOP = object()


class HostLoop:
    """The host's state: its channel, its shell, its inbox, and the queue the main thread runs."""

    def __init__(self, conn: Connection, name: str, session: SessionDir) -> None:
        self.name = name
        self.session = session
        self.inbox = Inbox(recipient=name)
        self.work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cause = "shutdown"
        self.cancelled: str | None = None
        self._shell: Any = None
        self._root: Any = None
        self._shell_pid: int | None = None
        self.channel = AgentChannel(
            conn,
            peer="control",
            on_control=self._control,
            on_request=self._request,
            on_eof=self._eof,
        )

    def serve(self) -> None:
        self.channel.start()
        status = "shutdown"
        try:
            self._shell = ShellActor.start(name=self.name, session=self.session)
            proxy = self._shell.proxy()
            self._root = proxy.eval_root.get()
            self._shell_pid = proxy.host_pid().get()
            if self.cancelled is not None:  # a cancel that overtook the boot
                self._root.cancel(self.cancelled)
            self.channel.send(BornFrame(self.name, os.getpid(), self._shell_pid))
            while True:
                item = self.work.get()
                if item is _STOP:
                    break
                env: Envelope = item
                assert isinstance(env.message, RunScript) and env.id is not None
                r = proxy.run(env.message.script).get()
                self._shell_pid = r.host_pid
                self.channel.reply(
                    env.id,
                    ScriptResult(
                        r.value, r.stdout, r.stderr, r.error, r.error_kind, r.epoch, r.host_pid
                    ),
                )
            status = "cancelled" if self.cancelled is not None else "shutdown"
        except Exception as e:
            status, self.cause = "failed", f"{type(e).__name__}: {e}"
        finally:
            if self._shell is not None:
                with contextlib.suppress(Exception):
                    self._shell.stop(timeout=10)
            self.channel.try_send(DiedFrame(self.name, status, self.cause))
            self.channel.close()

    # -- the reader thread's callbacks ---------------------------------------------------------

    def _control(self, msg: ChannelMessage) -> None:
        if isinstance(msg, CancelFrame):
            self.cancelled = msg.reason
            if self._root is not None:
                self._root.cancel(msg.reason)
        elif isinstance(msg, InterruptFrame):
            if self._root is not None:
                self._root.interrupt(msg.reason)
        elif isinstance(msg, Steer):
            self.inbox.push(UserSteering(msg.text))
        elif isinstance(msg, Shutdown):
            self.cause = msg.reason
            self.work.put(_STOP)

    def _request(self, env: Envelope) -> None:
        msg, rid = env.message, env.id
        assert rid is not None
        if isinstance(msg, Ping):
            self.channel.reply(rid, Pong(msg.seq, os.getpid()))
        elif isinstance(msg, RunScript):
            self.work.put(env)
        elif isinstance(msg, DeliverResult | SendMessage | SlashCommand):
            self.channel.reply(rid, self._admit(_inbox_message(msg)))
        elif isinstance(msg, Probe):
            self.channel.reply(rid, ProbeReply(self.name, self._figures()))
        else:
            self.channel.reply(rid, Failed("UnknownRequest", f"agent host: no {msg.KIND}"))

    def _admit(self, item: InboxMsg) -> VerdictFrame:
        try:
            outcome = self.inbox.push(item)
        except InboxFull as e:
            return rejection_of(e)
        return VerdictFrame(accepted=True, outcome=outcome.value)

    def _figures(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "shell_pid": self._shell_pid,
            "threads": threading.active_count(),
            "inbox": self.inbox.depths(),
            "cancelled": self.cancelled,
            "busy": bool(self._root is not None and self._root.busy),
        }

    def _eof(self, detail: str) -> None:
        self.cause = f"control side gone ({detail})"
        self.cancelled = self.cancelled or self.cause
        if self._root is not None:
            self._root.cancel(self.cause)
        self.work.put(_STOP)


def _inbox_message(msg: DeliverResult | SendMessage | SlashCommand) -> InboxMsg:
    if isinstance(msg, DeliverResult):
        return AgentResult(msg.child, msg.value, msg.status, msg.generation)
    if isinstance(msg, SendMessage):
        return AgentMessage(msg.sender, msg.text)
    return Command(msg.text)


# -- control side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class HostExit:
    """How an agent host ended, as the control side saw it."""

    pid: int
    exitcode: int | None
    """The process's exit status (negative: killed by that signal; None: not reaped yet)."""
    died: DiedFrame | None
    """The host's own ``DiedFrame`` report; None means it crashed (end of file without one)."""

    @property
    def crashed(self) -> bool:
        return self.died is None

    @property
    def cause(self) -> str:
        if self.died is not None:
            return f"{self.died.status}: {self.died.cause}"
        if self.exitcode is not None and self.exitcode < 0:
            return f"the agent host process died (signal {-self.exitcode})"
        return f"the agent host process exited (code {self.exitcode}) without reporting"


class AgentHost:
    """The control side's handle on one agent host process (see the module docstring).

    Thread-safe: every method may be called from any thread; replies and control frames travel
    on the channel, whose reader thread is this handle's only thread.
    """

    def __init__(self, name: str, session: SessionDir) -> None:
        self.name = name
        here, there = process_context().Pipe(duplex=True)
        self._born = threading.Event()
        self._ended = threading.Event()
        self.born: BornFrame | None = None
        self.died: DiedFrame | None = None
        self.exit: HostExit | None = None
        self._shell: psutil.Process | None = None
        self._reaped: HostExit | None = None
        self.channel = AgentChannel(
            here,
            peer=f"agent host {name}",
            on_notify=self._notify,
            on_eof=self._on_eof,
        )
        try:
            self.proc = start_process(
                agent_host_main,
                (there, fork_server_address(), name, session),
                name=f"agent-host-{name}",
            )
        except Exception as e:
            here.close()
            raise AgentHostFailed(f"agent {name}: cannot start an agent host: {e}") from e
        finally:
            there.close()
        self.pid: int = self.proc.pid or 0
        self.channel.start()

    def wait_born(self, timeout: float = BORN_TIMEOUT) -> BornFrame:
        """Block until the host reports ``BornFrame``; :class:`AgentHostFailed` if it ends first or
        does not report within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self._born.wait(0.05):
            if self._ended.is_set():
                ex = self.exit
                raise AgentHostFailed(
                    f"agent {self.name}: the host ended before it was born "
                    f"({ex.cause if ex else 'unknown'})"
                )
            if time.monotonic() > deadline:
                raise AgentHostFailed(f"agent {self.name}: not born within {timeout:g} s")
        assert self.born is not None
        return self.born

    # -- requests and control frames -----------------------------------------------------------

    def ping(self, seq: int = 0, timeout: float = 10.0) -> Pong:
        reply = self.channel.request(Ping(seq), timeout)
        assert isinstance(reply, Pong), reply
        return reply

    def run(self, script: str, timeout: float = 60.0) -> ScriptResult:
        reply = self.channel.request(RunScript(script), timeout)
        if isinstance(reply, Failed):
            raise AgentHostFailed(f"agent {self.name}: run failed: {reply.error}: {reply.detail}")
        assert isinstance(reply, ScriptResult), reply
        return reply

    def deliver(
        self, msg: DeliverResult | SendMessage | SlashCommand, timeout: float = 10.0
    ) -> VerdictFrame:
        """Push into the agent's inbox and return the host's verdict (accepted or rejected)."""
        reply = self.channel.request(msg, timeout)
        assert isinstance(reply, VerdictFrame), reply
        return reply

    def probe(self, timeout: float = 10.0) -> dict[str, Any]:
        reply = self.channel.request(Probe(self.name), timeout)
        assert isinstance(reply, ProbeReply), reply
        return reply.figures

    def cancel(self, reason: str = "cancelled") -> bool:
        return self.channel.try_send(CancelFrame(self.name, reason))

    def interrupt(self, reason: str = "interrupt") -> bool:
        return self.channel.try_send(InterruptFrame(self.name, reason))

    # -- lifetime ------------------------------------------------------------------------------

    def _notify(self, msg: ChannelMessage) -> None:
        if isinstance(msg, BornFrame):
            self.born = msg
            with contextlib.suppress(psutil.Error):
                if msg.shell_pid:
                    self._shell = psutil.Process(msg.shell_pid)
            self._born.set()
        elif isinstance(msg, DiedFrame):
            self.died = msg

    def _on_eof(self, detail: str) -> None:
        self.proc.join(5.0)
        self.exit = HostExit(self.pid, self.proc.exitcode, self.died)
        self._ended.set()

    def wait_exit(self, timeout: float = 10.0) -> HostExit | None:
        """The host's exit once its channel ended (None if it has not within ``timeout``)."""
        self._ended.wait(timeout)
        return self.exit

    def shutdown(self, reason: str = "shutdown", timeout: float = 10.0) -> HostExit:
        """Ask the host to stop its shell and exit; kill it if it does not within ``timeout``."""
        if self._reaped is not None:
            return self._reaped
        self.channel.try_send(Shutdown(reason))
        if not self._ended.wait(timeout):
            self.kill()
        return self.reap()

    def kill(self) -> None:
        """SIGKILL the host and the shell host it reported in ``BornFrame``; idempotent."""
        if self._reaped is not None:
            return
        for p in (self._shell,):
            with contextlib.suppress(psutil.Error):
                if p is not None and p.is_running():  # checks create time: no reused pid
                    p.kill()
        if self.proc.exitcode is None:
            with contextlib.suppress(OSError):
                self.proc.kill()

    def reap(self) -> HostExit:
        """Wait for the channel's end, kill what is left (a shell its dead host left behind),
        and close the handle. Returns how the host ended; idempotent."""
        if self._reaped is not None:
            return self._reaped
        if not self._ended.wait(10.0):
            self.kill()
            self._ended.wait(10.0)
        self.kill()  # the shell outlives a SIGKILLed host until it sees its pipes close
        self.channel.close()
        self.proc.join(5.0)
        ex = self.exit or HostExit(self.pid, self.proc.exitcode, self.died)
        with contextlib.suppress(ValueError):
            self.proc.close()
        self._reaped = ex
        return ex
