"""The ``/resources`` fold: raw probe figures in, rows and a card out.

The agent gathers what its thread may legally read — the worker registry's and the binding
ledger's probe figures (read as data through the enquiry desk), inbox depth per source, the event
log's mirror length and history bytes, the log dir and scratch walked at invocation, and the idle
lease as two rows — and :func:`resource_rows` turns them into :class:`ResourceRow` values plus a
rendered plain-text card. The agent posts both in one ``Resources`` bus event; the frontend
appends rows for what it owns at render time.

Invariants: pure (no clock, no I/O, nothing renewed — enumeration is not observation); every
input figure that is present yields a row; a figure that could not be read (``None``) still
yields its row, shown as ``-``, so an absent probe is visible rather than silently missing. The
fold is never model-facing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.constants import COMPACT_THRESHOLD, INBOX_SOURCE_CAP, INBOX_TOTAL_CAP
from exarch_actors.runtime.fleet.diskwarn import human_bytes

Figures = Mapping[str, Any]


@dataclass(frozen=True)
class ResourceRow:
    """One probe row: a dotted name, the raw value (JSON-able), a human detail."""

    name: str
    value: int | float | str | None
    detail: str = ""


@dataclass(frozen=True)
class ResourceFigures:
    """Everything the agent's thread surveyed for one ``/resources`` invocation."""

    workers: Figures | Any | None = None
    """WorkerFigures or its dict: running, settled, nearest_reap_calls, nearest_backstop_secs."""
    ledger: Figures | Any | None = None
    """LedgerFigures or its dict: armed, live, baseline, pinned, nearest_expiry_calls,
    bytes_held."""
    inbox_depths: Mapping[str, int] = field(default_factory=dict)
    event_count: int = 0
    history_bytes: int = 0
    disk: Mapping[str, int | None] = field(default_factory=dict)
    """Walked sizes by label (``log dir``, ``scratch``); None when the walk failed."""
    disk_ceiling: int | None = None
    lease_nearest_reap_secs: float | None = None
    """Seconds until the soonest idle-lease reap among this agent's leased descendants."""
    lease_demote_secs: float | None = None
    """The idle bound after which a leased child is reaped."""
    sandbox: str | None = None
    """The kernel confinement of the agent's shell, one line
    (:meth:`runtime.shell.confinement.Sandbox.describe`); None: not known."""
    spend: Figures | None = None
    """:meth:`runtime.settlement.cost.SpendFigures.to_json` of the agent: tokens by kind and
    dollars."""
    prices_date: str | None = None
    """The date of the price table the dollars come from."""
    traffic: Figures | None = None
    """The run's traffic governor (:meth:`runtime.providers.governor.Governor.figures`): the
    fleet's, not the agent's -- every agent's requests wait in the same queue."""


def _as_map(figures: Figures | Any | None) -> dict[str, Any] | None:
    if figures is None:
        return None
    if dataclasses.is_dataclass(figures) and not isinstance(figures, type):
        return dataclasses.asdict(figures)
    if isinstance(figures, Mapping):
        return dict(figures)
    raise TypeError(f"probe figures must be a mapping or a dataclass, got {type(figures).__name__}")


def _calls(n: Any) -> str:
    return "-" if n is None else f"in {n} ral calls"


def _secs(s: Any) -> str:
    return "-" if s is None else f"{float(s):.1f} s"


def _bytes(n: Any) -> str:
    return "-" if n is None else human_bytes(int(n))


def resource_rows(f: ResourceFigures) -> list[ResourceRow]:
    """The rows of one probe, in a fixed order: workers, bindings, inbox, log, disk, lease,
    tokens and cost."""
    rows: list[ResourceRow] = []
    w = _as_map(f.workers)
    if w is None:
        rows.append(ResourceRow("workers", None, "probe unavailable"))
    else:
        rows.append(ResourceRow("workers.running", w.get("running")))
        rows.append(ResourceRow("workers.settled", w.get("settled")))
        rows.append(
            ResourceRow(
                "workers.nearest_reap_calls",
                w.get("nearest_reap_calls"),
                _calls(w.get("nearest_reap_calls")),
            )
        )
        rows.append(
            ResourceRow(
                "workers.nearest_backstop_secs",
                w.get("nearest_backstop_secs"),
                _secs(w.get("nearest_backstop_secs")),
            )
        )
    led = _as_map(f.ledger)
    if led is None:
        rows.append(ResourceRow("bindings", None, "probe unavailable"))
    else:
        armed = "armed" if led.get("armed") else "not armed"
        rows.append(
            ResourceRow(
                "bindings.live",
                led.get("live"),
                f"{armed}; baseline {led.get('baseline', '-')}, pinned {led.get('pinned', '-')}",
            )
        )
        rows.append(
            ResourceRow("bindings.bytes", led.get("bytes_held"), _bytes(led.get("bytes_held")))
        )
        rows.append(
            ResourceRow(
                "bindings.nearest_expiry_calls",
                led.get("nearest_expiry_calls"),
                _calls(led.get("nearest_expiry_calls")),
            )
        )
    total = 0
    for source, depth in f.inbox_depths.items():
        total += depth
        rows.append(ResourceRow(f"inbox.{source}", depth, f"cap {INBOX_SOURCE_CAP}"))
    rows.append(ResourceRow("inbox.total", total, f"cap {INBOX_TOTAL_CAP}"))
    rows.append(ResourceRow("eventlog.events", f.event_count, "in-memory mirror"))
    rows.append(
        ResourceRow(
            "eventlog.bytes",
            f.history_bytes,
            f"{human_bytes(f.history_bytes)}; compaction fallback at "
            f"{human_bytes(COMPACT_THRESHOLD)}",
        )
    )
    disk_total = 0
    disk_known = True
    for label, size in f.disk.items():
        rows.append(ResourceRow(f"disk.{label.replace(' ', '_')}", size, _bytes(size)))
        if size is None:
            disk_known = False
        else:
            disk_total += size
    ceiling = "no ceiling" if f.disk_ceiling is None else f"ceiling {human_bytes(f.disk_ceiling)}"
    rows.append(
        ResourceRow(
            "disk.total",
            disk_total if disk_known else None,
            f"{_bytes(disk_total if disk_known else None)}; {ceiling}",
        )
    )
    rows.append(
        ResourceRow(
            "lease.nearest_reap_secs", f.lease_nearest_reap_secs, _secs(f.lease_nearest_reap_secs)
        )
    )
    rows.append(ResourceRow("lease.demote_secs", f.lease_demote_secs, _secs(f.lease_demote_secs)))
    if f.sandbox is not None:
        rows.append(ResourceRow("sandbox", f.sandbox.split(":", 1)[0], f.sandbox))
    if f.spend is not None:
        rows += _spend_rows(f.spend, f.prices_date)
    if f.traffic is not None:
        rows += traffic_rows(f.traffic)
    return rows


