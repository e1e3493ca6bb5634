"""Detached ral workers: ``spawn { ... }`` runs the block in its own OS process.

Shape: the shell's host asks (an ``enquiry``) to spawn; the :class:`actors.shell.ShellActor`
mints an id, builds a :class:`WorkerLink` and starts a :class:`WorkerActor`, which owns one worker
process (started from the same preloaded fork server as shell hosts). The closure travels by the
ral codec (its source text + exactly the bindings it captured) and is re-parsed in the worker,
which applies it with no arguments in a fresh Session under the spawning run's dynamic context.

Cancellation: every worker's :class:`runtime.cancel.CancelScope` is a child of its shell's eval
root, so cancelling the root, closing the shell or ``clear`` reaches every worker with no edge of
its own. :meth:`WorkerLink.cancel` is thread-safe and bypasses every mailbox: it writes a
``cancel`` frame to the worker's control path (its evaluator stops within one poll interval and
kills the programs it started) and arms a hard kill of the worker's process group
:data:`CANCEL_GRACE` later, for a worker stuck where no poll point is reached.

Limits (documented, deliberate): a worker has no desk (agent verbs are unbound inside a
worker) and its own nested ``spawn`` uses the in-process default backend of the ral Session; a
worker's stdout/stderr are kept on its outcome but are not shown to the model (``await`` yields
the value only, as docs/language.md, Workers, says).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from exarch_actors.actors import pid_cgroup
from exarch_actors.actors.frames import Channel, ChannelClosed
from exarch_actors.actors.landlock import enter_sandbox
from exarch_actors.actors.mailbox import QuotaActor
from exarch_actors.actors.priority import yield_to_control
from exarch_actors.actors.process import (
    CancelListener,
    ChildProcess,
    become_group_leader,
    die_with_parent,
    end_programs,
    limit_memory,
    report_programs,
)
from exarch_actors.actors.shell_host import error_fields, frame_error_text
from exarch_actors.runtime.cancel import POLL_INTERVAL

log = logging.getLogger(__name__)

BODY_NAME = "__spawn_body"
"""The session name the worker binds the shipped closure to before applying it."""

CANCEL_GRACE = 1.0
"""Seconds a cancelled worker gets to stop at a poll point before its process group is killed
(a poll point is reached within POLL_INTERVAL, 10 ms, so 1 s only ever catches a stuck native)."""


@dataclass(frozen=True)
class WorkerOutcome:
    """How a worker ended: ``value`` (its ral encoding) or ``error`` ``[message, line, col,
    kind]``."""

    value: bytes | None
    error: list[Any] | None
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def worker_main(
    data_conn: Connection, ctl_conn: Connection, memory_bytes: int | None = None
) -> None:
    """Entry point of a worker process (a forkserver child)."""
    die_with_parent()
    yield_to_control()
    become_group_leader()
    limit_memory(memory_bytes)
    data = Channel(data_conn)
    ctl = Channel(ctl_conn)
    report_programs(data)
    try:
        frame = data.recv()
        if frame.kind != "run":
            return
        from exarch_actors.runtime.ral.codec import decode_value, encode_value
        from exarch_actors.runtime.ral.context import DynamicContext
        from exarch_actors.runtime.ral.session import Session

        context = DynamicContext.from_dict(dict(frame["context"]))
        pids = pid_cgroup.join_for(context.sandbox)  # before Landlock closes /sys
        enter_sandbox(context.sandbox, context.grants)  # before its cancel listener starts
        session = Session(context=context, faults=bool(frame.get("faults")))
        listener = CancelListener(ctl, session.cancel)
        session.restore({BODY_NAME: decode_value(frame["closure"])}, context)
        encoded: list[bytes] = []
        refused: list[str] = []

        def encode_in_scope(value: Any) -> str:
            """Encode the value inside the run's cancel scope (``Session.run``'s ``show``), as
            the shell host renders its result: a cancel reaches a long encoding at its next walk
            check, and the worker still reports its output. Encoded after the run, only the
            hard kill at CANCEL_GRACE could stop it, and its output died with it."""
            encoded.clear()
            try:
                encoded.append(encode_value(value))
            except Exception as e:  # not Cancelled (a BaseException): the run reports that
                refused.append(str(e))
            return ""

        listener.begin(0)
        rr = session.run(BODY_NAME, show=encode_in_scope)
        listener.end()
        if pids is not None and (n := pids.take_refusals()):
            rr = replace(rr, stderr=rr.stderr + pid_cgroup.refusal_line(n, pids.limit))
        if rr.error is not None:
            data.send("result", error=error_fields(rr.error), stdout=rr.stdout, stderr=rr.stderr)
        elif refused:
            data.send(
                "result",
                error=[f"worker value cannot leave its process: {refused[0]}", 0, 0, "runtime"],
                stdout=rr.stdout,
                stderr=rr.stderr,
            )
        else:
            data.send("result", value=encoded[0], stdout=rr.stdout, stderr=rr.stderr)
    except ChannelClosed:
        pass
    except MemoryError:  # past the shell's memory limit outside any native
        data.try_send("result", error=["worker ran out of memory (--shell-memory)", 0, 0, "panic"])
    except BaseException as e:  # an internal fault of the worker's evaluator
        data.try_send("result", error=[f"worker panicked: {type(e).__name__}: {e}", 0, 0, "panic"])
    finally:
        end_programs()  # nothing a program left running outlives its worker
        os._exit(0)


LOST = "lost"
"""The error kind of a worker that ended with the shell host that ran it (:func:`lost_link`)."""


def lost_text(worker_id: str) -> str:
    """What the model reads of a lost worker: its completion's error and ``await``'s."""
    return (
        f"worker {worker_id} was lost: it ended with the process that ran its shell "
        "(a control-process kill or an agent restart); run it again if its result is needed"
    )


def lost_link(worker_id: str) -> WorkerLink:
    """A settled link for a worker a restored registry says was running: its process is gone,
    so its outcome is that it was lost -- told to its agent once, like any completion."""
    link = WorkerLink(worker_id)
    link._settle(WorkerOutcome(None, [lost_text(worker_id), 0, 0, LOST]))
    return link


class WorkerLink:
    """The control side's thread-safe view of one worker: its outcome and its cancel path."""

    def __init__(self, worker_id: str, on_settle: Callable[[str], None] | None = None) -> None:
        self.id = worker_id
        self.done = threading.Event()
        self.outcome: WorkerOutcome | None = None
        self.cancel_reason: str | None = None
        self._on_settle = on_settle
        self._lock = threading.Lock()
        self._proc: ChildProcess | None = None
        self._kill_at: float | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the worker (from any thread; never through a mailbox). Idempotent."""
        with self._lock:
            if self.done.is_set():
                return
            if self.cancel_reason is None:
                self.cancel_reason = reason
            if self._kill_at is None:
                self._kill_at = time.monotonic() + CANCEL_GRACE
            proc = self._proc
        if proc is not None:
            proc.ctl.try_send("cancel", run=0, reason=reason)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def error_text(self) -> str | None:
        """The ral error ``await`` re-raises, or None when the worker yielded a value."""
        out = self.outcome
        if out is None or out.error is None:
            return None
        if out.error[3] == LOST:
            return str(out.error[0])
        if out.error[3] == "cancelled":
            return f"worker {self.id} was cancelled ({self.cancel_reason or out.error[0]})"
        return f"worker {self.id} failed: {frame_error_text(out.error)}"

    def _attach(self, proc: ChildProcess) -> None:
        with self._lock:
            self._proc = proc
            pending = self.cancel_reason
        if pending is not None:
            proc.ctl.try_send("cancel", run=0, reason=pending)

    def _kill_due(self) -> bool:
        with self._lock:
            return self._kill_at is not None and time.monotonic() >= self._kill_at

    def _settle(self, outcome: WorkerOutcome) -> None:
        with self._lock:
            if self.done.is_set():
                return
            self.outcome = outcome
            self.done.set()
        if self._on_settle is not None:
            try:
                self._on_settle(self.id)
            except Exception:  # the outcome is already kept above; only the notification failed
                log.exception("on_settle hook failed for worker %s", self.id)


@dataclass(frozen=True)
class _Finished:
    """Told to the WorkerActor by its watcher thread once the process has ended."""


class WorkerActor(QuotaActor):
    """Owns one worker OS process for its whole life; stops itself once the worker settled.

    Its watcher (a daemon thread) waits on the process's result frame and exit sentinel, settles
    the :class:`WorkerLink`, and applies the hard kill a cancel armed. ``on_stop`` kills a worker
    still running (the process group, so its programs too) and reaps it.
    """

    def __init__(
        self,
        link: WorkerLink,
        closure: bytes,
        context: dict[str, Any],
        faults: bool,
        memory_bytes: int | None = None,
    ) -> None:
        self.link = link  # before super().__init__: the mailbox names its recipient
        super().__init__()
        self._closure = closure
        self._context = context
        self._faults = faults
        self._memory = memory_bytes
        self._proc: ChildProcess | None = None
        self._watcher: threading.Thread | None = None

    def mailbox_recipient(self) -> str:
        return f"worker {self.link.id}"

    def on_start(self) -> None:
        try:
            proc = ChildProcess(
                worker_main, name=f"ral-worker-{self.link.id}", memory_bytes=self._memory
            )
        except Exception as e:
            self.link._settle(WorkerOutcome(None, [f"worker did not start: {e}", 0, 0, "panic"]))
            self.stop()
            return
        self._proc = proc
        self.link._attach(proc)
        proc.data.try_send("run", closure=self._closure, context=self._context, faults=self._faults)
        self._closure = b""
        self._watcher = threading.Thread(
            target=self._watch, name=f"worker-watch-{self.link.id}", daemon=True
        )
        self._watcher.start()

    def _watch(self) -> None:
        proc = self._proc
        assert proc is not None
        outcome: WorkerOutcome | None = None
        while outcome is None:
            ready = proc.wait_frame(POLL_INTERVAL * 5)
            if proc.data.conn in ready:
                try:
                    frame = proc.data.recv()
                except ChannelClosed:
                    outcome = self._died(proc)
                else:
                    if frame.kind == "notice" and frame.get("program") is not None:
                        proc.adopt_program(int(frame["program"]))
                    if frame.kind == "result":
                        outcome = WorkerOutcome(
                            frame.get("value"),
                            frame.get("error"),
                            str(frame.get("stdout") or ""),
                            str(frame.get("stderr") or ""),
                        )
            elif proc.sentinel in ready:
                outcome = self._died(proc)
            if outcome is None and self.link._kill_due():
                proc.kill()
        self.link._settle(outcome)
        try:
            self.actor_ref.tell(_Finished())
        except Exception:  # already stopping
            pass

    def _died(self, proc: ChildProcess) -> WorkerOutcome:
        proc.proc.join(1.0)
        code = proc.proc.exitcode
        if self.link.cancel_reason is not None:
            return WorkerOutcome(None, [self.link.cancel_reason, 0, 0, "cancelled"])
        return WorkerOutcome(None, [f"worker process died (exit code {code})", 0, 0, "panic"])

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Finished):
            self.stop()
            return None
        return super().on_receive(message)

    def on_undelivered(self, messages: list[Any]) -> None:
        """A ``_Finished`` racing the stop is expected; nothing else is ever told to a worker."""

    def on_stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if not self.link.done.is_set():
            self.link.cancel("worker stopped")
            proc.kill()
        if self._watcher is not None:
            self._watcher.join(5.0)
        proc.reap(grace=1.0)
        self._proc = None


def start_worker(
    worker_id: str,
    closure: bytes,
    context: dict[str, Any],
    *,
    faults: bool,
    on_settle: Callable[[str], None] | None = None,
    memory_bytes: int | None = None,
) -> tuple[WorkerLink, Any]:
    """Start one worker; returns its link and the WorkerActor's ref."""
    link = WorkerLink(worker_id, on_settle)
    ref = WorkerActor.start(link, closure, context, faults, memory_bytes)
    return link, ref
