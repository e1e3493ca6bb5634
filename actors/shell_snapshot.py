"""The shell actor's durable snapshot: what a rollback restores and a resume reads.

Invariants:

- Refreshed at every clean tool-call boundary (a ral error is clean). The host sends only the
  encodings of bindings written since the last boundary; the :class:`SnapshotBuilder` keeps every
  other binding's packed entry, so a checkpoint costs what changed plus one C-level join.
- The in-memory durable snapshot is refreshed at every boundary; the file
  (``<session_dir>/agents/<name>/snapshot.msgpack``, written atomically) whenever a binding, the
  context or the worker registry changed, and at least every :data:`SNAPSHOT_FILE_EVERY` calls
  otherwise (see :meth:`ShellSnapshots._checkpoint` for why a lagging file is safe).
- A refused write never fails the call: the file stays dirty, the next checkpoint retries, and
  each failure is reported once as a ``SnapshotWriteFailed`` Notice; at close the write is
  retried with backoff before the failure is reported.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.frames import Frame
from runtime.events import Notice
from runtime.snapshot import MobileSnapshot, SnapshotBuilder
from runtime.worker_retention import WorkerRegistry

SNAPSHOT_FILE_EVERY = 32
"""Calls between snapshot-file writes when only the ledger's clock moved (see _checkpoint)."""


class ShellSnapshots:
    """Mixin of :class:`actors.shell.ShellActor`: the durable-snapshot half of the control side.

    It owns no state of its own; the attributes below are set by ``ShellActor.__init__``.
    """

    name: str
    snapshot_path: Path
    _epoch: int
    _registry: WorkerRegistry
    _builder: SnapshotBuilder
    _context: dict[str, Any]
    _ledger_state: dict[str, Any]
    _durable: MobileSnapshot | None
    _file_dirty: bool
    _file_epoch: int
    _file_workers: dict[str, Any] | None

    if TYPE_CHECKING:

        def _deliver(self, notices: tuple[Notice, ...]) -> None: ...

    def _apply_snapshot(self, f: Frame | None) -> list[Notice]:
        if f is None:
            return []
        cache = self._builder.cache
        changed = dict(f.get("bindings") or {})
        removed = list(f.get("removed") or ())
        for name, blob in changed.items():
            cache.adopt(name, blob, blob)
        for name in removed:
            cache.drop(name)
        context = dict(f["context"])
        if changed or removed or context != self._context:
            self._file_dirty = True
        self._context = context
        self._ledger_state = dict(f["ledger"])
        return []

    def _flush_snapshot(self) -> None:
        """At close: a file left dirty by a refused write is retried with backoff (about 1.5 s
        in all) before the failure is reported; there is no later checkpoint to retry it."""
        if not self._file_dirty or self._durable is None:
            return
        delay, error = 0.05, None
        for _ in range(6):
            try:
                self._durable.write_atomic(self.snapshot_path)
                self._file_dirty = False
                return
            except OSError as e:
                error = e
                time.sleep(delay)
                delay *= 2
        failed = Notice(
            self.name,
            notice="SnapshotWriteFailed",
            text=f"final snapshot write failed: {error}",
            data={"path": str(self.snapshot_path)},
        )
        self._deliver((failed,))

    def _checkpoint(self) -> None:
        """Refresh the durable snapshot; write the file when anything a resume needs changed.

        The in-memory durable snapshot (what a rollback restores) is refreshed at every clean
        boundary. The file is rewritten when a binding, the context or the worker registry
        changed, and at least every :data:`SNAPSHOT_FILE_EVERY` calls otherwise: between those
        writes only the ledger's clock and stamps move, and a file whose stamps lag can only
        *lengthen* a lease after a resume (safe: a lease grows, never shrinks). Measured: the
        fsync'd write was ~490 of the ~680 µs of a trivial call.
        """
        workers = self._registry.to_state()
        snap = self._builder.checkpoint(
            epoch=self._epoch,
            context=self._context,
            ledger=self._ledger_state,
            workers=workers,
        )
        self._durable = snap
        due = self._epoch - self._file_epoch >= SNAPSHOT_FILE_EVERY
        if self._file_dirty or due or workers != self._file_workers:
            try:
                snap.write_atomic(self.snapshot_path)
            except OSError as e:
                # The session directory refused the write (full disk, a path turned into a
                # directory, permissions). The in-memory durable snapshot still holds every
                # committed binding, so the call stands; the file stays dirty and the next
                # checkpoint retries. Reported once per failed write, never silently.
                self._file_dirty = True
                self._deliver(
                    (
                        Notice(
                            self.name,
                            notice="SnapshotWriteFailed",
                            text=f"snapshot write failed: {e}; will retry",
                            data={"path": str(self.snapshot_path), "epoch": self._epoch},
                        ),
                    )
                )
                return
            self._file_dirty = False
            self._file_epoch = self._epoch
            self._file_workers = workers

    # -- handing it out -----------------------------------------------------------------------

    def fork_snapshot(self) -> MobileSnapshot:
        """The durable scope + context for a child agent; its ledger seals all as baseline."""
        durable = self._durable
        assert durable is not None
        return MobileSnapshot(
            agent=self.name,
            epoch=0,
            bindings=dict(durable.bindings),
            context=dict(durable.context),
            ledger={},
            workers={},
        )

    def durable_snapshot(self) -> MobileSnapshot | None:
        """The last durable snapshot (what a rollback would restore)."""
        return self._durable
