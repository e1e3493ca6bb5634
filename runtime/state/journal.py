"""The spawn journal ``spawn-journal.jsonl`` and the settlement state folded from it.

Invariants:
- Every record has a per-run ``seq`` strictly greater than every earlier one, a node ``id``, a
  ``kind`` from :data:`KINDS` and an ISO ``at``. A reused seq is refused (:class:`DuplicateSeq`).
- A node is *open* from ``spawned`` until exactly one terminal record: a ``settled`` whose
  ``retainedExecution`` is absent, ``released`` or ``release-unconfirmed``, or a ``cancelled``.
  A ``settled`` with ``retainedExecution: pending`` keeps the slot open; ``reconciled`` is the
  charged floor of an open slot and is superseded by the terminal record.
- Admission phases go intent → environment → dispatched, each once, in order.
- A slot closes ``released`` only behind a destroyed receipt for the node's own environment, and
  ``release-unconfirmed`` only behind a ``teardown-unconfirmed`` naming what a sweeper deletes; so
  a replayed journal cannot claim a cleanup it never recorded.
- :func:`fold_settlement` is pure; :class:`SpawnJournal` validates a record against the state
  *before* the append (acknowledged under the session's durability policy) and folds it after,
  so the file never holds a record the fold would refuse.
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.state.durable import Damage, Shape, now_iso, read_jsonl, write_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir

KINDS = (
    "spawned",
    "execution-admitted",
    "execution-result",
    "reconciled",
    "environment-teardown",
    "teardown-unconfirmed",
    "settled",
    "cancelled",
)
PHASES = ("intent", "environment", "dispatched")
STATUSES = ("done", "down")
RETAINED = ("pending", "released", "release-unconfirmed")


JOURNAL_SHAPE = Shape(
    {
        "spawned": {"parent?": (str, None)},
        "execution-admitted": {
            "pid?": (int, None),
            "scratch?": (str, None),
            "pidStartedAt?": (int, float, None),
        },
        "execution-result": {
            "outcome?": (str, None),
            "reply?": (str, None),
            "replyValue?": (str, None),
        },
        "reconciled": {"spend": (dict,)},
        "environment-teardown": {"pid?": (int, None), "scratch?": (str, None)},
        "teardown-unconfirmed": {"pid?": (int, None), "scratch?": (str, None)},
        "settled": {"spend?": (dict, None), "reason?": (str, None)},
        "cancelled": {"spend?": (dict, None)},
    }
)
"""Field types the resumer and the sweep rely on beyond what :func:`_check` proves (a record
breaking them is :class:`MalformedRecord`, refused like any other)."""

_NULL_MEANS_UNKNOWN = frozenset({"pid", "scratch", "environmentId", "turn", "snapshot"})
"""Fields written even when ``None``: a sweeper reading ``teardown-unconfirmed`` must see that
the pid is unknown, not wonder whether it was forgotten. Other ``None`` fields are omitted
(``retainedExecution`` appears only when retained)."""


class JournalError(ExarchError):
    """A record the settlement state refuses; ``record`` is kept so nothing is lost."""

    line: int | None = None
    """The journal line of ``record``, when it was read from a file (set by :func:`replay`)."""

    def __init__(self, message: str, record: dict[str, Any] | None = None) -> None:
        self.record = record
        where = f" (seq {record.get('seq')}, id {record.get('id')!r})" if record else ""
        super().__init__(f"{message}{where}")


class SeqRefused(JournalError):
    """A seq that is not greater than the last one."""


class DuplicateSeq(SeqRefused):
    """A seq already used in this run."""


class MalformedRecord(JournalError):
    """Missing or mistyped fields, or an unknown kind."""


class UnknownNode(JournalError):
    """A record about a node the journal never saw spawned."""


class PhaseOrderRefused(JournalError):
    """An admission phase out of the order intent → environment → dispatched."""


class AlreadyTerminal(JournalError):
    """A second terminal record, or any settlement record after the terminal one."""


class StaleReceipt(AlreadyTerminal):
    """A teardown receipt after the node's slot closed: it cannot have informed the closure."""


class MismatchedEnvironment(JournalError):
    """A receipt naming an environment other than the one the node was admitted with."""


class InconsistentRecord(JournalError):
    """A record the node's history does not back (e.g. ``released`` with no destroyed receipt)."""


