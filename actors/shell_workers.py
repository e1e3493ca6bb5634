"""The shell actor's detached workers: ``spawn``/``await``/``cancel`` enquiries from the host, and
the retention sweep after every run.

Invariants:

- A worker id is ``w<epoch>-<n>``: unique per shell, since the epoch never rewinds.
- At most ``limits.max_workers`` run at once; one more ``spawn`` is refused with a ral error.
- Every worker's cancel scope is a child of the shell's :class:`actors.eval_root.EvalRoot`
  scope, so cancelling the root, closing the shell or ``clear`` reaches every worker with no edge
  of its own.
- The worker registry is swept right after each run (:meth:`WorkerPool.sweep`); each reap is a
  ``Reap`` record in ``record.jsonl`` plus a Notice. A worker that settles wakes the pump
  (:meth:`WorkerPool.wake`) so an ``await`` in flight is answered without polling.
- Explicit destruction (close, clear) outranks every lease: :meth:`WorkerPool.cancel_all`
  cancels and stops every registered worker and empties the registry.
- Worker results wake their agent (:class:`WorkerSurfaces`, the rule in
  :mod:`runtime.shell.surfacing`): when the agent's turn ends (:meth:`WorkerPool.park`)
  its running workers are watched, and each completion is pushed into its inbox as a
  ``Surface`` through the sink the fleet installs (quota-checked, rejected never dropped,
  dropped by the generation guard after ``/clear``: the registry's ``deliver``). A worker the
  model cancelled or the sweep reaped is dismissed: reap notices stay in the transcript.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exarch_actors.actors.eval_root import EvalRoot
from exarch_actors.actors.frames import Frame
from exarch_actors.actors.process import ChildProcess
from exarch_actors.actors.worker_process import WorkerLink, lost_link, lost_text, start_worker
from exarch_actors.runtime.events import Notice
from exarch_actors.runtime.fleet.inbox import Surface
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.shell.surfacing import SurfaceRule, surface_text
from exarch_actors.runtime.shell.worker_retention import UnknownWorker, WorkerRegistry
from exarch_actors.runtime.state.durable import append_jsonl

log = logging.getLogger(__name__)

SurfaceSink = Callable[[str, Surface], None]
"""``sink(worker_id, surface)``: deliver one surfaced completion to the agent's inbox."""


