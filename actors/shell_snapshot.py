"""The shell's snapshot keeper: its committed state, and the base + binding log that hold it.

:class:`SnapshotKeeper` is owned by one :class:`actors.shell.ShellActor` and used from its actor
thread only. It holds the state of the last clean tool-call boundary -- bindings (name ->
encoding), context, ledger state, worker registry state, epoch -- which is what a rollback
restores and a fork hands out, and keeps the files a resume reads:
``<session>/agents/<name>/snapshot.msgpack`` (the base, a whole :class:`MobileSnapshot`) and
``snapshot.msgpack.log`` (:mod:`runtime.state.binding_log`: one frame per checkpoint of what
changed).

Invariants:

- **A checkpoint costs what changed.** The host sends only the encodings of bindings written
  since the last boundary, the names removed, and the ledger's delta; the keeper folds them
  into its maps in place and appends one frame of exactly those. Nothing is re-joined, re-encoded
  or rewritten for the bindings that did not change. Measured (``benchmarks/
  checkpoint_per_call.py``): see docs/benchmarks.md.
- **Compaction** writes the whole state as a new base (temp, fsync, rename, fsync dir) and then
  a fresh log naming that base (temp, rename), when the log outgrows
  ``max(base bytes, COMPACT_FLOOR)``, at every boot (start, ``clear``, resume, fork) and after any
  refused write. A crash between the two renames leaves the new base with the old log, whose
  header names the old base: the reader ignores it (the new base folds it in). So a SIGKILL at
  any instant leaves base + log readable with every checkpoint that returned.
- **What a frame promises.** An append is one ``write(2)``: it survives the death of any process
  (the page cache does), which is all that a resume after a crashed control process and a
  rollback after a crashed host need -- and a rollback reads the keeper's memory, not the file.
  ``fsync=True`` also syncs each frame, for a policy that must survive a machine crash.
- **Cadence.** A call that moved only the ledger's clock appends nothing, for at most
  :data:`SNAPSHOT_FILE_EVERY` calls: a file whose stamps lag can only *lengthen* a lease after a
  resume (safe: a lease grows, never shrinks).
- **A refused write never fails the call**: the state in memory holds every committed binding,
  the next checkpoint compacts (retrying the write whole), and each failure is reported once as
  a ``SnapshotWriteFailed`` Notice; at close the write is retried with backoff before the
  failure is reported as final.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exarch_actors.actors.frames import Frame
from exarch_actors.runtime.events import Notice
from exarch_actors.runtime.shell.ledger import apply_delta
from exarch_actors.runtime.state.binding_log import BindingLogWriter, log_path
from exarch_actors.runtime.state.durable import atomic_write_bytes
from exarch_actors.runtime.state.snapshot import MobileSnapshot

SNAPSHOT_FILE_EVERY = 32
"""Calls a frame may be skipped when only the ledger's clock moved (see the module docstring)."""

COMPACT_FLOOR = 1 << 20
"""The log is compacted once it holds more than ``max(base bytes, COMPACT_FLOOR)``.

Relative to the base, so compaction is amortised: each byte of base rewritten is paid for by at
least one byte appended, and a resume reads at most about twice the state. Measured (loaded
2-core box): a ``let x = add 1 2`` frame is 84 bytes; compacting a 22 MB base (a 20 MB binding)
takes ~56 ms, once per ~270,000 such calls (~0.2 µs a call); the 1 MiB floor keeps a small
scope from compacting every few calls (a 6 KiB compaction, ~1.2 ms with its fsyncs, once per
~12,000 calls)."""

NotifySink = Callable[[tuple[Notice, ...]], None]