def traffic_rows(traffic: Figures) -> list[ResourceRow]:
    """The governor's rows: each lane's limits (set or learned) and pace, what is in flight and
    queued, and the fleet's requests, waits and 429s."""
    rows: list[ResourceRow] = []
    lanes: dict[str, Any] = traffic.get("lanes") or {}
    for lane, d in lanes.items():
        model = lane.rsplit(" ", 1)[-1]
        for budget, limit in (d.get("limits") or {}).items():
            rows.append(
                ResourceRow(
                    f"traffic.{model}.{budget}_per_min",
                    limit.get("per_minute"),
                    f"{limit.get('source')}; pace {d.get('pace')}",
                )
            )
        if not d.get("limits"):
            rows.append(ResourceRow(f"traffic.{model}.limits", None, "none known: not paced"))
        rows.append(ResourceRow(f"traffic.{model}.inflight", d.get("inflight")))
        rows.append(ResourceRow(f"traffic.{model}.queued", d.get("queued")))
    rows.append(ResourceRow("traffic.requests", traffic.get("requests"), "the whole fleet"))
    rows.append(
        ResourceRow(
            "traffic.waits",
            traffic.get("waits"),
            f"{float(traffic.get('wait_seconds') or 0):.1f} s in all",
        )
    )
    rows.append(ResourceRow("traffic.throttled", traffic.get("throttled"), "answered 429/529"))
    return rows


def _spend_rows(spend: Figures, prices_date: str | None) -> list[ResourceRow]:
    """Tokens by kind and the cost; an unknown cost is ``-`` with the reason, never 0."""
    trips = spend.get("roundTrips", 0)
    unmetered = spend.get("unmeteredRoundTrips", 0)
    unpriced = list(spend.get("unpricedModels") or ())
    usd = spend.get("usd")
    if usd is not None:
        why = f"prices of {prices_date}"
    elif unpriced:
        why = f"unknown: no price for {', '.join(unpriced)} (known part ${spend.get('knownUsd')})"
    else:
        why = f"unknown: {unmetered} round trips reported no usage"
    return [
        ResourceRow("tokens.in", spend.get("tokensIn"), f"{trips} round trips"),
        ResourceRow("tokens.out", spend.get("tokensOut")),
        ResourceRow("tokens.cache_write", spend.get("cacheWrite"), "part of tokens.in"),
        ResourceRow("tokens.cache_read", spend.get("cacheRead"), "part of tokens.in"),
        ResourceRow("cost.usd", usd, why),
    ]


def render_card(rows: list[ResourceRow], title: str = "resources") -> str:
    """A plain-text table: title line, then ``name  value  detail`` aligned in columns."""
    shown = [(r.name, "-" if r.value is None else str(r.value), r.detail) for r in rows]
    wn = max((len(n) for n, _, _ in shown), default=4)
    wv = max((len(v) for _, v, _ in shown), default=5)
    lines = [title]
    for name, value, detail in shown:
        lines.append(f"  {name:<{wn}}  {value:>{wv}}  {detail}".rstrip())
    return "\n".join(lines)


def event_rows(rows: list[ResourceRow]) -> tuple[tuple[str, Any], ...]:
    """The raw rows as the ``Resources`` bus event carries them: ``(name, value)`` pairs."""
    return tuple((r.name, r.value) for r in rows)


def resources(f: ResourceFigures, title: str = "resources") -> tuple[list[ResourceRow], str]:
    """:func:`resource_rows` and :func:`render_card` in one call: the rows and the card of one
    probe."""
    rows = resource_rows(f)
    return rows, render_card(rows, title)