class WorkerSurfaces:
    """The thread-safe face of :class:`runtime.shell.surfacing.SurfaceRule`.

    Shared by three threads: the shell actor (park, dismiss), worker watcher threads (a worker
    settled) and the agent's own thread (``waiting`` for its park verdict, ``unpark`` at a model
    turn). Decisions are taken under one lock; the sink is called outside it, so a slow or
    refusing inbox never holds up a settle. With no sink (a bare shell) nothing is surfaced.
    """

    def __init__(self, sink: SurfaceSink | None = None) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._rule = SurfaceRule()
        self._links: dict[str, WorkerLink] = {}
        self._closed = False
        self._in_flight = 0
        """Surfaces handed to the sink and not yet returned from it: the agent still waits for
        them. (An agent process's sink is a round trip to the control side and back into its
        inbox; without this count the agent saw no watched worker and no surface in its inbox
        in between, and quiesced as the result arrived.)"""

    @property
    def waiting(self) -> bool:
        """Watched workers are still running, or a surface is on its way into the inbox: the
        agent waits for their results."""
        with self._lock:
            return self._rule.waiting or self._in_flight > 0

    def unpark(self) -> None:
        with self._lock:
            self._rule.unpark()

    def pending(self, running: list[str], settled: list[str]) -> bool:
        with self._lock:
            return (
                self._sink is not None and not self._closed and self._rule.pending(running, settled)
            )

    def park(
        self, running: Mapping[str, WorkerLink], settled: Mapping[str, WorkerLink], stamp: int
    ) -> bool:
        """The turn ended: watch ``running``, surface ``settled`` now; True if anything is
        coming to the agent."""
        with self._lock:
            if self._sink is None or self._closed:
                return False
            parked = self._rule.park(running, settled, stamp)
            self._links = {w: running[w] for w in parked.watched}
        for wid in parked.now:
            self._surface(wid, settled[wid], stamp)
        return parked.waits

    def settled(self, wid: str) -> None:
        """A worker settled (its watcher thread): surface it if the rule says now."""
        with self._lock:
            if self._closed or not self._rule.settled(wid):
                self._links.pop(wid, None)
                return
            link = self._links.pop(wid)
            stamp = self._rule.stamp
            self._in_flight += 1  # under the same lock that stopped watching it
        try:
            self._surface(wid, link, stamp)
        finally:
            with self._lock:
                self._in_flight -= 1

    def dismiss(self, wid: str) -> None:
        with self._lock:
            self._rule.dismiss(wid)
            self._links.pop(wid, None)

    def reset(self) -> None:
        with self._lock:
            self._rule.reset()
            self._links.clear()

    def close(self) -> None:
        """The shell is closing: the agent is gone, nothing more is surfaced."""
        with self._lock:
            self._closed = True
            self._rule.reset()
            self._links.clear()

    def _surface(self, wid: str, link: WorkerLink, stamp: int) -> None:
        sink = self._sink
        assert sink is not None
        try:
            sink(wid, Surface((completion_text(link),), generation=stamp))
        except Exception:  # the sink records refusals itself; a bug must not kill a watcher
            log.exception("surfacing worker %s failed", wid)


def completion_text(link: WorkerLink) -> str:
    """A settled worker's completion as the model reads it (value or error, output)."""
    from exarch_actors.runtime.ral.codec import decode_value
    from exarch_actors.runtime.ral.values import render

    out = link.outcome
    error = link.error_text()
    value: str | None = None
    if error is None and out is not None and out.value is not None:
        try:
            value = render(decode_value(out.value))
        except Exception as e:  # a value this build cannot read back: say so, lose nothing
            error = f"worker {link.id} returned a value that cannot be read: {e}"
    elif error is None:
        error = f"worker {link.id} gave no value"
    return surface_text(
        link.id,
        value=value,
        error=error,
        stdout=out.stdout if out is not None else "",
        stderr=out.stderr if out is not None else "",
    )


