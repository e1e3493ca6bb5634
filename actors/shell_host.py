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
  included), evaluate (a ``use`` compiled mid-run sends its referenced names as ``harvest``
  before its code runs: a panic rollback renews them with the script's own, so renewals survive
  it), renew leases from ``RunResult.referenced``, run the ready boundary (prune
  only when the control side says a surface sink is installed), reply ``result`` carrying the
  boundary's ``snapshot`` (changed binding encodings, removed names, context, ledger delta).
  Both frames leave out what is empty (an absent field reads as empty, ``compiled`` as true):
  a trivial call's ``result`` is its value and the ledger's clock.
- An internal (non-ral) error escaping ``Session.run`` (``fault panic``) is a **panic**: the
  host sends ``panic`` and exits at once, since its state can no longer be trusted.
- While a run is in flight, the Desk and the WorkerBackend send ``enquiry`` frames and block
  for the matching ``answer``; a cancel of the run makes the host send ``abandon`` and unwind.

Hosts start from the preloaded fork server of :mod:`actors.process`, which also holds the
control side's ``ChildProcess`` handle and the host-side :class:`CancelListener`.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

from exarch_actors.actors import pid_cgroup
from exarch_actors.actors.frames import Channel, ChannelClosed, Frame
from exarch_actors.actors.landlock import enter_sandbox
from exarch_actors.actors.priority import yield_to_control
from exarch_actors.actors.process import (
    CancelListener,
    become_group_leader,
    die_with_parent,
    end_programs,
    limit_memory,
    report_programs,
)
from exarch_actors.runtime.cancel import POLL_INTERVAL, Cancelled
from exarch_actors.runtime.ral.values import render
from exarch_actors.runtime.shell.limits import DEFAULT_MAX_BINDING_BYTES

FORK_VERBS = frozenset({"agent"})
"""Desk verbs that fork a child agent: their enquiry carries the live scope (the
child inherits every binding made so far, this run's too)."""


# -- the host process ------------------------------------------------------------------------


def host_main(data_conn: Connection, ctl_conn: Connection, memory_bytes: int | None = None) -> None:
    """Entry point of a shell host process (runs in the forkserver child)."""
    die_with_parent()
    yield_to_control()
    become_group_leader()
    limit_memory(memory_bytes)
    data = Channel(data_conn)
    ctl = Channel(ctl_conn)
    report_programs(data)
    core = HostCore(data, ctl)
    try:
        core.serve()
    finally:
        end_programs()  # nothing a program left running outlives its shell
        os._exit(0)


