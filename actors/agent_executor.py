"""The executor of a child agent: its environment is its shell process plus its scratch directory.

This adapts a running :class:`actors.agent.Agent` to the
:class:`runtime.settlement.executor.Executor`
interface so the settlement rules of ``runtime/settlement/release_sweep.py`` (admission phases,
teardown
receipts, the release sweep) apply to every child by construction.

Receipts tell the truth about what remains: a shell this executor closed is
``destroyed``; a shell process that died outside teardown (SIGKILL, OOM) is ``gone`` with
``destroyed: false`` — its scratch is kept as evidence and the release sweep closes the slot as
``release-unconfirmed`` naming exactly what a sweeper must delete.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import psutil

from exarch_actors.actors.process_identity import exited
from exarch_actors.runtime.settlement.cost import dollars
from exarch_actors.runtime.settlement.executor import (
    Accounting,
    CancelAck,
    EnvironmentState,
    Execution,
    ExecutionResult,
    ExecutionSpec,
    InFlight,
    Observation,
    Receipt,
)
from exarch_actors.runtime.settlement.fleet_yield import settlement_status
from exarch_actors.runtime.state.private import private_dirs

if TYPE_CHECKING:
    from pathlib import Path
    from threading import Event

    from exarch_actors.actors.agent import AgentOutcome, AgentStats


class ExecutedAgent(Protocol):
    """What an executor reads of its agent, wherever it runs (a thread of the control process
    or an agent process of its own)."""

    name: str
    site: Any
    """Its site: the session directory names its scratch and snapshot."""
    done: Event
    outcome: AgentOutcome | None
    stats: AgentStats

    @property
    def shell_stopped(self) -> bool:
        """Its own host stopped its shell in order as the agent ended -- closed it, or
        SIGKILLed it to be reaped after (never died outside a teardown)."""
        ...

    def shell_pid(self) -> int | None: ...

    def shell_healthy(self) -> bool: ...

    def cancel(self, cause: str) -> None: ...


class AgentExecutor:
    """Execution environment of one child agent (see the module docstring)."""

    def __init__(self, agent: ExecutedAgent, stop_shell: Callable[[Any], None]) -> None:
        """``stop_shell`` is the spawn site's idempotent shell stop (teardown's first step)."""
        self._agent = agent
        self._stop_shell = stop_shell
        self._started = time.monotonic()
        self._ended: float | None = None
        self._outcome: AgentOutcome | None = None
        self._closed = False
        self._gone = False
        self._lock = threading.Lock()
        self._pid: int | None = None
        session = agent.site.session
        self.scratch = session.scratch(agent.name)
        self.snapshot = str(session.snapshot(agent.name))
        """Its shell snapshot's path (a file that may not exist yet), named once here: the
        settlement reads it at the agent's end."""
        self.event_log = str(session.events(agent.name))
        """Its current event log's path, as the settlement's ``execution-result`` names it."""

    @property
    def environment_id(self) -> str:
        """Stable for the node's life: the shell's pid may change across rollbacks."""
        return f"agent:{self._agent.name}"

    # --- required surfaces ------------------------------------------------------------------

    def execute(self, spec: ExecutionSpec) -> Execution:
        """Provision: the shell host is already up (built with the agent); the spawn site
        launches the drive loop only after the journal has recorded ``dispatched``, so a fast
        child can never settle before its admission is complete."""
        private_dirs(self.scratch)
        self._pid = self._agent.shell_pid()
        started_at = None
        try:
            started_at = psutil.Process(self._pid).create_time() if self._pid else None
        except psutil.Error:
            pass
        return Execution(
            environment_id=self.environment_id,
            node_id=spec.node_id,
            pid=self._pid or -1,
            scratch=str(self.scratch),
            pid_started_at=started_at,
        )

    def result(self, timeout: float | None = None) -> ExecutionResult | None:
        if not self._agent.done.wait(timeout):
            return None
        outcome = self._agent.outcome
        value = outcome.value if outcome is not None else None
        return ExecutionResult(settlement_status(value), None, value or "")

    def teardown(self, grace: float | Literal["brutal-kill", "infinity"]) -> Receipt:
        with self._lock:
            if not self._closed and not self._agent.shell_stopped and not self._process_alive():
                self._gone = True  # died outside teardown: every later receipt says so too
            gone_before = self._gone
            if not self._closed:
                self._stop_shell(self._agent)
                self._closed = True
            alive = self._process_alive()
            if alive and grace == "brutal-kill" and self._pid:
                try:
                    os.kill(self._pid, 9)
                except OSError:
                    pass
                alive = self._process_alive()
            if alive:
                return self._receipt(
                    False,
                    EnvironmentState.ALIVE_UNDELETABLE,
                    "shell process still running after close",
                )
            kept = getattr(self._agent, "scratch_kept", None)
            if kept is not None:  # its host on a node stopped its shell but kept its scratch
                return self._receipt(
                    False,
                    EnvironmentState.ALIVE_UNDELETABLE,
                    f"its host on node {self._node()} could not remove its scratch there: {kept}",
                )
            if gone_before:
                node = self._node()
                return self._receipt(
                    False,
                    EnvironmentState.GONE,
                    "shell process died outside teardown; scratch kept as evidence"
                    if node is None
                    else f"its host on node {node} is gone (the node lost, or its Ray worker "
                    "killed) and was not restarted: the shell and scratch it had there cannot "
                    "be confirmed destroyed",
                )
            try:
                remove_scratch(self.scratch)
            except FileNotFoundError:
                pass
            except OSError as e:
                return self._receipt(
                    False, EnvironmentState.ALIVE_UNDELETABLE, f"scratch could not be removed: {e}"
                )
            return self._receipt(True, EnvironmentState.DESTROYED, "shell closed, scratch removed")

    # --- optional surfaces ------------------------------------------------------------------

    def release_retained(self) -> list[Receipt]:
        return [self.teardown(1.0)]

    def recover(self) -> Execution | None:
        """Reattach only: a live agent is this one; nothing is ever started in its place."""
        if self._agent.done.is_set() or self._pid is None:
            return None
        return Execution(self.environment_id, self._agent.name, self._pid, str(self.scratch), None)

    def cancel(self) -> CancelAck:
        if self._agent.done.is_set():
            return CancelAck("already-terminal", "the agent had already ended")
        if self._outcome is not None:  # its own exit settles it; ``done`` is set only after
            return CancelAck("accepted", "the agent acknowledged by ending")
        self._agent.cancel("cancel")
        if self._agent.done.wait(2.0):
            return CancelAck("accepted", "the agent acknowledged by ending")
        return CancelAck("unknown", "cancel sent; no acknowledgement within 2 s")

    def accounting(self) -> Accounting:
        s = self._agent.stats
        end = self._ended if self._ended is not None else time.monotonic()
        known = s.tokens_known
        money = s.spend.read()
        return Accounting(
            tokens_in=s.input_tokens if known else None,
            tokens_out=s.output_tokens if known else None,
            unmetered_turns=0 if known or s.steps == 0 else s.steps,
            wall_seconds=round(end - self._started, 3),
            cache_write=money.cache_write if known else None,
            cache_read=money.cache_read if known else None,
            cost_usd=dollars(money.cost),
        )

    def observe(self) -> Observation:
        if self._pid is None:
            return Observation("never-started")
        if self._process_alive():
            return Observation("running")
        return Observation("exited", detail="shell process not running")

    def in_flight(self) -> InFlight:
        return InFlight(
            turn=self._agent.stats.turns,
            events=tuple(self._agent.stats.in_flight),
            snapshot_path=self.snapshot_at_end(),
        )

    # --- for the spawn site -----------------------------------------------------------------

    def snapshot_at_end(self) -> str | None:
        """Its snapshot's path if the file exists now, else None."""
        return self.snapshot if os.path.exists(self.snapshot) else None

    def finished(self, outcome: AgentOutcome) -> None:
        self._outcome = outcome
        self._ended = time.monotonic()

    def observable(self) -> bool:
        """Whether the environment can be observed now; a shell killed for good cannot, nor
        one on a node whose host is lost."""
        return self._agent.shell_healthy()

    def unobservable_cause(self) -> str:
        """Why :meth:`observable` says no: its host's node is out of reach, or its shell died."""
        return "host-lost" if getattr(self._agent, "host_lost", False) else "unobservable"

    def _node(self) -> str | None:
        """The node its host ran on when that is not this machine (a backend's), else None."""
        node = getattr(self._agent, "node", "local")
        return None if node == "local" else str(node)

    def _process_alive(self) -> bool:
        if self._agent.shell_stopped:
            # its host stopped this shell before reporting its end: no /proc read
            # (the pid may already name another process), and the receipt names the shell it
            # had at its end (a rollback's), not the one admitted
            current = self._agent.shell_pid()
            if current is not None:
                self._pid = current
            return False
        if self._node() is not None:
            # its shell is on another node: the host answers for it (checked after the
            # in-order stop, which it also calls healthy: observable, not running)
            return self._agent.shell_healthy()
        if not self._closed:  # a rollback replaces the host: follow the current pid
            current = self._agent.shell_pid()
            if current is not None:
                self._pid = current
        if not self._pid:
            return False
        return _running(self._pid)

    def _receipt(self, destroyed: bool, state: EnvironmentState, detail: str) -> Receipt:
        return Receipt(
            destroyed=destroyed,
            detail=detail,
            environment_id=self.environment_id,
            state=state,
            pid=self._pid,
            scratch=str(self.scratch),
        )


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has): one ``/proc`` read
    (:func:`actors.process_identity.exited`), ~0.1 ms of the control process's settle per
    agent less than psutil's ``status()``."""
    return not exited(pid)


def remove_scratch(scratch: Path) -> None:
    """Remove a scratch directory: one ``rmdir`` when it is empty (most agents write nothing
    there; ``shutil.rmtree``'s walk cost ~0.1 ms of the control process's settle per agent),
    else the whole tree."""
    try:
        os.rmdir(scratch)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(scratch, ignore_errors=False)
