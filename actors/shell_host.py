"""The shell host process: one ral ``Session`` and its binding-lease ledger in their own OS process.

Control side and host speak :mod:`actors.frames` over a duplex data channel; a second channel
(the **control path**) carries only ``cancel`` frames and is read by a thread of the host, so a
run in flight can be cancelled while the host's main thread is busy evaluating. ``session.cancel``
kills the external programs the run started; cancelling the shell's workers is the control
side's half (their processes are its children, not the host's).

Protocol (host's view):

- ``restore`` (boot, rollback, clear): build a fresh Session, restore the given bindings and
  context, adopt the ledger state or -- when none is given -- **arm** the ledger once, sealing
  every visible name as baseline; catch the ledger's clock up to the epoch; run the ready
  boundary; reply ``snapshot`` (full ledger state) then ``ready``.
- ``run``: catch the ledger's clock up to the run's epoch (one tick per ral call, failed ones
  included), evaluate, renew leases from ``RunResult.referenced``, run the ready boundary (prune
  only when the control side says a surface sink is installed), reply ``snapshot`` (changed
  binding encodings, removed names, context, ledger delta) then ``result``.
- An internal (non-ral) error escaping ``Session.run`` (``fault panic``) is a **panic**: the
  host sends ``panic`` and exits at once, since its state can no longer be trusted.
- While a run is in flight, the Desk and the WorkerBackend send ``enquiry`` frames and block
  for the matching ``answer``; a cancel of the run makes the host send ``abandon`` and unwind.

Process start (measured on the 2-core dev box: start a real host, restore an empty scope, run
``1``, read the result; 11 starts after a warm-up, median/worst): forkserver with the ral modules
preloaded **10.2 / 28.9 ms**, spawn 76.5 / 80.3 ms. Plain fork is unsafe here: the control
process runs pykka threads. So every host and worker starts from one preloaded fork server
(:func:`process_context`), without re-importing ``__main__`` (:class:`_NoMainPopen`).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Callable
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext, ForkServerProcess, set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any

import psutil

from actors.frames import Channel, ChannelClosed, Frame
from runtime.cancel import POLL_INTERVAL, Cancelled

PRELOAD = ["actors.shell_host", "actors.worker", "runtime.ral.session", "runtime.ral.codec"]
"""Modules the fork server imports once, so a new host or worker starts warm."""

FORK_VERBS = frozenset({"agent"})
"""Desk verbs that fork a child agent: their enquiry carries the live scope (seed 001's
``Shell::fork_into_nursery``: the child inherits every binding made so far, this run's too)."""

_ctx_lock = threading.Lock()
_ctx: BaseContext | None = None


def process_context() -> BaseContext:
    """The forkserver context with :data:`PRELOAD` set (once per control process)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _ctx = ctx
        return _ctx


class _NoMainPopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` without re-importing ``__main__`` in the child.

    Every target here lives in an importable module, so the child never needs the parent's main
    script; the stdlib would otherwise re-run it in each new host (under pytest that imports
    pytest; under an unguarded script it raises the "bootstrapping phase" error). The body is
    the stdlib's ``_launch`` (CPython 3.11) with the two main-module keys dropped.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(
            self,
            util.close_fds,  # type: ignore[attr-defined]
            (_parent_w, self.sentinel),
        )
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _NoMainPopen(process_obj)


def ensure_fork_server() -> None:
    """Start the fork server (and multiprocessing's resource tracker) now rather than at the
    first shell. Test suites call this from a session fixture so the long-lived helper
    processes are not mistaken for a test's leak."""
    process_context()
    forkserver.ensure_running()


# -- the control side's handle on one child process ------------------------------------------


class ChildProcess:
    """A host or worker process with its data and cancel channels (control side).

    The child makes itself a process-group leader first thing, so :meth:`kill` takes down the
    external programs it started too (a SIGKILLed evaluator cannot kill them itself).
    """

    def __init__(self, target: Callable[..., Any], *, name: str) -> None:
        ctx = process_context()
        data_here, data_there = ctx.Pipe(duplex=True)
        ctl_here, ctl_there = ctx.Pipe(duplex=True)
        self.data = Channel(data_here)
        self.ctl = Channel(ctl_here)
        self.proc: BaseProcess = _Process(
            target=target, args=(data_there, ctl_there), name=name, daemon=True
        )
        self.proc.start()
        data_there.close()
        ctl_there.close()
        self.pid: int = self.proc.pid or 0
        self._known: dict[int, psutil.Process] = {}

    @property
    def sentinel(self) -> int:
        return self.proc.sentinel

    def alive(self) -> bool:
        return self.proc.exitcode is None and self.proc.is_alive()

    def wait_frame(self, timeout: float | None, extra: tuple[Any, ...] = ()) -> list[Any]:
        """Block until the data channel is readable, the process exits, or an ``extra`` object
        (anything with ``fileno``) is readable. Returns the ready objects."""
        return wait([self.data.conn, self.proc.sentinel, *extra], timeout)

    def adopt_program(self, pid: int) -> None:
        """Remember an external program the child started (reported by a ``notice`` frame).

        The ral evaluator starts each program in a new session (so a cancel can kill its whole
        group), which also takes it out of the child's group: a SIGKILLed host would orphan it.
        The child reports every program the moment it starts (:func:`report_programs`), so a
        rollback can kill what the dead host left running.
        """
        if pid in self._known:
            return
        try:
            self._known[pid] = psutil.Process(pid)
        except psutil.Error:
            pass  # already gone

    def note_children(self) -> None:
        """Adopt the child's current children (a live child, about to be killed)."""
        for pid in _children_of(self.pid):
            self.adopt_program(pid)

    def kill(self) -> None:
        """SIGKILL the child, its process group and every program it started; idempotent."""
        if self.proc.exitcode is None:
            self.note_children()
        for pid in (self.pid, *self._known):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        for p in self._known.values():
            try:
                if p.is_running():  # psutil checks the create time: never a reused pid
                    p.kill()
            except psutil.Error:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass

    def reap(self, grace: float = 2.0) -> int | None:
        """Close the channels and join the process, killing it if it outlives ``grace``."""
        self.proc.join(grace)
        # kill() also takes down programs a dead host left behind (SIGKILL, os._exit)
        self.kill()
        self.proc.join(5.0)
        self.data.close()
        self.ctl.close()
        code = self.proc.exitcode
        try:
            self.proc.close()
        except ValueError:
            pass
        return code


def _children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc`` (cheap: no scan of every process)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return out


# -- shared by host and worker processes ----------------------------------------------------


def report_programs(data: Channel) -> None:
    """In a host or worker process: tie every external program's life to this process.

    Wraps ``subprocess.Popen`` for this process only (the evaluator looks it up at call time):

    - the program is started with ``PR_SET_PDEATHSIG = SIGKILL`` (Linux), so the kernel kills it
      the moment this process dies, however it dies -- no window in which a SIGKILLed host
      leaves it running;
    - its pid is announced with a ``notice`` frame, so the control side can also kill the
      program's own process group (its children) at a rollback.
    """
    import subprocess

    base = subprocess.Popen
    die_with_parent = _pdeathsig_setter()

    class _Reported(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if die_with_parent is not None and kwargs.get("preexec_fn") is None:
                kwargs["preexec_fn"] = die_with_parent
            super().__init__(*args, **kwargs)
            data.try_send("notice", program=self.pid)

    subprocess.Popen = _Reported  # type: ignore[misc]


def _pdeathsig_setter() -> Callable[[], None] | None:
    """A preexec function that makes the child die with this process (None off Linux).

    It only calls ``prctl`` and ``getppid`` (async-signal-safe system calls) in the forked
    child; the ``getppid`` check closes the race of the parent dying before ``prctl`` ran.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


def become_group_leader() -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


class CancelListener:
    """Reads the control path in its own thread and cancels the run it names.

    ``cancel`` frames carry the run id they target (``None`` = whatever is in flight). Because a
    cancel may overtake the ``run`` frame it targets, a cancel for a run not yet started is
    remembered and applied when that run begins; while the targeted run is in flight the
    listener re-trips ``session.cancel`` every poll interval, closing the window between a run
    starting and its scope existing. Between cancels the thread blocks (no idle wake-ups: a
    host costs nothing while its agent thinks).
    """

    def __init__(self, ctl: Channel, cancel: Callable[[str], None]) -> None:
        self._ctl = ctl
        self._cancel = cancel
        self._lock = threading.Lock()
        self._current: int | None = None
        self._max_cancelled = -1
        self._reason = "cancelled"
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.event = threading.Event()
        """Set while the current run is cancelled; enquiry waits poll it."""
        self.peer_gone = threading.Event()
        threading.Thread(target=self._loop, name="cancel-listener", daemon=True).start()

    def begin(self, run_id: int) -> None:
        with self._lock:
            self._current = run_id
            pending = run_id <= self._max_cancelled
            if pending:
                self.event.set()
            else:
                self.event.clear()
        if pending:
            self._cancel(self._reason)
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")  # the listener starts re-tripping this run

    def end(self) -> None:
        with self._lock:
            self._current = None
            self.event.clear()

    def _live(self) -> bool:
        with self._lock:
            return self._current is not None and self.event.is_set()

    def _loop(self) -> None:
        while True:
            live = self._live()
            ready = wait([self._ctl.conn, self._wake_r], POLL_INTERVAL if live else None)
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            if self._ctl.conn not in ready:
                if self._live():
                    self._cancel(self._reason)
                continue
            try:
                frame = self._ctl.recv()
            except ChannelClosed:
                self.peer_gone.set()
                self._reason = "control side gone"
                self.event.set()
                self._cancel(self._reason)
                return
            except Exception:
                continue
            if frame.kind != "cancel":
                continue
            target = frame.get("run")
            reason = str(frame.get("reason") or "cancelled")
            with self._lock:
                self._reason = reason
                if target is None:
                    hit = self._current is not None
                else:
                    self._max_cancelled = max(self._max_cancelled, int(target))
                    hit = self._current is not None and self._current <= int(target)
                if hit:
                    self.event.set()
            if hit:
                self._cancel(reason)


# -- the host process ------------------------------------------------------------------------


def host_main(data_conn: Connection, ctl_conn: Connection) -> None:
    """Entry point of a shell host process (runs in the forkserver child)."""
    become_group_leader()
    data = Channel(data_conn)
    ctl = Channel(ctl_conn)
    report_programs(data)
    core = HostCore(data, ctl)
    try:
        core.serve()
    finally:
        os._exit(0)


def error_fields(error: Any) -> list[Any] | None:
    """An ``ErrorInfo`` as a frame field ``[message, line, col, kind]``."""
    if error is None:
        return None
    return [str(error.message), int(error.line), int(error.col), str(error.kind)]


def frame_error_text(err: list[Any] | None) -> str | None:
    """The one-line display of an error field: ``line:col message`` when positioned."""
    if not err:
        return None
    message, line, col, _kind = err
    return f"{line}:{col} {message}" if line else str(message)


class HostCore:
    """The host process's state: the Session, the ledger, and what changed since the last
    boundary. Runs in the host's main thread only (the cancel listener touches nothing here
    but ``session.cancel``, which is thread-safe)."""

    def __init__(self, data: Channel, ctl: Channel) -> None:
        from runtime.ledger import BindingLedger

        self.data = data
        self.session: Any = None
        self.ledger = BindingLedger()
        self.epoch = 0
        self.running: set[str] = set()
        self.verbs: frozenset[str] = frozenset()
        self.dirty: dict[str, bytes | None] = {}
        """Names written since the last boundary -> their encoding (None: not encodable)."""
        self.notices: list[dict[str, Any]] = []
        self._eid = 0
        self.listener = CancelListener(ctl, self._cancel)

    def _cancel(self, reason: str) -> None:
        session = self.session
        if session is not None:
            session.cancel(reason)

    # -- the frame loop ------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                frame = self.data.recv()
            except ChannelClosed:
                return
            if frame.kind == "shutdown":
                return
            try:
                if frame.kind == "restore":
                    self.on_restore(frame)
                elif frame.kind == "run":
                    self.on_run(frame)
                elif frame.kind == "answer":
                    continue  # the late answer to an enquiry this host abandoned
                else:
                    raise RuntimeError(f"host cannot handle a {frame.kind!r} frame")
            except ChannelClosed:
                return
            except BaseException as e:  # an internal error: the state is suspect -> panic
                self.data.try_send("panic", reason=f"{type(e).__name__}: {e}")
                return

    def on_restore(self, f: Frame) -> None:
        from runtime.ledger import BindingLedger
        from runtime.ral.codec import decode_value
        from runtime.ral.context import DynamicContext
        from runtime.ral.session import Session

        self.verbs = frozenset(f.get("verbs") or ())
        context = DynamicContext.from_dict(dict(f["context"]))
        self.session = Session(
            context=context,
            desk=_EnquiryDesk(self) if self.verbs else None,
            workers=_EnquiryWorkers(self),
            faults=bool(f.get("faults")),
            define_hook=self._on_define,
        )
        blobs: dict[str, bytes] = dict(f.get("bindings") or {})
        values = {name: decode_value(blob) for name, blob in blobs.items()}
        self.session.restore(values, context)
        state = f.get("ledger")
        if state:
            self.ledger = BindingLedger.from_state(state)
        else:  # armed once per shell: everything visible now is sealed as baseline
            self.ledger = BindingLedger()
            self.ledger.arm(
                self.session.session_names(),
                idle_calls=int(f["idle_calls"]),
                large_bytes=int(f["large_bytes"]),
            )
        self.epoch = int(f.get("epoch") or 0)
        self.running = set(f.get("running") or ())
        self.dirty.clear()
        self.notices.clear()
        if f.get("tick"):  # the rolled-back call still counted on the ledger's clock
            self.ledger.tick()
        removed = self._boundary(bool(f.get("sink")))
        self._send_snapshot(removed)
        self.data.send("ready", notices=self._take_notices())

    def on_run(self, f: Frame) -> None:
        run_id = int(f["id"])
        self.epoch = int(f["epoch"])
        self.running = set(f.get("running") or ())
        self.ledger.tick()  # once per ral call, failed ones included
        self.listener.begin(run_id)
        try:
            rr = self.session.run(str(f["source"]))
        except Cancelled as c:  # the contract reports cancellation in RunResult; be safe
            self.listener.end()
            self._finish_run(None, cancelled=c.reason, sink=bool(f.get("sink")))
            return
        self.listener.end()
        self._finish_run(rr, cancelled=None, sink=bool(f.get("sink")))

    def _finish_run(self, rr: Any, *, cancelled: str | None, sink: bool) -> None:
        from runtime.ral.values import render

        if rr is not None and rr.referenced:
            self.ledger.renew(rr.referenced, self.epoch)
        removed = self._boundary(sink)
        self._send_snapshot(removed)
        if rr is None:
            self.data.send(
                "result",
                value="",
                stdout="",
                stderr="",
                error=[cancelled or "cancelled", 0, 0, "cancelled"],
                referenced=[],
                defined=[],
                compiled=True,
                notices=self._take_notices(),
            )
            return
        self.data.send(
            "result",
            value=render(rr.value),
            stdout=rr.stdout,
            stderr=rr.stderr,
            error=error_fields(rr.error),
            referenced=sorted(rr.referenced),
            defined=list(rr.defined),
            compiled=bool(rr.compiled),
            notices=self._take_notices(),
        )

    # -- the chokepoint and the ready boundary -------------------------------------------------

    def _on_define(self, name: str, value: Any) -> None:
        from runtime.ral.codec import encode_value

        try:
            blob: bytes | None = encode_value(value)
        except Exception:  # a builtin read as a value: it lives until a rollback, not beyond
            blob = None
        self.dirty[name] = blob
        size = len(blob) if blob is not None else 0
        large = self.ledger.note_define(name, self.epoch, size)
        if large is not None:
            self.notices.append(
                {
                    "notice": "LargeBinding",
                    "text": f"{name} holds {size} bytes (over {large.limit_bytes}); "
                    "bind a file path rather than the content",
                    "data": {"name": name, "size": size, "limit": large.limit_bytes},
                }
            )

    def _boundary(self, sink: bool) -> list[str]:
        """The ready boundary: prune idle leases when a surface sink is installed."""
        from runtime.ledger import reaches_running_worker

        running = self.running
        session = self.session

        def pins(name: str) -> bool:
            try:
                value = session.get(name)
            except KeyError:
                return False
            return reaches_running_worker(value, lambda h: h.id in running)

        outcome = self.ledger.prune(
            self.epoch, sink_installed=sink, mid_frame=bool(session.running), pins_running_work=pins
        )
        removed: list[str] = []
        if outcome.waited:
            return removed
        for name in outcome.fell:
            try:
                session.unset(name)
            except KeyError:
                pass
            self.dirty.pop(name, None)
            removed.append(name)
        if outcome.fell:
            self.notices.append(
                {
                    "notice": "Prune",
                    "text": f"pruned {len(outcome.fell)} idle binding(s): "
                    + ", ".join(outcome.fell),
                    "data": {"names": list(outcome.fell), "epoch": self.epoch},
                }
            )
        return removed

    def _send_snapshot(self, removed: list[str]) -> None:
        """Changed binding encodings, removed names, the context and the ledger state.

        The ledger travels whole (its ``to_state``): its layout belongs to ``runtime.ledger`` and
        its size is one small pair per leased name, not the bindings' bytes.
        """
        bindings = {n: b for n, b in self.dirty.items() if b is not None}
        removed = removed + [n for n, b in self.dirty.items() if b is None]
        self.data.send(
            "snapshot",
            epoch=self.epoch,
            bindings=bindings,
            removed=removed,
            context=self.session.context.to_dict(),
            ledger=self.ledger.to_state(),
        )
        self.dirty.clear()

    def _take_notices(self) -> list[dict[str, Any]]:
        out, self.notices = self.notices, []
        return out

    # -- enquiries -----------------------------------------------------------------------------

    def enquire(self, op: str, scope: Any = None, **fields: Any) -> Frame:
        """Ask the control side and block for the answer; a cancel abandons the wait."""
        self._eid += 1
        eid = self._eid
        self.data.send("enquiry", id=eid, op=op, **fields)
        while True:
            while not self.data.poll(POLL_INTERVAL):
                if self.listener.event.is_set() or (scope is not None and scope.cancelled):
                    self.data.try_send("abandon", id=eid)
                    raise Cancelled(getattr(scope, "reason", None) or "cancelled")
            frame = self.data.recv()
            if frame.kind == "answer":
                if frame.get("id") == eid:
                    return frame
                continue  # stale: the answer to an abandoned enquiry
            if frame.kind == "shutdown":
                os._exit(0)
            raise RuntimeError(f"unexpected {frame.kind!r} frame while awaiting enquiry {eid}")

    def fork_fields(self) -> dict[str, Any]:
        """The live scope and context, for a desk verb that forks a child agent."""
        from runtime.ral.codec import encode_value

        blobs: dict[str, bytes] = {}
        for name, value in self.session.bindings().items():
            try:
                blobs[name] = encode_value(value)
            except Exception:
                continue
        return {"bindings": blobs, "context": self.session.context.to_dict()}


class _EnquiryDesk:
    """The host's Desk: every advertised verb is answered by the control side."""

    def __init__(self, core: HostCore) -> None:
        self._core = core

    def verbs(self) -> frozenset[str]:
        return self._core.verbs

    def call(self, verb: str, args: list[Any]) -> Any:
        from runtime.ral.codec import decode_value, encode_value
        from runtime.ral.errors import DeskRefusal

        fields: dict[str, Any] = {"verb": verb, "args": [encode_value(a) for a in args]}
        if verb in FORK_VERBS:
            fields["fork"] = self._core.fork_fields()
        answer = self._core.enquire("desk", **fields)
        if answer.get("refusal") is not None:
            raise DeskRefusal(str(answer["refusal"]))
        return decode_value(answer["value"])


class _EnquiryWorkers:
    """The host's WorkerBackend: workers are OS processes owned by the control side."""

    def __init__(self, core: HostCore) -> None:
        self._core = core
        self._claimed: tuple[str, str, str] | None = None

    def spawn(self, closure: Any, ctx: Any, scope: Any) -> Any:
        from runtime.ral.codec import encode_value
        from runtime.ral.errors import RalError
        from runtime.ral.values import WorkerHandle

        answer = self._core.enquire("spawn", closure=encode_value(closure), context=ctx.to_dict())
        if answer.get("error"):
            raise RalError(str(answer["error"]))
        wid = str(answer["worker"])
        self._core.running.add(wid)
        return WorkerHandle(wid)

    def await_(self, handle: Any, scope: Any) -> Any:
        from runtime.ral.codec import decode_value
        from runtime.ral.errors import RalError

        answer = self._core.enquire("await", scope=scope, worker=handle.id)
        self._claimed = (
            handle.id,
            str(answer.get("stdout") or ""),
            str(answer.get("stderr") or ""),
        )
        if answer.get("error"):
            raise RalError(str(answer["error"]))
        return decode_value(answer["value"])

    def take_output(self, handle: Any) -> tuple[str, str]:
        """The claimed worker's stdout/stderr, handed once to the awaiting run."""
        claimed, self._claimed = self._claimed, None
        if claimed is None or claimed[0] != handle.id:
            return "", ""
        return claimed[1], claimed[2]

    def cancel(self, handle: Any) -> None:
        from runtime.ral.errors import RalError

        answer = self._core.enquire("cancel", worker=handle.id)
        if answer.get("error"):
            raise RalError(str(answer["error"]))
