"""The per-shell worker registry: which detached workers are running or settled, and when policy
removes one (a ``Reap`` notice, the retention clock).

The registry retains each handle itself, so no session name is ever load-bearing for
rediscovering a worker. Its removals, each returned as a :class:`ReapNotice` with its reason:

- ``"retention"`` — a settled entry is stamped with the ral-call epoch of the sweep that first
  observes it settled, and expires unclaimed ``SETTLED_WORKER_RETENTION`` (256) calls later:
  stamped at ``s``, still present after the sweep of ``s + 255``, gone at ``s + 256``.
- ``"idle"`` — a running worker nobody has touched (spawned, awaited, or explicitly touched) for
  ``idle_calls`` ral calls. Default 256, the same drum and bound as every other layer of the
  decay ladder (binding leases, settled retention), so one number describes abandonment.
- ``"backstop"`` — a running worker older than ``backstop_secs`` of wall time since spawn,
  touched or not. Default 3600 s. Calls do not age a worker while the agent is parked, so the
  idle bound alone would let a runaway ``loop`` spin a core for a whole quiet weekend; an hour
  is far above any single tool call's own limits, and the bound is per registry (configurable,
  or None to disable).

A *claimed* result (an ``await`` that delivered the value or the error) removes the entry at once
(:meth:`WorkerRegistry.claim`): the value now lives in the caller's hands (typically a binding,
governed by its own lease), and retention exists only for results nobody collected. Claimed
entries therefore never produce a notice. A later ``await`` of the same handle finds no entry
and the shell reports it as claimed, reaped or never spawned.

The epoch sweep is :meth:`WorkerRegistry.advance`, called right after each run's evaluation
returns with the agent's ral-call epoch (incremented at the top of every run, failed runs
included). Wall time enters only through the ``now`` argument (``time.time()`` seconds, so it
survives a snapshot round trip across processes). Pure: no threads, no processes; the caller
cancels the worker behind each idle/backstop notice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from exarch_actors.runtime.constants import SETTLED_WORKER_RETENTION
from exarch_actors.runtime.errors import ExarchError

WORKER_IDLE_CALLS = 256
"""Default idle bound of a running worker, in ral calls since its last touch."""

WORKER_BACKSTOP_SECS = 3600.0
"""Default backstop bound of a running worker, in wall seconds since spawn."""

STATE_VERSION = 1

ReapReason = Literal["idle", "backstop", "retention"]
WorkerState = Literal["running", "settled"]


class WorkerRegistryError(ExarchError):
    """A worker-registry operation was refused."""


class UnknownWorker(WorkerRegistryError):
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        super().__init__(
            f"unknown worker {worker_id!r}: its result was already claimed, it was reaped, "
            "or it was never spawned by this shell"
        )


class WorkerStateInvalid(WorkerRegistryError):
    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"worker registry state invalid: {what}")


@dataclass(frozen=True)
class ReapNotice:
    """A worker removed by policy (never one an eliminator observed away)."""

    worker: str
    reason: ReapReason
    epoch: int
    detail: str


@dataclass(frozen=True)
class WorkerFigures:
    """Probe figures (read-only)."""

    running: int
    settled: int
    nearest_reap_calls: int | None
    """Calls until the soonest call-counted reap (retention or idle); None if nothing pending."""
    nearest_backstop_secs: float | None
    """Seconds until the soonest backstop reap of a running worker; None if none or disabled."""


@dataclass
class WorkerEntry:
    worker_id: str
    state: WorkerState
    spawned_epoch: int
    spawned_at: float
    last_touch: int
    settled_stamp: int | None = None
    """Epoch of the sweep that first observed the entry settled; None until then."""


class WorkerRegistry:
    """Running and settled worker entries of one shell, keyed by handle id."""

    def __init__(
        self,
        *,
        retention_calls: int = SETTLED_WORKER_RETENTION,
        idle_calls: int | None = WORKER_IDLE_CALLS,
        backstop_secs: float | None = WORKER_BACKSTOP_SECS,
    ) -> None:
        if retention_calls < 1:
            raise WorkerRegistryError(f"retention_calls must be >= 1, got {retention_calls}")
        if idle_calls is not None and idle_calls < 1:
            raise WorkerRegistryError(f"idle_calls must be >= 1 or None, got {idle_calls}")
        if backstop_secs is not None and backstop_secs <= 0:
            raise WorkerRegistryError(f"backstop_secs must be > 0 or None, got {backstop_secs}")
        self.retention_calls = retention_calls
        self.idle_calls = idle_calls
        self.backstop_secs = backstop_secs
        self._entries: dict[str, WorkerEntry] = {}

    # -- lifecycle events ------------------------------------------------------------------------

    def register(self, worker_id: str, epoch: int, now: float) -> WorkerEntry:
        """A worker was spawned during the run at ``epoch``, at wall time ``now``."""
        if worker_id in self._entries:
            raise WorkerRegistryError(f"worker {worker_id!r} is already registered")
        entry = WorkerEntry(worker_id, "running", epoch, now, epoch)
        self._entries[worker_id] = entry
        return entry

    def touch(self, worker_id: str, epoch: int) -> None:
        """The model used the worker (an ``await`` began, a ``cancel``): renews the idle bound."""
        entry = self._get(worker_id)
        entry.last_touch = max(entry.last_touch, epoch)

    def settle(self, worker_id: str) -> None:
        """The worker finished (value, error or cancellation). Stamped by the next sweep."""
        entry = self._entries.get(worker_id)
        if entry is not None:
            entry.state = "settled"

    def claim(self, worker_id: str) -> WorkerEntry:
        """An ``await`` delivered the result: the entry leaves the registry without a notice."""
        entry = self._get(worker_id)
        del self._entries[worker_id]
        return entry

    def forget(self, worker_id: str) -> None:
        """Drop an entry with no notice (e.g. the caller cancelled and discarded it)."""
        self._entries.pop(worker_id, None)

    def clear(self) -> list[str]:
        """Empty the registry (/clear, shell close); returns the running ids the caller cancels."""
        running = self.running_ids()
        self._entries.clear()
        return running

    # -- the epoch sweep -------------------------------------------------------------------------

    def advance(self, epoch: int, now: float) -> list[ReapNotice]:
        """Sweep after the run at ``epoch``: stamp first-observed settled entries, expire the
        unclaimed ones past retention, reap running workers past their idle or backstop bound.
        """
        notices: list[ReapNotice] = []
        for wid, entry in list(self._entries.items()):
            if entry.state == "settled":
                if entry.settled_stamp is None:
                    entry.settled_stamp = epoch
                if epoch - entry.settled_stamp >= self.retention_calls:
                    notices.append(
                        ReapNotice(
                            wid,
                            "retention",
                            epoch,
                            f"settled result unclaimed for {epoch - entry.settled_stamp} calls",
                        )
                    )
            elif self.backstop_secs is not None and now - entry.spawned_at >= self.backstop_secs:
                notices.append(
                    ReapNotice(
                        wid,
                        "backstop",
                        epoch,
                        f"running for {now - entry.spawned_at:.0f} s "
                        f"(backstop {self.backstop_secs:.0f} s)",
                    )
                )
            elif self.idle_calls is not None and epoch - entry.last_touch >= self.idle_calls:
                notices.append(
                    ReapNotice(
                        wid,
                        "idle",
                        epoch,
                        f"running untouched for {epoch - entry.last_touch} calls",
                    )
                )
        for notice in notices:
            del self._entries[notice.worker]
        return notices

    # -- probes ----------------------------------------------------------------------------------

    def get(self, worker_id: str) -> WorkerEntry | None:
        return self._entries.get(worker_id)

    def is_running(self, worker_id: str) -> bool:
        entry = self._entries.get(worker_id)
        return entry is not None and entry.state == "running"

    def running_ids(self) -> list[str]:
        return [w for w, e in self._entries.items() if e.state == "running"]

    def ids(self) -> list[str]:
        """Every entry's id, running or settled, in registration order."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def figures(self, epoch: int, now: float) -> WorkerFigures:
        running = settled = 0
        calls: int | None = None
        secs: float | None = None
        for entry in self._entries.values():
            left_calls: int | None = None
            if entry.state == "settled":
                settled += 1
                # An unstamped entry is stamped by the next sweep (epoch + 1).
                stamp = entry.settled_stamp if entry.settled_stamp is not None else epoch + 1
                left_calls = max(0, stamp + self.retention_calls - epoch)
            else:
                running += 1
                if self.idle_calls is not None:
                    left_calls = max(0, entry.last_touch + self.idle_calls - epoch)
                if self.backstop_secs is not None:
                    left_secs = max(0.0, entry.spawned_at + self.backstop_secs - now)
                    secs = left_secs if secs is None else min(secs, left_secs)
            if left_calls is not None:
                calls = left_calls if calls is None else min(calls, left_calls)
        return WorkerFigures(running, settled, calls, secs)

    # -- persistence -----------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "retention_calls": self.retention_calls,
            "idle_calls": self.idle_calls,
            "backstop_secs": self.backstop_secs,
            "entries": [
                [e.worker_id, e.state, e.spawned_epoch, e.spawned_at, e.last_touch, e.settled_stamp]
                for e in self._entries.values()
            ],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WorkerRegistry:
        if not isinstance(state, Mapping):
            raise WorkerStateInvalid(f"expected a map, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise WorkerStateInvalid(
                f"version {state.get('version')!r}, this build reads {STATE_VERSION}"
            )
        try:
            reg = cls(
                retention_calls=state["retention_calls"],
                idle_calls=state["idle_calls"],
                backstop_secs=state["backstop_secs"],
            )
            rows = state["entries"]
        except KeyError as e:
            raise WorkerStateInvalid(f"missing field {e.args[0]!r}") from None
        except (TypeError, WorkerRegistryError) as e:
            raise WorkerStateInvalid(str(e)) from None
        if not isinstance(rows, list | tuple):
            raise WorkerStateInvalid("'entries' is not a list")
        for row in rows:
            if not (isinstance(row, list | tuple) and len(row) == 6):
                raise WorkerStateInvalid(f"entry is not a 6-field row: {row!r}")
            wid, st, spawned_epoch, spawned_at, last_touch, stamp = row
            ok = (
                isinstance(wid, str)
                and st in ("running", "settled")
                and isinstance(spawned_epoch, int)
                and isinstance(spawned_at, int | float)
                and isinstance(last_touch, int)
                and (stamp is None or isinstance(stamp, int))
            )
            if not ok:
                raise WorkerStateInvalid(f"malformed entry {row!r}")
            reg._entries[wid] = WorkerEntry(
                wid, st, spawned_epoch, float(spawned_at), last_touch, stamp
            )
        return reg

    def _get(self, worker_id: str) -> WorkerEntry:
        entry = self._entries.get(worker_id)
        if entry is None:
            raise UnknownWorker(worker_id)
        return entry
