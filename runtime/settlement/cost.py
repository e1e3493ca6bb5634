"""Cost in money: what a round trip, an agent and a fleet spent, and the budget that stops a run.

The cost of one round trip (:func:`round_trip_cost`) is, in US dollars, with the prices of
``runtime/providers/prices.py`` per million tokens::

    uncached input x input + cache writes x cache_write + cache reads x cache_read
        + output x output

where uncached input = input - cache writes - cache reads (:class:`runtime.messages.Usage`).
It is computed in :class:`~decimal.Decimal`, never in floats, so sums of many small costs are
exact and a figure printed twice reads the same.

**Unknown is never zero.** A round trip whose provider reported no usage, or whose model has no
price, has an unknown cost; an agent or fleet with any such round trip has an unknown total,
and reports say how much is known and how many round trips are left out. A meter with no round
trip at all spent exactly zero.

:class:`SpendMeter` is one agent's running spend; :class:`FleetSpend` sums every agent's known
spend for ``--budget``: the first charge that brings the total to the budget or past it is
reported once (:meth:`FleetSpend.charge` returns True), and the caller stops the run. Unknown
spend cannot be counted against a budget; it is counted apart (``unknown_round_trips``) and
reported.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from exarch_actors.runtime.messages import Usage
from exarch_actors.runtime.providers.prices import MILLION, Price, PriceTable

CENT_DIGITS = Decimal("0.000001")
"""Shown precision: a millionth of a dollar (one Haiku cache-read token costs 1e-7 $)."""


def round_trip_cost(price: Price | None, usage: Usage | None) -> Decimal | None:
    """The cost of one round trip, or ``None`` when the usage or the price is unknown."""
    if price is None or usage is None:
        return None
    millionths = (
        usage.uncached_input_tokens * price.input
        + usage.cache_write_tokens * price.cache_write
        + usage.cache_read_tokens * price.cache_read
        + usage.output_tokens * price.output
    )
    return millionths / MILLION


def dollars(amount: Decimal | None) -> str | None:
    """``amount`` as the string reports carry (``"0.012345"``), ``None`` when unknown."""
    if amount is None:
        return None
    return str(amount.quantize(CENT_DIGITS, rounding=ROUND_HALF_UP))


def show(amount: Decimal | None) -> str:
    """``$0.012345``, or ``$?`` when unknown (status lines, cards)."""
    text = dollars(amount)
    return "$?" if text is None else f"${text}"


@dataclass(frozen=True)
class SpendFigures:
    """A meter's reading: tokens by kind, the known cost and what it leaves out."""

    tokens_in: int = 0
    tokens_out: int = 0
    cache_write: int = 0
    cache_read: int = 0
    round_trips: int = 0
    unmetered: int = 0
    """Round trips whose provider reported no usage."""
    unpriced: int = 0
    """Round trips with usage but no price for their model."""
    unpriced_models: tuple[str, ...] = ()
    known_cost: Decimal = Decimal(0)
    """The sum over the round trips whose cost is known."""

    @property
    def cost_known(self) -> bool:
        return self.unmetered == 0 and self.unpriced == 0

    @property
    def cost(self) -> Decimal | None:
        """The total, or ``None`` when any round trip's cost is unknown."""
        return self.known_cost if self.cost_known else None

    def to_json(self) -> dict[str, Any]:
        return {
            "usd": dollars(self.cost),
            "knownUsd": dollars(self.known_cost),
            "tokensIn": self.tokens_in,
            "tokensOut": self.tokens_out,
            "cacheWrite": self.cache_write,
            "cacheRead": self.cache_read,
            "roundTrips": self.round_trips,
            "unmeteredRoundTrips": self.unmetered,
            "unpricedRoundTrips": self.unpriced,
            "unpricedModels": list(self.unpriced_models),
        }


class SpendMeter:
    """One agent's running spend. Written by the agent's thread, read by any (a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._f = SpendFigures()

    def charge(self, model: str, usage: Usage | None, prices: PriceTable) -> Decimal | None:
        """Count one round trip; return its cost (``None``: unknown). Under a free table (the
        scripted provider) every round trip is a known zero, reported usage or not."""
        price = prices.price(model)
        cost = Decimal(0) if prices.free else round_trip_cost(price, usage)
        with self._lock:
            f = self._f
            models = f.unpriced_models
            if usage is not None and price is None and model not in models:
                models = (*models, model)
            self._f = SpendFigures(
                f.tokens_in + (usage.input_tokens if usage else 0),
                f.tokens_out + (usage.output_tokens if usage else 0),
                f.cache_write + (usage.cache_write_tokens if usage else 0),
                f.cache_read + (usage.cache_read_tokens if usage else 0),
                f.round_trips + 1,
                f.unmetered + (usage is None and not prices.free),
                f.unpriced + (usage is not None and price is None),
                models,
                f.known_cost + (cost or Decimal(0)),
            )
        return cost

    def read(self) -> SpendFigures:
        with self._lock:
            return self._f

    def __getstate__(self) -> SpendFigures:
        """An agent process reports its stats, this meter among them, across a pipe: the
        figures travel, the lock is made anew."""
        return self.read()

    def __setstate__(self, figures: SpendFigures) -> None:
        self._lock = threading.Lock()
        self._f = figures


class FleetSpend:
    """Every agent's known spend summed, against an optional budget. Thread-safe."""

    def __init__(self, prices: PriceTable | None = None, budget: Decimal | None = None) -> None:
        self.prices = prices or PriceTable()
        self.budget = budget
        self._lock = threading.Lock()
        self._known = Decimal(0)
        self._unknown = 0
        self._reached = False

    def charge(self, cost: Decimal | None) -> bool:
        """Add one round trip's cost; True exactly once: when the budget is first reached."""
        with self._lock:
            if cost is None:
                self._unknown += 1
                return False
            self._known += cost
            if self.budget is None or self._reached or self._known < self.budget:
                return False
            self._reached = True
            return True

    @property
    def reached(self) -> bool:
        with self._lock:
            return self._reached

    @property
    def known(self) -> Decimal:
        with self._lock:
            return self._known

    @property
    def unknown_round_trips(self) -> int:
        with self._lock:
            return self._unknown

    def budget_message(self) -> str:
        """What a run stopped by its budget says (``error: ...``)."""
        left_out = self.unknown_round_trips
        extra = f"; {left_out} round trips of unknown cost not counted" if left_out else ""
        return (
            f"budget reached: spent {show(self.known)} of {show(self.budget)} "
            f"(prices of {self.prices.date}){extra}; the fleet was cancelled"
        )