def _panic_reason(e: BaseException) -> str:
    if isinstance(e, MemoryError):  # past the shell's memory limit outside any native
        return "out of memory: the shell's memory limit was reached (--shell-memory)"
    return f"{type(e).__name__}: {e}"


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
        from exarch_actors.runtime.shell.ledger import BindingLedger

        self.data = data
        self.session: Any = None
        self.ledger = BindingLedger()
        self.epoch = 0
        self.running: set[str] = set()
        self.verbs: frozenset[str] = frozenset()
        self.dirty: dict[str, bytes] = {}
        """Names written since the last boundary -> their encoding."""
        self.max_binding_bytes = DEFAULT_MAX_BINDING_BYTES
        self.notices: list[dict[str, Any]] = []
        self._harvests = 0
        """Harvests of the run in flight (the first is the run's own)."""
        self._eid = 0
        self._sent_context: tuple[str, dict[str, str], Any] | None = None
        """(cwd, env, grants) as last sent: the context travels only when it changed."""
        self.listener = CancelListener(ctl, self._cancel)
        self.pids: pid_cgroup.Joined | None = None
        """The agent's pids cgroup leaf this host joined (None: no cap)."""

    def _cancel(self, reason: str) -> None:
        session = self.session
        if session is not None:
            session.cancel(reason)

    # -- the frame loop ------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                kind, fields = self.data.recv_fields()
            except ChannelClosed:
                return
            if kind == "shutdown":
                return
            try:
                if kind == "run":
                    self.on_run(fields)
                elif kind == "restore":
                    self.on_restore(Frame(kind, fields))
                elif kind == "answer":
                    continue  # the late answer to an enquiry this host abandoned
                else:
                    raise RuntimeError(f"host cannot handle a {kind!r} frame")
            except ChannelClosed:
                return
            except BaseException as e:  # an internal error: the state is suspect -> panic
                self.data.try_send("panic", reason=_panic_reason(e))
                return

    def on_restore(self, f: Frame) -> None:
        from exarch_actors.runtime.ral.codec import decode_value
        from exarch_actors.runtime.ral.context import DynamicContext
        from exarch_actors.runtime.ral.session import Session
        from exarch_actors.runtime.shell.ledger import BindingLedger

        self.verbs = frozenset(f.get("verbs") or ())
        self.max_binding_bytes = int(f.get("max_binding_bytes") or DEFAULT_MAX_BINDING_BYTES)
        context = DynamicContext.from_dict(dict(f["context"]))
        if self.pids is None:  # before Landlock: the cgroup files are outside every rule
            self.pids = pid_cgroup.join_for(context.sandbox)
        enter_sandbox(context.sandbox, context.grants)  # before any ral runs; once
        self.session = Session(
            context=context,
            desk=_EnquiryDesk(self) if self.verbs else None,
            workers=_EnquiryWorkers(self),
            faults=bool(f.get("faults")),
            define_hook=self._on_define,
            harvest_hook=self._on_harvest,
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
        self.data.send("snapshot", **self._snapshot_fields(removed, full=True))
        self.data.send("ready", notices=self._take_notices())

    def on_run(self, f: dict[str, Any]) -> None:
        """``f``: the run frame's fields (the map itself: no :class:`Frame` on this path)."""
        run_id = int(f["id"])
        self.epoch = int(f["epoch"])
        running = f.get("running")
        if running or self.running:
            self.running = set(running or ())
        self.ledger.tick()  # once per ral call, failed ones included
        self._harvests = 0
        sink = bool(f.get("sink"))
        self.listener.begin(run_id)
        try:
            rr = self.session.run(str(f["source"]), show=render)
        except Cancelled as c:  # the contract reports cancellation in RunResult; be safe
            self._end_run()
            self._finish_run(None, c.reason, sink)
            return
        self._end_run()
        self._finish_run(rr, None, sink)

    def _end_run(self) -> None:
        """The run is over: a cancelled one's programs were killed, and so is whatever they
        left running detached (``actors/descendants.py``); a clean run's keep running."""
        if self.listener.event.is_set():
            end_programs()
        self.listener.end()

    def _finish_run(self, rr: Any, cancelled: str | None, sink: bool) -> None:
        """One ``result`` frame carries the boundary's snapshot delta too: one write and one
        wake-up of the control side per call (a separate ``snapshot`` frame cost a third of the
        round trip's process switches)."""
        if rr is not None and rr.referenced:
            self.ledger.renew(rr.referenced, self.epoch)
        snapshot = self._snapshot_fields(self._boundary(sink) if sink else [])
        if rr is None:
            fields: dict[str, Any] = {"error": [cancelled or "cancelled", 0, 0, "cancelled"]}
        else:
            # Only what is not empty travels (the control side reads an absent field as empty,
            # ``compiled`` as true): a trivial call's frame is its value and its clock.
            fields = {"value": rr.shown}  # rendered inside the run's cancel scope
            if rr.stdout:
                fields["stdout"] = rr.stdout
            if rr.stderr:
                fields["stderr"] = rr.stderr
            if rr.error is not None:
                fields["error"] = error_fields(rr.error)
            if rr.referenced:
                fields["referenced"] = sorted(rr.referenced)
            if rr.defined:
                fields["defined"] = list(rr.defined)
            if not rr.compiled:
                fields["compiled"] = False
        refused = self.pids.take_refusals() if self.pids is not None else 0
        if refused and self.pids is not None:
            fields["stderr"] = fields.get("stderr", "") + pid_cgroup.refusal_line(
                refused, self.pids.limit
            )
        if self.notices:
            fields["notices"] = self._take_notices()
        fields["snapshot"] = snapshot
        self.data.send_fields("result", fields)

    # -- the chokepoint and the ready boundary -------------------------------------------------

    def _on_define(self, name: str, value: Any) -> None:
        """The chokepoint of every session binding, called *before* the name is bound: a value
        that cannot be kept across a rollback is refused here (a ral error naming it, nothing
        bound, so no Commit record can claim it) rather than bound, committed and later lost."""
        blob = encode_binding(name, value, self.max_binding_bytes)
        self.dirty[name] = blob
        size = len(blob)
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

    def _on_harvest(self, names: frozenset[str]) -> None:
        """A compile's referenced names. The run's own harvest (the first, before anything runs)
        is not sent: the control side has the script and derives it again if the run panics. A
        ``use`` compiled mid-run is not in the script, so its names are sent at once, before its
        code runs; a rollback renews them too. (A frame per call cost ~7% of a round trip.)"""
        self._harvests += 1
        if self._harvests > 1 and names:
            self.data.send("harvest", names=sorted(names))

    def _boundary(self, sink: bool) -> list[str]:
        """The ready boundary: prune idle leases when a surface sink is installed (with none,
        the ledger waits: nothing to examine)."""
        if not sink:
            return []
        from exarch_actors.runtime.shell.ledger import reaches_running_worker

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

    def _snapshot_fields(self, removed: list[str], *, full: bool = False) -> dict[str, Any]:
        """Changed binding encodings, removed names, the context (when it changed) and the
        ledger's changes.

        After a restore the ledger travels whole (``ledger``: its ``to_state``); after a run only
        what the run changed (``ledger_delta``: its ``take_delta``, folded in by
        ``runtime.shell.ledger.apply_delta``), so a call's frame follows the call, not the scope.
        """
        fields: dict[str, Any] = {"epoch": self.epoch}  # absent below: nothing changed
        if full:
            self.ledger.take_delta()  # the whole state travels: the next delta starts here
            fields["ledger"] = self.ledger.to_state()
        else:
            fields["ledger_delta"] = self.ledger.take_delta()
        if self.dirty:
            fields["bindings"] = dict(self.dirty)
        if removed:
            fields["removed"] = removed
        ctx = self.session.context
        sent = self._sent_context
        if (
            full
            or sent is None
            or sent[0] != ctx.cwd
            or (sent[2] is not ctx.grants and sent[2] != ctx.grants)
            or sent[1] != ctx.env
        ):
            # ~1.4 KB (the whole environment): packing and unpacking it every call cost ~7 µs
            self._sent_context = (ctx.cwd, dict(ctx.env), ctx.grants)
            fields["context"] = ctx.to_dict()
        self.dirty.clear()
        return fields

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
                end_programs()
                os._exit(0)
            raise RuntimeError(f"unexpected {frame.kind!r} frame while awaiting enquiry {eid}")

    def fork_fields(self) -> dict[str, Any]:
        """The live scope and context, for a desk verb that forks a child agent."""
        from exarch_actors.runtime.ral.codec import encode_value

        blobs: dict[str, bytes] = {}
        for name, value in self.session.bindings().items():
            try:
                blobs[name] = encode_value(value)
            except Exception:  # each passed encode_binding at its let; a codec change may not
                continue
        return {"bindings": blobs, "context": self.session.context.to_dict()}


def encode_binding(name: str, value: Any, max_bytes: int) -> bytes:
    """The encoding a binding is kept as, or a :class:`RalError` refusing ``let NAME``.

    Refused: an encoding over ``max_bytes`` (``--max-binding-bytes``; a string or bytes value
    already longer is refused before it is copied), a value the codec cannot encode (a
    structure nested more than 1024 levels deep; builtins encode by name), and running out of
    memory while encoding.
    """
    from exarch_actors.runtime.ral.codec import encode_value
    from exarch_actors.runtime.ral.errors import RalError
    from exarch_actors.runtime.shell.limits import format_size

    def over() -> str:  # built only for a refusal
        return (
            f"over the {format_size(max_bytes)} binding limit (--max-binding-bytes); bind a "
            "file path rather than the content"
        )

    if type(value) in (str, bytes) and len(value) > max_bytes:
        raise RalError(f"let {name}: refused, the value holds {len(value)} bytes, {over()}")
    try:
        blob = encode_value(value)
    except MemoryError:
        raise RalError(f"let {name}: refused, out of memory encoding the value") from None
    except RecursionError:
        raise RalError(f"let {name}: refused, the value is nested too deeply to keep") from None
    except Exception as e:  # CodecError and anything else: never bind what cannot be kept
        raise RalError(f"let {name}: refused, the value cannot be kept ({e})") from None
    if len(blob) > max_bytes:
        raise RalError(f"let {name}: refused, the value encodes to {len(blob)} bytes, {over()}")
    return blob


class _EnquiryDesk:
    """The host's Desk: every advertised verb is answered by the control side."""

    def __init__(self, core: HostCore) -> None:
        self._core = core

    def verbs(self) -> frozenset[str]:
        return self._core.verbs

    def call(self, verb: str, args: list[Any]) -> Any:
        from exarch_actors.runtime.ral.codec import decode_value, encode_value
        from exarch_actors.runtime.ral.errors import DeskRefusal

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
        from exarch_actors.runtime.ral.codec import encode_value
        from exarch_actors.runtime.ral.errors import RalError
        from exarch_actors.runtime.ral.values import WorkerHandle

        answer = self._core.enquire("spawn", closure=encode_value(closure), context=ctx.to_dict())
        if answer.get("error"):
            raise RalError(str(answer["error"]))
        wid = str(answer["worker"])
        self._core.running.add(wid)
        return WorkerHandle(wid)

    def await_(self, handle: Any, scope: Any) -> Any:
        from exarch_actors.runtime.ral.codec import decode_value
        from exarch_actors.runtime.ral.errors import RalError

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

    def settled(self, handle: Any) -> bool:
        from exarch_actors.runtime.ral.errors import RalError

        answer = self._core.enquire("settled", worker=handle.id)
        if answer.get("error"):
            raise RalError(str(answer["error"]))
        return bool(answer["value"])

    def cancel(self, handle: Any) -> None:
        from exarch_actors.runtime.ral.errors import RalError

        answer = self._core.enquire("cancel", worker=handle.id)
        if answer.get("error"):
            raise RalError(str(answer["error"]))