class SnapshotKeeper:
    """One shell's committed state and its durable files (see the module docstring)."""

    def __init__(
        self,
        agent: str,
        path: Path,
        *,
        notify: NotifySink,
        fsync: bool = False,
        compact_floor: int = COMPACT_FLOOR,
    ) -> None:
        self.agent = agent
        self.path = path
        self.compact_floor = compact_floor
        self._notify = notify
        self._log = BindingLogWriter(log_path(path), fsync=fsync)
        self.bindings: dict[str, bytes] = {}
        self.context: dict[str, Any] = {}
        self.ledger: dict[str, Any] = {}
        self.workers: dict[str, Any] = {}
        self.epoch = 0
        self.bytes_held = 0
        """Encoded bytes of every committed binding (the probe's figure), kept as it changes."""
        self._base_bytes = 0
        self._compact_due = True
        self._set: dict[str, bytes] = {}
        self._removed: set[str] = set()
        self._context_changed = False
        self._workers_changed = False
        self._ledger_whole = False
        self._ledger_touched: set[str] = set()
        self._pinned: list[str] = []
        self._logged_epoch = 0
        self._checkpointed = False
        """A checkpoint ran: the state is this shell's. Before that (a boot that failed) there
        is nothing to flush, and flushing the empty state would clobber a resumed snapshot."""
        self.compactions = 0

    # -- what the host reports ----------------------------------------------------------------

    def reset(self, bindings: Mapping[str, bytes], context: Mapping[str, Any]) -> None:
        """A fresh host was booted with ``bindings``/``context`` (start, clear, resume, fork): the
        next checkpoint writes them as a new base."""
        self.bindings = dict(bindings)
        self.bytes_held = sum(map(len, self.bindings.values()))
        self.context = dict(context)
        self._compact_due = True

    def apply(self, f: Frame | Mapping[str, Any] | None) -> None:
        """Fold one ``snapshot`` frame or its fields (a clean boundary's changes) into the
        committed state. Absent fields are empty (the host leaves them out)."""
        if f is None:
            return
        if type(f) is dict and len(f) == 2:  # epoch and ledger_delta: no binding, no context
            delta = f.get("ledger_delta")
            if delta is not None and len(delta) == 2:  # and only the clock and the pins moved
                apply_delta(self.ledger, delta)
                return
        bindings = self.bindings
        for name in f.get("removed") or ():
            old = bindings.pop(name, None)
            if old is not None:
                self.bytes_held -= len(old)
            self._set.pop(name, None)
            self._removed.add(name)
        for name, blob in (f.get("bindings") or {}).items():
            old = bindings.get(name)
            if old is not None:
                self.bytes_held -= len(old)
            bindings[name] = blob
            self.bytes_held += len(blob)
            self._set[name] = blob
            self._removed.discard(name)
        context = f.get("context")  # absent: unchanged
        if context is not None and context != self.context:
            self.context = dict(context)
            self._context_changed = True
        whole = f.get("ledger")
        if whole is not None:
            self.ledger = _own(whole)
            self._ledger_whole = True
            return
        delta = f.get("ledger_delta")
        if delta is None:
            return
        apply_delta(self.ledger, delta)
        if "terms" in delta:
            self._ledger_whole = True
        else:
            self._ledger_touched.update(delta.get("last_use") or ())
            self._ledger_touched.update(delta.get("gone") or ())

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self, epoch: int, workers: dict[str, Any]) -> None:
        """Make the committed state durable: one frame of what changed, or a compaction."""
        self._checkpointed = True
        self.epoch = epoch
        if workers is not self.workers and workers != self.workers:
            self.workers = workers
            self._workers_changed = True
        if self._compact_due or not self._log.is_open:
            self._compact()
            return
        pinned = self.ledger.get("pinned") or []
        material = (
            self._set
            or self._removed
            or self._context_changed
            or self._workers_changed
            or self._ledger_whole
            or self._ledger_touched
            or pinned != self._pinned
        )
        if not material and epoch - self._logged_epoch < SNAPSHOT_FILE_EVERY:
            return
        try:
            self._log.append(self._frame())
        except OSError as e:
            self._compact_due = True  # the retry rewrites everything, whatever landed
            self._failed(f"snapshot write failed: {e}; will retry")
            return
        self._logged(pinned)
        if self._log.size > max(self._base_bytes, self.compact_floor):
            self._compact()

    def flush(self) -> None:
        """At close: append what is pending; a write still refused is retried with backoff
        (about 1.5 s in all) before the failure is reported -- there is no later checkpoint."""
        if not self._checkpointed:
            return
        if not self._compact_due and self._log.is_open:
            try:
                self._log.append(self._frame())
                self._logged(self.ledger.get("pinned") or [])
            except OSError:
                self._compact_due = True
        delay = 0.05
        error: OSError | None = None
        for _ in range(6):
            if not self._compact_due:
                break
            error = self._write_base()
            if error is None:
                break
            time.sleep(delay)
            delay *= 2
        self._log.close()
        if self._compact_due:
            self._failed(f"final snapshot write failed: {error}")

    def _frame(self) -> dict[str, Any]:
        record: dict[str, Any] = {"epoch": self.epoch}
        if self._set:
            record["set"] = self._set
        if self._removed:
            record["removed"] = sorted(self._removed)
        if self._context_changed:
            record["context"] = self.context
        if self._workers_changed:
            record["workers"] = self.workers
        ledger = self.ledger
        if self._ledger_whole:
            record["ledger"] = ledger
        else:
            last_use, sizes = ledger.get("last_use") or {}, ledger.get("sizes") or {}
            touched = self._ledger_touched
            record["ledger_delta"] = {
                "clock": ledger.get("clock", 0),
                "pinned": ledger.get("pinned") or [],
                "last_use": {n: last_use[n] for n in touched if n in last_use},
                "sizes": {n: sizes[n] for n in touched if n in sizes},
                "gone": [n for n in touched if n not in last_use],
            }
        return record

    def _logged(self, pinned: list[str]) -> None:
        self._set = {}
        self._removed = set()
        self._context_changed = self._workers_changed = self._ledger_whole = False
        self._ledger_touched = set()
        self._pinned = list(pinned)
        self._logged_epoch = self.epoch

    def _compact(self) -> None:
        error = self._write_base()
        if error is not None:
            self._failed(f"snapshot write failed: {error}; will retry")

    def _write_base(self) -> OSError | None:
        """The whole state as a new base, then a fresh log naming it (see the module docstring).
        Returns the refusal, or None."""
        data, base_id = self.snapshot().encode_base()
        try:
            atomic_write_bytes(self.path, data)
            self._log.start(base_id)
        except OSError as e:
            self._log.close()
            self._compact_due = True
            return e
        self._base_bytes = len(data)
        self._compact_due = False
        if self.compactions == 0:
            self._sweep_litter()
        self.compactions += 1
        self._logged(self.ledger.get("pinned") or [])
        return None

    def _sweep_litter(self) -> None:
        """Temp files of a writer that died mid-compaction (a SIGKILL between its temp write and
        its rename). One shell writes these names, and this keeper's first compaction has just
        replaced both files, so any other process's temp here is a dead writer's litter."""
        mine = f".{os.getpid()}."
        stems = (f".{self.path.name}.", f".{log_path(self.path).name}.")
        try:  # names, not a glob: a glob compiled two patterns in every agent process
            with os.scandir(self.path.parent) as entries:
                names = [e.name for e in entries]
        except OSError:
            return
        for name in names:
            stem = next((x for x in stems if name.startswith(x)), None)
            if stem is None or not name.endswith(".tmp") or len(name) < len(stem) + 4:
                continue
            if mine not in name[len(self.path.name) + 1 :]:
                with contextlib.suppress(OSError):
                    os.unlink(self.path.parent / name)

    def _failed(self, text: str) -> None:
        self._notify(
            (
                Notice(
                    self.agent,
                    notice="SnapshotWriteFailed",
                    text=text,
                    data={"path": str(self.path), "epoch": self.epoch},
                ),
            )
        )

    # -- handing it out -------------------------------------------------------------------------

    def snapshot(self) -> MobileSnapshot:
        """The committed state as a MobileSnapshot (a copy: later checkpoints do not change it)."""
        return MobileSnapshot(
            agent=self.agent,
            epoch=self.epoch,
            bindings=dict(self.bindings),
            context=dict(self.context),
            ledger=_own(self.ledger),
            workers=dict(self.workers),
        )

    def fork(self) -> MobileSnapshot:
        """The committed scope + context for a child agent; its ledger seals all as baseline."""
        return MobileSnapshot(
            agent=self.agent,
            epoch=0,
            bindings=dict(self.bindings),
            context=dict(self.context),
            ledger={},
            workers={},
        )


def _own(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ledger state whose lease maps this keeper may change in place."""
    out = dict(state)
    for key in ("last_use", "sizes"):
        if isinstance(out.get(key), Mapping):
            out[key] = dict(out[key])
    return out
