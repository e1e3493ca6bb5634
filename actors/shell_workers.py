"""The shell actor's detached workers: ``spawn``/``await``/``cancel`` enquiries from the host, and
the retention sweep after every run.

Invariants:

- A worker id is ``w<epoch>-<n>``: unique per shell, since the epoch never rewinds.
- At most ``limits.max_workers`` run at once; one more ``spawn`` is refused with a ral error.
- Every worker's cancel scope is a child of the shell's :class:`actors.shell_types.EvalRoot`
  scope, so cancelling the root, closing the shell or ``clear`` reaches every worker with no edge
  of its own.
- The worker registry is swept right after each run (:meth:`ShellWorkers._sweep`); each reap is a
  ``Reap`` record in ``record.jsonl`` plus a Notice. A worker that settles wakes the pump
  (``_wake``) so an ``await`` in flight is answered without polling.
- Explicit destruction (close, clear) outranks every lease: :meth:`ShellWorkers._cancel_workers`
  cancels and stops every registered worker and empties the registry.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Any

from actors.frames import Frame
from actors.process import ChildProcess
from actors.shell_types import EvalRoot, _Run
from actors.worker import WorkerLink, start_worker
from runtime.durable import append_jsonl
from runtime.events import Notice
from runtime.limits import ShellLimits
from runtime.worker_registry import UnknownWorker, WorkerRegistry


class ShellWorkers:
    """Mixin of :class:`actors.shell.ShellActor`: the worker half of the control side.

    It owns no state of its own; the attributes below are set by ``ShellActor.__init__``.
    """

    name: str
    record_path: Path
    eval_root: EvalRoot
    limits: ShellLimits
    _faults: bool
    _epoch: int
    _spawned_this_run: int
    _registry: WorkerRegistry
    _links: dict[str, WorkerLink]
    _worker_refs: dict[str, Any]
    _wake_w: socket.socket

    # -- enquiries from the host ---------------------------------------------------------------

    def _spawn(self, f: Frame) -> dict[str, Any]:
        self._sync_settled()
        cap = self.limits.max_workers
        if len(self._registry.running_ids()) >= cap:
            return {
                "error": f"spawn: refused, this shell already runs {cap} workers (the limit, "
                "--max-workers); await or cancel one first"
            }
        self._spawned_this_run += 1
        wid = f"w{self._epoch}-{self._spawned_this_run}"
        link, ref = start_worker(
            wid,
            f["closure"],
            dict(f["context"]),
            faults=self._faults,
            on_settle=self._wake,
            memory_bytes=self.limits.memory_bytes,
        )
        scope = self.eval_root.scope.child()
        scope.on_cancel(lambda: link.cancel(scope.reason or "cancelled"))
        self._links[wid] = link
        self._worker_refs[wid] = ref
        self._registry.register(wid, self._epoch, time.time())
        return {"worker": wid}

    def _await(self, host: ChildProcess, eid: int, wid: str, got: _Run) -> None:
        self._sync_settled()
        if self._registry.get(wid) is None:
            host.data.send("answer", id=eid, error=str(UnknownWorker(wid)))
            return
        self._registry.touch(wid, self._epoch)
        if wid not in self._links:
            self._registry.claim(wid)
            host.data.send(
                "answer",
                id=eid,
                error=f"worker {wid} was lost: its process ended with an earlier control process",
            )
            return
        got.awaits[eid] = wid
        self._answer_settled_awaits(host, got)

    def _answer_settled_awaits(self, host: ChildProcess, got: _Run) -> None:
        for eid, wid in list(got.awaits.items()):
            link = self._links.get(wid)
            if link is None or not link.done.is_set():
                continue
            del got.awaits[eid]
            self._sync_settled()
            with contextlib.suppress(UnknownWorker):
                self._registry.claim(wid)
            self._links.pop(wid, None)
            self._worker_refs.pop(wid, None)
            err = link.error_text()
            out = link.outcome
            io = {"stdout": out.stdout, "stderr": out.stderr} if out is not None else {}
            if err is not None or out is None or out.value is None:
                host.data.try_send(
                    "answer", id=eid, error=err or f"worker {wid} gave no value", **io
                )
            else:
                host.data.try_send("answer", id=eid, value=out.value, **io)

    def _cancel_worker(self, wid: str) -> dict[str, Any]:
        if self._registry.get(wid) is None:
            return {"error": str(UnknownWorker(wid))}
        self._registry.touch(wid, self._epoch)
        link = self._links.get(wid)
        if link is not None:
            link.cancel("cancelled by cancel")
        return {"ok": True}

    def _wake(self, _wid: str) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- workers -------------------------------------------------------------------------------

    def _sync_settled(self) -> None:
        for wid, link in self._links.items():
            if link.done.is_set() and self._registry.is_running(wid):
                self._registry.settle(wid)

    def _sweep(self, epoch: int) -> list[Notice]:
        """The retention sweep right after each run: Reap notices and records."""
        self._sync_settled()
        notices: list[Notice] = []
        for reap in self._registry.advance(epoch, time.time()):
            link = self._links.pop(reap.worker, None)
            self._worker_refs.pop(reap.worker, None)
            if link is not None and reap.reason != "retention":
                link.cancel(f"reaped: {reap.reason}")
            append_jsonl(
                self.record_path,
                {
                    "kind": "Reap",
                    "agent": self.name,
                    "worker": reap.worker,
                    "reason": reap.reason,
                    "epoch": reap.epoch,
                    "detail": reap.detail,
                },
            )
            notices.append(
                Notice(
                    self.name,
                    notice="Reap",
                    text=f"worker {reap.worker} reaped ({reap.reason}): {reap.detail}",
                    data={"worker": reap.worker, "reason": reap.reason, "epoch": reap.epoch},
                )
            )
        return notices

    def _cancel_workers(self, reason: str) -> None:
        """Explicit destruction outranks every lease: cancel and stop every registered worker."""
        for link in self._links.values():
            link.cancel(reason)
        for ref in self._worker_refs.values():
            with contextlib.suppress(Exception):  # already stopped: its link settled above
                ref.stop(block=True, timeout=10.0)
        self._links.clear()
        self._worker_refs.clear()
        self._registry.clear()
