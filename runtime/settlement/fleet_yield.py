"""Fleet yield: what a run's spawned children came to, read off the settlement state, and the
``result.json`` that carries it.

Invariants:
- ``spawned == done + down + cancelled + neverSettled``; ``releaseUnconfirmed`` and ``released``
  are subsets of ``done + down`` (slots closed by the release sweep).
- Spend is per node, from its terminal record, else from its ``reconciled`` floor (``source``
  says which). Unknown tokens stay ``null`` with ``tokensKnown: false``; they are never summed as
  zero, and the totals say how many nodes they leave out.
- Money (``cost``, ``runtime/settlement/cost.py``) covers every agent of the run, the trunk
included: a
  total only when every agent's cost is known, else ``usd: null`` with the known part beside it
  and the agents left out counted. Prices are dated (``pricesDate``).
- ``result.json`` is replaced atomically: a reader sees the old file or the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.state.durable import now_iso, read_json_document, write_json_document
from exarch_actors.runtime.state.journal import SettlementState
from exarch_actors.runtime.state.session_dir import SessionDir

OUTCOMES = ("replied", "quiesced", "capped", "cancelled", "failed", "budget")
"""``budget``: the fleet's spend reached ``--budget`` and the run was cancelled (exit 1)."""
NORMAL_ENDS = frozenset({"replied", "quiesced"})
"""The outcomes of an agent that ended normally: its node settles ``done`` and a run that ends
this way exits 0. Every other end (capped, cancelled, failed) is ``down`` / non-zero."""


def settlement_status(outcome: str | None) -> Literal["done", "down"]:
    """The ``settled`` status of a child that ended with ``outcome``."""
    return "done" if outcome in NORMAL_ENDS else "down"


class BadOutcome(ExarchError):
    def __init__(self, outcome: str) -> None:
        self.outcome = outcome
        super().__init__(f"outcome {outcome!r} is not one of {OUTCOMES}")


@dataclass(frozen=True)
class NodeSpend:
    tokens_in: int | None
    tokens_out: int | None
    tokens_known: bool
    wall_seconds: float | None
    source: str  # "terminal" | "floor" | "none"
    cache_write: int | None = None
    cache_read: int | None = None
    cost_usd: str | None = None
    """Dollars as a decimal string; ``None``: unknown (no usage, or no price), never zero."""

    def to_json(self) -> dict[str, Any]:
        return {
            "tokensIn": self.tokens_in,
            "tokensOut": self.tokens_out,
            "tokensKnown": self.tokens_known,
            "wallSeconds": self.wall_seconds,
            "source": self.source,
            "cacheWrite": self.cache_write,
            "cacheRead": self.cache_read,
            "costUsd": self.cost_usd,
        }