class WorkerPool:
    """One shell's detached workers: owns the registry, the links and actor refs of live
    workers, the per-run spawn counter and the wake socket that ends the shell's pump wait.

    Used from the shell actor's thread only, except :meth:`wake` and the surfaces (thread-safe).
    """

    def __init__(
        self,
        *,
        agent: str,
        record_path: Path,
        eval_root: EvalRoot,
        limits: ShellLimits,
        faults: bool,
        surfaces: WorkerSurfaces,
        idle_calls: int | None,
        backstop_secs: float | None,
    ) -> None:
        self.agent = agent
        self.record_path = record_path
        self.eval_root = eval_root
        self.limits = limits
        self.faults = faults
        self.surfaces = surfaces
        self._bounds = (idle_calls, backstop_secs)
        self.registry = WorkerRegistry(idle_calls=idle_calls, backstop_secs=backstop_secs)
        self._links: dict[str, WorkerLink] = {}
        self._refs: dict[str, Any] = {}
        self._spawned_this_run = 0
        self._empty_state: tuple[WorkerRegistry, dict[str, Any]] | None = None
        self.wake_r, self._wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume a registry from a snapshot: its running workers ended with the process that
        ran their shell, so they are settled, with no link -- lost: an ``await`` says so, and
        the agent's first park surfaces it (:meth:`_settled_links`; an agent waiting for one
        would otherwise wait for nothing and quiesce: seen in random control kills of
        examples/memory.toml)."""
        self.registry = WorkerRegistry.from_state(state)
        for wid in self.registry.running_ids():
            self.registry.settle(wid)

    def begin_run(self) -> None:
        self._spawned_this_run = 0

    def running_ids(self) -> list[str]:
        return self.registry.running_ids()

    # -- enquiries from the host ---------------------------------------------------------------

    def spawn(self, f: Frame, epoch: int) -> dict[str, Any]:
        self.sync_settled()
        cap = self.limits.max_workers
        if len(self.registry.running_ids()) >= cap:
            return {
                "error": f"spawn: refused, this shell already runs {cap} workers (the limit, "
                "--max-workers); await or cancel one first"
            }
        self._spawned_this_run += 1
        wid = f"w{epoch}-{self._spawned_this_run}"
        link, ref = start_worker(
            wid,
            f["closure"],
            dict(f["context"]),
            faults=self.faults,
            on_settle=self._on_settle,
            memory_bytes=self.limits.memory_bytes,
        )
        scope = self.eval_root.scope.child()
        scope.on_cancel(lambda: link.cancel(scope.reason or "cancelled"))
        self._links[wid] = link
        self._refs[wid] = ref
        self.registry.register(wid, epoch, time.time())
        return {"worker": wid}

    def await_(
        self, host: ChildProcess, eid: int, wid: str, awaits: dict[int, str], epoch: int
    ) -> None:
        """An ``await`` enquiry: answered now if settled, else kept in ``awaits`` (the run's)."""
        self.sync_settled()
        if self.registry.get(wid) is None:
            host.data.send("answer", id=eid, error=str(UnknownWorker(wid)))
            return
        self.registry.touch(wid, epoch)
        if wid not in self._links:
            self.registry.claim(wid)
            host.data.send(
                "answer",
                id=eid,
                error=lost_text(wid),
            )
            return
        awaits[eid] = wid
        self.answer_settled_awaits(host, awaits)

    def answer_settled_awaits(self, host: ChildProcess, awaits: dict[int, str]) -> None:
        for eid, wid in list(awaits.items()):
            link = self._links.get(wid)
            if link is None or not link.done.is_set():
                continue
            del awaits[eid]
            self.sync_settled()
            with contextlib.suppress(UnknownWorker):
                self.registry.claim(wid)
            self._links.pop(wid, None)
            self._refs.pop(wid, None)
            err = link.error_text()
            out = link.outcome
            io = {"stdout": out.stdout, "stderr": out.stderr} if out is not None else {}
            if err is not None or out is None or out.value is None:
                host.data.try_send(
                    "answer", id=eid, error=err or f"worker {wid} gave no value", **io
                )
            else:
                host.data.try_send("answer", id=eid, value=out.value, **io)

    def settled(self, wid: str, epoch: int) -> dict[str, Any]:
        """A ``settled`` enquiry: whether the worker finished, claiming nothing. Like ``await``
        it is a use of the worker (renews its idle bound); a worker lost with an earlier control
        process will never run again, so it counts as settled."""
        self.sync_settled()
        if self.registry.get(wid) is None:
            return {"error": str(UnknownWorker(wid))}
        self.registry.touch(wid, epoch)
        link = self._links.get(wid)
        return {"value": link is None or link.done.is_set()}

    def cancel(self, wid: str, epoch: int) -> dict[str, Any]:
        if self.registry.get(wid) is None:
            return {"error": str(UnknownWorker(wid))}
        self.registry.touch(wid, epoch)
        self.surfaces.dismiss(wid)  # the model cancelled it: its end is no news to it
        link = self._links.get(wid)
        if link is not None:
            link.cancel("cancelled by cancel")
        return {"ok": True}

    def wake(self) -> None:
        """End the pump's wait (any thread): a worker settled, or a cancel must start its grace."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self.wake_r.recv(4096):
                pass

    def _on_settle(self, wid: str) -> None:
        """A worker settled (its watcher thread): wake a pending ``await``, and surface it to
        the agent if it is parked waiting for it."""
        self.wake()
        self.surfaces.settled(wid)

    # -- worker results that wake their agent --------------------------------------------------

    def _settled_links(self) -> tuple[dict[str, WorkerLink], dict[str, WorkerLink]]:
        """Running and settled-unclaimed workers with their outcome to tell. An entry with no
        link (one a restored snapshot said was running) is lost with its shell: that is its
        outcome (:func:`lost_link`), as ``await`` answers it."""
        self.sync_settled()
        running: dict[str, WorkerLink] = {}
        settled: dict[str, WorkerLink] = {}
        for wid, link in self._links.items():
            if self.registry.get(wid) is None:
                continue
            (settled if link.done.is_set() else running)[wid] = link
        for wid in self.registry.ids():
            if wid not in self._links:
                settled[wid] = lost_link(wid)
        return running, settled

    def pending(self) -> bool:
        """Whether :meth:`park` now would leave the agent a worker result to wait for."""
        running, settled = self._settled_links()
        return self.surfaces.pending(list(running), list(settled))

    def park(self, stamp: int) -> bool:
        """The agent's turn ended: watch its running workers and surface the settled results it
        never claimed; ``stamp`` is the generation the surfaces carry. True if any is coming."""
        running, settled = self._settled_links()
        return self.surfaces.park(running, settled, stamp)

    # -- the registry --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The registry's state for the snapshot; with no entry, the same dict each call (the
        keeper compares it with what it holds: a trivial call builds nothing)."""
        registry = self.registry
        if len(registry):
            return registry.to_state()
        empty = self._empty_state
        if empty is None or empty[0] is not registry:
            empty = self._empty_state = (registry, registry.to_state())
        return empty[1]

    def sync_settled(self) -> None:
        for wid, link in self._links.items():
            if link.done.is_set() and self.registry.is_running(wid):
                self.registry.settle(wid)

    def sweep(self, epoch: int) -> list[Notice]:
        """The retention sweep right after each run: Reap notices and records."""
        if not len(self.registry):
            return []
        self.sync_settled()
        notices: list[Notice] = []
        for reap in self.registry.advance(epoch, time.time()):
            link = self._links.pop(reap.worker, None)
            self._refs.pop(reap.worker, None)
            self.surfaces.dismiss(reap.worker)  # a reap stays transcript-only
            if link is not None and reap.reason != "retention":
                link.cancel(f"reaped: {reap.reason}")
            append_jsonl(
                self.record_path,
                {
                    "kind": "Reap",
                    "agent": self.agent,
                    "worker": reap.worker,
                    "reason": reap.reason,
                    "epoch": reap.epoch,
                    "detail": reap.detail,
                },
            )
            notices.append(
                Notice(
                    self.agent,
                    notice="Reap",
                    text=f"worker {reap.worker} reaped ({reap.reason}): {reap.detail}",
                    data={"worker": reap.worker, "reason": reap.reason, "epoch": reap.epoch},
                )
            )
        return notices

    def cancel_all(self, reason: str) -> None:
        """Explicit destruction outranks every lease: cancel and stop every registered worker."""
        for link in self._links.values():
            link.cancel(reason)
        for ref in self._refs.values():
            with contextlib.suppress(Exception):  # already stopped: its link settled above
                ref.stop(block=True, timeout=10.0)
        self._links.clear()
        self._refs.clear()
        self.registry.clear()
        # Every cancelled worker has settled (stop blocks until it has): completions surfaced
        # meanwhile carry the old generation, which the guard drops after /clear.
        self.surfaces.reset()

    def renew(self) -> None:
        """``clear``: after :meth:`cancel_all`, a fresh registry with the same bounds."""
        self.registry = WorkerRegistry(idle_calls=self._bounds[0], backstop_secs=self._bounds[1])

    def close(self) -> None:
        for sock in (self.wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
