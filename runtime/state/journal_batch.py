"""One node's settlement records, checked as they are made and appended in one write.

A child's settlement makes three journal records in a row (``execution-result``, its
teardown receipt, the terminal ``settled`` or ``cancelled``). Appended one by one, each took
the journal's lock, a ``stat``, a ``flock``, a ``write`` and an unlock (and under ``machine`` a
group-commit wait): ~0.3 ms of the control process's CPU per child of a 100-agent cascade,
a third of its settlement (yappi, docs/benchmarks.md). A :class:`JournalBatch` is a
:class:`SpawnJournal` over a private copy of the one node's state: each record is checked
against that copy when it is made (so a refusal reaches the caller at the same point as an
append's, and a refused receipt still turns into ``teardown-unconfirmed``), and
:meth:`JournalBatch.commit` appends them all with consecutive seqs in one ``write(2)``.

Invariants:
- What the journal holds is what appending the same records one by one would have left:
  the same records, in the order they were made, with consecutive seqs after every record
  appended before the commit; the journal's state is folded only after the write.
- A batch covers one node, and only records about it (no ``spawned``).
- If the node's records changed between the batch's start and its commit (another writer),
  each record is appended on its own, checked against the journal's state, as an append is.
- Records made before an exception are still appended (:meth:`JournalBatch.__exit__`), as
  they would have been one by one.
"""

from __future__ import annotations

import copy
from types import TracebackType
from typing import Any

from runtime.state.durable import now_iso, write_jsonl_lines
from runtime.state.journal import NodeState, SettlementState, SpawnJournal


def _fingerprint(n: NodeState) -> tuple[Any, ...]:
    """What a record about ``n`` can change (each fold appends to a list or sets a field)."""
    return (
        len(n.phases),
        len(n.results),
        len(n.receipts),
        len(n.unconfirmed),
        id(n.environment),
        id(n.floor),
        id(n.pending),
        id(n.terminal),
    )


def _copy(n: NodeState) -> NodeState:
    """``n`` with its own lists (a fold appends to them; its records are never mutated)."""
    c = copy.copy(n)  # not dataclasses.replace, which walks the fields per call
    c.phases, c.results = list(n.phases), list(n.results)
    c.receipts, c.unconfirmed = list(n.receipts), list(n.unconfirmed)
    return c


class JournalBatch(SpawnJournal):
    """Records about one node, written together on :meth:`commit` (see the module docstring).
    Use as a context manager: the block's records are committed at its end."""

    def __init__(self, journal: SpawnJournal, node_id: str) -> None:
        with journal._lock:
            node = journal.state.nodes[node_id]
            self._seen = _fingerprint(node)
            trial = SettlementState({node_id: _copy(node)}, journal.state.last_seq)
        # not SpawnJournal.__init__: the journal's own Path, no new one per batch
        self.path, self.state, self._lock = journal.path, trial, journal._lock
        self._journal = journal
        self._node_id = node_id
        self._records: list[dict[str, Any]] = []

    def append(self, kind: str, node_id: str, **fields: Any) -> dict[str, Any]:
        """Check ``kind`` against the node's state with the batch's earlier records folded;
        keep it for :meth:`commit`. Its ``seq`` and ``at`` are given at the commit."""
        if kind == "spawned" or node_id != self._node_id:
            raise ValueError(f"a batch for {self._node_id!r} holds only its settlement records")
        record = self._record(kind, node_id, fields)
        self.state.apply(record)
        self._records.append(record)
        return record

    def commit(self) -> list[dict[str, Any]]:
        """Append every record made so far, in one write; return them once acknowledged."""
        records, self._records = self._records, []
        if not records:
            return []
        journal = self._journal
        with journal._lock:
            state = journal.state
            node = state.nodes[self._node_id]
            if _fingerprint(node) == self._seen:
                at = now_iso()
                for i, record in enumerate(records, start=state.last_seq + 1):
                    record["seq"], record["at"] = i, at
                acknowledged = write_jsonl_lines(journal.path, records)
                for record in records:
                    state._fold(record)
                self._seen = _fingerprint(node)
                self.state.last_seq = state.last_seq
            else:
                acknowledged = None
        if acknowledged is None:  # the node moved meanwhile: one checked append each
            for record in records:
                fields = {k: v for k, v in record.items() if k not in ("kind", "seq", "id", "at")}
                journal.append(record["kind"], record["id"], **fields)
            return records
        acknowledged()
        return records

    def __enter__(self) -> JournalBatch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.commit()