@dataclass(frozen=True)
class FleetCost:
    """Money across every agent of the run (``runtime/settlement/cost.py``'s figures per agent)."""

    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Agent name to :meth:`runtime.settlement.cost.SpendFigures.to_json`."""
    prices_date: str | None = None
    budget_usd: str | None = None
    budget_reached: bool = False

    def to_json(self) -> dict[str, Any]:
        known = [a for a in self.agents.values() if a.get("usd") is not None]
        known_sum = sum((Decimal(a["knownUsd"]) for a in self.agents.values()), Decimal(0))
        all_known = len(known) == len(self.agents)
        return {
            "currency": "USD",
            "usd": str(known_sum) if all_known else None,
            "knownUsd": str(known_sum),
            "knownAgents": len(known),
            "unknownAgents": len(self.agents) - len(known),
            "cacheWrite": sum(int(a.get("cacheWrite") or 0) for a in self.agents.values()),
            "cacheRead": sum(int(a.get("cacheRead") or 0) for a in self.agents.values()),
            "pricesDate": self.prices_date,
            "budgetUsd": self.budget_usd,
            "budgetReached": self.budget_reached,
            "agents": self.agents,
        }


@dataclass(frozen=True)
class FleetYield:
    spawned: int
    done: int
    down: int
    cancelled: int
    never_settled: int
    release_unconfirmed: int
    released: int
    never_settled_ids: tuple[str, ...] = ()
    spend: dict[str, NodeSpend] = field(default_factory=dict)
    cost: FleetCost | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    """Settled children by terminal reason (``replied``, ``failed``, ``cancelled``, ...)."""
    traffic: dict[str, Any] | None = None
    """The traffic governor's figures (``runtime/providers/governor.py``): requests, waits and
    their seconds, 429s seen, limits per lane; ``None`` for a run without network providers."""

    @property
    def failed_children(self) -> int:
        """Children that ended neither replied, quiesced, nor cancelled."""
        return sum(n for r, n in self.reasons.items() if r not in (*NORMAL_ENDS, "cancelled"))

    def to_json(self) -> dict[str, Any]:
        known = [s for s in self.spend.values() if s.tokens_known]
        doc = {
            "spawned": self.spawned,
            "done": self.done,
            "down": self.down,
            "cancelled": self.cancelled,
            "neverSettled": self.never_settled,
            "releaseUnconfirmed": self.release_unconfirmed,
            "released": self.released,
            "neverSettledIds": list(self.never_settled_ids),
            "tokens": {
                "in": sum(s.tokens_in or 0 for s in known),
                "out": sum(s.tokens_out or 0 for s in known),
                "cacheWrite": sum(s.cache_write or 0 for s in known),
                "cacheRead": sum(s.cache_read or 0 for s in known),
                "knownNodes": len(known),
                "unknownNodes": len(self.spend) - len(known),
            },
            "spend": {k: v.to_json() for k, v in self.spend.items()},
        }
        doc["byReason"] = dict(sorted(self.reasons.items()))
        if self.cost is not None:
            doc["cost"] = self.cost.to_json()
        if self.traffic is not None:
            doc["traffic"] = self.traffic
        return doc


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _spend(raw: Any, source: str) -> NodeSpend:
    if not isinstance(raw, dict):
        return NodeSpend(None, None, False, None, "none")
    tin, tout = _int(raw.get("tokensIn")), _int(raw.get("tokensOut"))
    known = bool(raw.get("tokensKnown", tin is not None and tout is not None))
    known = known and tin is not None and tout is not None
    wall = raw.get("wallSeconds")
    cost = raw.get("costUsd")
    return NodeSpend(
        tin,
        tout,
        known,
        wall if isinstance(wall, int | float) else None,
        source,
        _int(raw.get("cacheWrite")),
        _int(raw.get("cacheRead")),
        cost if isinstance(cost, str) else None,
    )


def fleet_yield(
    state: SettlementState,
    cost: FleetCost | None = None,
    traffic: dict[str, Any] | None = None,
) -> FleetYield:
    done = down = cancelled = unconfirmed = released = 0
    spend: dict[str, NodeSpend] = {}
    reasons: dict[str, int] = {}
    for n in state.nodes.values():
        t = n.terminal
        if t is not None:
            reason = str(t.get("reason") or t["kind"])
            reasons[reason] = reasons.get(reason, 0) + 1
            if t["kind"] == "cancelled":
                cancelled += 1
            elif t["status"] == "done":
                done += 1
            else:
                down += 1
            unconfirmed += t.get("retainedExecution") == "release-unconfirmed"
            released += t.get("retainedExecution") == "released"
        if t is not None and isinstance(t.get("spend"), dict):
            spend[n.id] = _spend(t["spend"], "terminal")
        elif n.floor is not None:
            spend[n.id] = _spend(n.floor.get("spend"), "floor")
        else:
            spend[n.id] = _spend(None, "none")
    open_ids = tuple(state.never_settled)
    return FleetYield(
        len(state.nodes),
        done,
        down,
        cancelled,
        len(open_ids),
        unconfirmed,
        released,
        open_ids,
        spend,
        cost,
        reasons,
        traffic,
    )


def write_result(
    session: SessionDir,
    outcome: str,
    reply: str | None,
    fleet_yield: FleetYield,
    **extra: Any,
) -> Path:
    """Write ``result.json`` atomically; returns its path."""
    if outcome not in OUTCOMES:
        raise BadOutcome(outcome)
    doc = {
        "outcome": outcome,
        "reply": reply,
        "fleetYield": fleet_yield.to_json(),
        "at": now_iso(),
        **extra,
    }
    path = session.result
    write_json_document(path, doc)
    return path


def read_result(session: SessionDir) -> tuple[dict[str, Any] | None, str | None]:
    """``result.json`` of a session: ``(doc, None)`` when it reads as one :func:`write_result`
    wrote, ``(None, None)`` when there is none (the run did not finish), ``(None, problem)`` when
    it exists but is corrupt (it is written atomically, so no crash leaves it so: disk damage or
    a hand edit). ``check`` and ``resume`` both decide with this, so they agree."""
    path = session.result
    try:
        doc = read_json_document(path)[0]
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        return None, f"unreadable ({e})"
    if not isinstance(doc, dict):
        return None, f"not a JSON object ({type(doc).__name__})"
    if doc.get("outcome") not in OUTCOMES:
        return None, f"outcome {doc.get('outcome')!r} is not one of {OUTCOMES}"
    if not isinstance(doc.get("fleetYield"), dict):
        return None, "fleetYield is not an object"
    return doc, None