@dataclass
class NodeState:
    id: str
    spawned: dict[str, Any]
    phases: list[str] = field(default_factory=list)
    environment: dict[str, Any] | None = None  # the execution-admitted environment record
    results: list[dict[str, Any]] = field(default_factory=list)
    floor: dict[str, Any] | None = None  # latest reconciled record
    receipts: list[dict[str, Any]] = field(default_factory=list)
    unconfirmed: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None  # settled with retainedExecution pending
    terminal: dict[str, Any] | None = None

    @property
    def open(self) -> bool:
        return self.terminal is None

    @property
    def environment_id(self) -> str | None:
        return self.environment.get("environmentId") if self.environment else None

    def since_pending(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seq = self.pending["seq"] if self.pending else -1
        return [r for r in records if r["seq"] > seq]


@dataclass
class SettlementState:
    """Per-node settlement folded from journal records."""

    nodes: dict[str, NodeState] = field(default_factory=dict)
    last_seq: int = -1
    seqs: set[int] = field(default_factory=set)

    @property
    def never_settled(self) -> list[str]:
        return [n.id for n in self.nodes.values() if n.open]

    @property
    def retained_pending(self) -> list[str]:
        return [n.id for n in self.nodes.values() if n.open and n.pending is not None]

    def terminal_records(self) -> dict[str, dict[str, Any]]:
        return {n.id: n.terminal for n in self.nodes.values() if n.terminal is not None}

    def check(self, record: dict[str, Any]) -> None:
        """Raise the typed refusal ``record`` earns; never mutates."""
        _check(self, record)

    def apply(self, record: dict[str, Any]) -> None:
        self.check(record)
        self._fold(record)

    def copy(self) -> SettlementState:
        return copy.deepcopy(self)

    def _fold(self, r: dict[str, Any]) -> None:
        self.last_seq = r["seq"]
        self.seqs.add(r["seq"])
        kind, nid = r["kind"], r["id"]
        if kind == "spawned":
            self.nodes[nid] = NodeState(nid, r)
            return
        n = self.nodes[nid]
        if kind == "execution-admitted":
            n.phases.append(r["phase"])
            if r["phase"] == "environment":
                n.environment = r
        elif kind == "execution-result":
            n.results.append(r)
        elif kind == "reconciled":
            n.floor = r
        elif kind == "environment-teardown":
            n.receipts.append(r)
        elif kind == "teardown-unconfirmed":
            n.unconfirmed.append(r)
        elif kind == "settled" and r.get("retainedExecution") == "pending":
            n.pending = r
        else:  # terminal settled, or cancelled
            n.terminal = r


def _require(cond: bool, err: type[JournalError], msg: str, r: dict[str, Any]) -> None:
    if not cond:
        raise err(msg, r)


def _check(st: SettlementState, r: dict[str, Any]) -> None:
    _require(isinstance(r, dict), MalformedRecord, "a record must be an object", {})
    seq, kind, nid = r.get("seq"), r.get("kind"), r.get("id")
    _require(
        isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0,
        MalformedRecord,
        "seq must be a non-negative integer",
        r,
    )
    assert isinstance(seq, int)
    if seq in st.seqs:
        raise DuplicateSeq(f"seq {seq} is already used in this run", r)
    _require(seq > st.last_seq, SeqRefused, f"seq {seq} is not after the last seq {st.last_seq}", r)
    _require(kind in KINDS, MalformedRecord, f"unknown record kind {kind!r}", r)
    _require(
        isinstance(nid, str) and bool(nid), MalformedRecord, "id must be a non-empty string", r
    )
    assert isinstance(nid, str)
    problem = JOURNAL_SHAPE.problem(r)
    if problem is not None:
        raise MalformedRecord(problem, r)
    if kind == "spawned":
        _require(nid not in st.nodes, InconsistentRecord, f"node {nid!r} is already spawned", r)
        return
    n = st.nodes.get(nid)
    if n is None:
        raise UnknownNode(f"{kind} for node {nid!r}, which was never spawned", r)
    if n.terminal is not None:
        stale = kind in ("environment-teardown", "teardown-unconfirmed")
        err = StaleReceipt if stale else AlreadyTerminal
        seq_t = n.terminal["seq"]
        raise err(f"{kind} after node {nid!r} reached its terminal record (seq {seq_t})", r)
    if kind == "execution-admitted":
        phase = r.get("phase")
        _require(phase in PHASES, MalformedRecord, f"unknown phase {phase!r}", r)
        expected = PHASES[len(n.phases)] if len(n.phases) < len(PHASES) else None
        _require(
            phase == expected,
            PhaseOrderRefused,
            f"phase {phase!r} refused: phases so far {n.phases}, next must be {expected!r}",
            r,
        )
        if phase == "environment":
            _require(
                isinstance(r.get("environmentId"), str) and bool(r.get("environmentId")),
                MalformedRecord,
                "the environment phase must name environmentId",
                r,
            )
    elif kind == "execution-result":
        _require(
            "dispatched" in n.phases,
            PhaseOrderRefused,
            "execution-result before the dispatched phase",
            r,
        )
    elif kind in ("environment-teardown", "teardown-unconfirmed"):
        _require(
            n.environment is not None,
            InconsistentRecord,
            f"{kind} for a node that was never admitted an environment",
            r,
        )
        _require(
            r.get("environmentId") == n.environment_id,
            MismatchedEnvironment,
            f"{kind} names environment {r.get('environmentId')!r}, "
            f"the node was admitted with {n.environment_id!r}",
            r,
        )
        if kind == "environment-teardown":
            _require(
                isinstance(r.get("destroyed"), bool),
                MalformedRecord,
                "environment-teardown needs a boolean destroyed",
                r,
            )
            _require(
                isinstance(r.get("detail"), str),
                MalformedRecord,
                "environment-teardown needs a detail",
                r,
            )
    elif kind == "settled":
        _check_settled(n, r)
    elif kind == "cancelled":
        _require(
            n.pending is None,
            InconsistentRecord,
            "a retained-pending slot closes through the release sweep, not cancelled",
            r,
        )


def _check_settled(n: NodeState, r: dict[str, Any]) -> None:
    status, retained = r.get("status"), r.get("retainedExecution")
    _require(status in STATUSES, MalformedRecord, f"settled status {status!r} not in {STATUSES}", r)
    _require(
        retained is None or retained in RETAINED,
        MalformedRecord,
        f"retainedExecution {retained!r} not in {RETAINED}",
        r,
    )
    if retained == "pending":
        _require(n.pending is None, InconsistentRecord, "the slot is already retained-pending", r)
        _require(
            n.environment is not None,
            InconsistentRecord,
            "nothing is retained without an admitted environment",
            r,
        )
        _require(
            isinstance(r.get("retainedPendingCause"), str),
            MalformedRecord,
            "a pending settlement needs retainedPendingCause",
            r,
        )
        return
    if n.pending is None:
        _require(
            retained is None,
            InconsistentRecord,
            f"retainedExecution {retained!r} without a prior pending settlement",
            r,
        )
        return
    _require(
        retained is not None,
        InconsistentRecord,
        "a retained-pending slot closes only as released or release-unconfirmed",
        r,
    )
    _require(
        status == n.pending.get("status"),
        InconsistentRecord,
        f"terminal status {status!r} differs from the pending {n.pending.get('status')!r}",
        r,
    )
    receipts = n.since_pending(n.receipts)
    if retained == "released":
        _require(
            bool(receipts) and receipts[-1]["destroyed"] is True,
            InconsistentRecord,
            "released needs a destroyed environment-teardown receipt after pending",
            r,
        )
        _require(
            not n.since_pending(n.unconfirmed),
            InconsistentRecord,
            "released after a teardown-unconfirmed record",
            r,
        )
    else:
        _require(
            bool(n.since_pending(n.unconfirmed)),
            InconsistentRecord,
            "release-unconfirmed needs a teardown-unconfirmed record naming what to delete",
            r,
        )


def fold_settlement(records: list[dict[str, Any]]) -> SettlementState:
    """The settlement state of ``records``; raises the first typed refusal."""
    st = SettlementState()
    for r in records:
        st.apply(r)
    return st


@dataclass
class Replay:
    state: SettlementState
    records: list[dict[str, Any]]
    damage: list[Damage]
    refused: list[JournalError] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # the file line of each kept record
    name: str = "journal"  # the file's name, as problems name it

    @property
    def torn(self) -> bool:
        return any(d.torn_tail for d in self.damage)

    def problems(self) -> list[str]:
        """What no crash leaves behind, each as ``<journal file>:LINE: what``: a damaged
        line other than a torn last one, a record the fold refused, a seq gap (the writer
        numbers records 0, 1, 2, ...; a gap is a record lost from the middle). A journal with
        any of these cannot be replayed honestly: the state after it is a guess."""
        return [d.where(self.name) for d in self.damage if not d.torn_tail] + (
            self.inconsistencies()
        )

    def inconsistencies(self) -> list[str]:
        """The readable records' problems: refused by the fold, or after a seq gap."""
        out = [f"{self.name}:{e.line}: refused {type(e).__name__}: {e}" for e in self.refused]
        expected = 0
        for r, line in zip(self.records, self.lines):
            if r["seq"] != expected:
                out.append(f"{self.name}:{line}: seq {r['seq']} where {expected} was due")
            expected = r["seq"] + 1
        return out


def replay(path: str | os.PathLike[str], *, strict: bool = True) -> Replay:
    """Rebuild settlement from a journal file. Unreadable lines are reported in ``damage``; a
    record the fold refuses raises (``strict``) or is reported in ``refused`` and skipped;
    either way the refusal carries its ``line``."""
    read = read_jsonl(path)
    st = SettlementState()
    kept: list[dict[str, Any]] = []
    lines: list[int] = []
    refused: list[JournalError] = []
    for r, line in zip(read.records, read.lines):
        try:
            st.apply(r)
        except JournalError as e:
            e.line = line
            if strict:
                raise
            refused.append(e)
            continue
        kept.append(r)
        lines.append(line)
    return Replay(st, kept, read.damage, refused, lines, Path(path).name)


class SpawnJournal:
    """The writer: assigns seqs, validates, appends (acknowledged under the session's
    durability policy), folds. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str], state: SettlementState | None = None) -> None:
        self.path = Path(path)
        self.state = state or SettlementState()
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, strict: bool = True
    ) -> tuple[SpawnJournal, Replay]:
        """Resume a journal: replay it. A torn tail is left for the first append, which sets it
        aside and starts on a fresh line (:func:`runtime.state.durable.append_jsonl`)."""
        p = Path(path)
        rep = replay(p, strict=strict)
        return cls(p, rep.state), rep

    @classmethod
    def in_session(cls, session: SessionDir) -> tuple[SpawnJournal, Replay]:
        """The journal of ``session``, replayed (:meth:`open`)."""
        return cls.open(session.journal)

    def append(self, kind: str, node_id: str, **fields: Any) -> dict[str, Any]:
        """Validate, write and fold one record under the journal's lock (so seqs and file order
        agree); return it once it is acknowledged, waiting for that (under ``machine``, the
        group-commit fsync) after the lock is released, so no appender queues behind another's
        fsync. A later record can never be durable without this one: one file, one order."""
        with self._lock:
            record = {
                "kind": kind,
                "seq": self.state.last_seq + 1,
                "id": node_id,
                "at": now_iso(),
                **{k: v for k, v in fields.items() if v is not None or k in _NULL_MEANS_UNKNOWN},
            }
            self.state.check(record)
            written, acknowledged = write_jsonl(self.path, record)
            self.state._fold(written)
        acknowledged()
        return written

    # -- one helper per record kind

    def spawned(self, node_id: str, *, parent: str | None = None, **extra: Any) -> dict[str, Any]:
        return self.append("spawned", node_id, parent=parent, **extra)

    def admitted(self, node_id: str, phase: str, **extra: Any) -> dict[str, Any]:
        return self.append("execution-admitted", node_id, phase=phase, **extra)

    def execution_result(
        self,
        node_id: str,
        *,
        turn: int | None,
        events: list[dict[str, Any]],
        snapshot: str | None,
        **extra: Any,
    ) -> dict[str, Any]:
        return self.append(
            "execution-result", node_id, turn=turn, events=events, snapshot=snapshot, **extra
        )

    def reconciled(self, node_id: str, *, spend: dict[str, Any], reason: str) -> dict[str, Any]:
        return self.append("reconciled", node_id, spend=spend, reason=reason)

    def environment_teardown(
        self, node_id: str, receipt: dict[str, Any], **extra: Any
    ) -> dict[str, Any]:
        return self.append("environment-teardown", node_id, **receipt, **extra)

    def teardown_unconfirmed(
        self,
        node_id: str,
        *,
        environment_id: str,
        pid: int | None,
        scratch: str | None,
        **extra: Any,
    ) -> dict[str, Any]:
        return self.append(
            "teardown-unconfirmed",
            node_id,
            environmentId=environment_id,
            pid=pid,
            scratch=scratch,
            **extra,
        )

    def settled(
        self,
        node_id: str,
        status: str,
        *,
        retained: str | None = None,
        cause: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        return self.append(
            "settled",
            node_id,
            status=status,
            retainedExecution=retained,
            retainedPendingCause=cause,
            **extra,
        )

    def cancelled(self, node_id: str, *, ack: str, detail: str, **extra: Any) -> dict[str, Any]:
        return self.append("cancelled", node_id, ack=ack, detail=detail, **extra)
