"""What a model's tokens cost: a small dated table, overridable from a file or flags.

Prices are US dollars per million tokens, four of them per model (:class:`Price`): plain input,
output, cache write (Anthropic's ``cache_creation_input_tokens``, 1.25x input for the 5-minute
cache) and cache read (Anthropic's ``cache_read_input_tokens``, OpenAI's ``cached_tokens``). The
table is what the vendors' public pricing pages said on :data:`PRICES_DATE`; prices change, so
it is dated, printed with every cost (docs/cost.md), and overridden by ``--prices FILE`` and
``--price MODEL=...``.

Lookup (:meth:`PriceTable.price`): the model name exactly, else a table name followed by ``-``
and a date or ``latest`` (``claude-sonnet-4-5-20250929``, ``gpt-4o-2024-08-06``,
``claude-3-5-haiku-latest``). Nothing looser: ``gpt-5-pro`` is *not* priced as ``gpt-5``. A
model with no entry has no price, and its cost is unknown — never zero
(``runtime/settlement/cost.py``).

A price file is TOML or JSON (by its suffix; JSON otherwise)::

    date = "2026-01-15"                 # optional: replaces the table's date in reports
    [models."my-model"]
    input = 0.5                         # required
    output = 1.5                        # required
    cache_write = 0.625                 # optional: defaults to input
    cache_read = 0.05                   # optional: defaults to input

A flag is ``MODEL=INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]``. Cache prices left out default to the
input price: with no discount known, a cost is never understated.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from exarch_actors.runtime.errors import ExarchError

PRICES_DATE = "2025-11"
"""When the built-in table was copied from the vendors' pricing pages."""

MILLION = Decimal(1_000_000)

FREE_DATE = "none: a scripted run is free"
"""The ``date`` of :meth:`PriceTable.free_of_charge`'s table, which reports carry as the fleet
yield's ``pricesDate``: a reader tells a free run's ``$0`` from a priced one by it."""

_DATED = re.compile(r"^-(latest|\d{4}-?\d{2}-?\d{2}|\d{4})$")
"""What may follow a table name in a model name: a release date or ``latest``."""


class BadPrice(ExarchError):
    """A price file or ``--price`` flag that does not say a price; names the file or flag."""


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal

    def to_json(self) -> dict[str, str]:
        return {
            "input": str(self.input),
            "output": str(self.output),
            "cacheWrite": str(self.cache_write),
            "cacheRead": str(self.cache_read),
        }


def _p(inp: str, out: str, write: str | None, read: str) -> Price:
    i = Decimal(inp)
    return Price(i, Decimal(out), Decimal(write) if write is not None else i, Decimal(read))


BUILTIN_PRICES: dict[str, Price] = {
    # Anthropic: cache write is the 5-minute cache's (1.25x input), read 0.1x input.
    "claude-opus-4-5": _p("5", "25", "6.25", "0.50"),
    "claude-opus-4-1": _p("15", "75", "18.75", "1.50"),
    "claude-opus-4-0": _p("15", "75", "18.75", "1.50"),
    "claude-opus-4": _p("15", "75", "18.75", "1.50"),
    "claude-sonnet-4-5": _p("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-0": _p("3", "15", "3.75", "0.30"),
    "claude-sonnet-4": _p("3", "15", "3.75", "0.30"),
    "claude-3-7-sonnet": _p("3", "15", "3.75", "0.30"),
    "claude-haiku-4-5": _p("1", "5", "1.25", "0.10"),
    "claude-3-5-haiku": _p("0.80", "4", "1", "0.08"),
    # OpenAI: writing the cache is not billed (cache write = input), cached input is read.
    "gpt-5": _p("1.25", "10", None, "0.125"),
    "gpt-5-mini": _p("0.25", "2", None, "0.025"),
    "gpt-5-nano": _p("0.05", "0.40", None, "0.005"),
    "gpt-4.1": _p("2", "8", None, "0.50"),
    "gpt-4.1-mini": _p("0.40", "1.60", None, "0.10"),
    "gpt-4.1-nano": _p("0.10", "0.40", None, "0.025"),
    "gpt-4o": _p("2.50", "10", None, "1.25"),
    "gpt-4o-mini": _p("0.15", "0.60", None, "0.075"),
    "o3": _p("2", "8", None, "0.50"),
    "o4-mini": _p("1.10", "4.40", None, "0.275"),
}
"""The built-in table (:data:`PRICES_DATE`)."""


@dataclass(frozen=True)
class PriceTable:
    """Model name to :class:`Price`, and the date the figures are from."""

    prices: Mapping[str, Price] = field(default_factory=lambda: dict(BUILTIN_PRICES))
    date: str = PRICES_DATE
    overridden: tuple[str, ...] = ()
    """Models whose price came from a file or flag (reports say so)."""

    free: bool = False
    """Every model costs nothing: the scripted provider plays a file and bills no one, so its
    round trips are a known ``$0`` (its "model" is the scenario's file name, which no table
    prices: its cost once showed as ``$?`` and ``--budget`` asked for its price)."""

    def free_of_charge(self) -> PriceTable:
        """This table for a run whose provider bills nothing (the scripted provider)."""
        return PriceTable({}, FREE_DATE, (), free=True)

    def price(self, model: str | None) -> Price | None:
        """The price of ``model``: exact, else a table name plus a date or ``-latest``; zero
        for every model of a :attr:`free` table."""
        if self.free:
            return _FREE
        if not model:
            return None
        if model in self.prices:
            return self.prices[model]
        found = self.__dict__.setdefault("_dated", {})  # a frozen dataclass keeps a __dict__
        if model not in found:  # the scan over every name: once per model, not per round trip
            dated = [
                n for n in self.prices if model.startswith(n) and _DATED.match(model[len(n) :])
            ]
            found[model] = self.prices[max(dated, key=len)] if dated else None
        price: Price | None = found[model]
        return price

    def with_prices(self, prices: Mapping[str, Price], *, date: str | None = None) -> PriceTable:
        """This table with ``prices`` added or replacing entries (and ``date`` if given)."""
        merged = {**self.prices, **prices}
        overridden = tuple(dict.fromkeys([*self.overridden, *prices]))
        return PriceTable(merged, date or self.date, overridden)


_FREE = Price(Decimal(0), Decimal(0), Decimal(0), Decimal(0))


def _decimal(value: Any, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise BadPrice(f"{what}: expected a number of dollars per million tokens, got {value!r}")
    try:
        d = Decimal(str(value).strip())  # str(): a TOML float 0.1 is Decimal("0.1"), not 0.1000...
    except InvalidOperation:
        raise BadPrice(f"{what}: {value!r} is not a number") from None
    if not d.is_finite() or d < 0:
        raise BadPrice(f"{what}: {value!r} is not a non-negative price")
    return d


def parse_price_flag(flag: str) -> tuple[str, Price]:
    """``MODEL=INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]`` as (model, price)."""
    model, sep, figures = flag.partition("=")
    model = model.strip()
    if not sep or not model:
        raise BadPrice(f"--price {flag!r}: expected MODEL=INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]")
    parts = [p.strip() for p in figures.split(",")]
    if len(parts) not in (2, 4):
        raise BadPrice(
            f"--price {flag!r}: give 2 prices (input, output) or 4 (input, output, cache write, "
            f"cache read), got {len(parts)}"
        )
    values = [_decimal(p, f"--price {flag!r}") for p in parts]
    if len(values) == 2:
        values += [values[0], values[0]]
    return model, Price(*values)


def load_price_file(path: str | Path) -> tuple[dict[str, Price], str | None]:
    """The prices and date of a price file (see the module docstring)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise BadPrice(f"cannot read price file {p}: {e.strerror or e}") from None
    try:
        doc: Any = tomllib.loads(raw.decode("utf-8")) if p.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadPrice(f"price file {p}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise BadPrice(f"price file {p}: expected a 'models' table of model names")
    date = doc.get("date")
    if date is not None and not isinstance(date, str):
        date = str(date)  # a TOML date literal
    prices: dict[str, Price] = {}
    for model, entry in doc["models"].items():
        where = f"price file {p}: models.{model}"
        if not isinstance(entry, dict):
            raise BadPrice(f"{where}: expected a table with input and output")
        unknown = set(entry) - {"input", "output", "cache_write", "cache_read"}
        if unknown:
            raise BadPrice(f"{where}: unknown keys {sorted(unknown)}")
        for key in ("input", "output"):
            if key not in entry:
                raise BadPrice(f"{where}: {key} is missing")
        inp = _decimal(entry["input"], f"{where}.input")
        prices[str(model)] = Price(
            inp,
            _decimal(entry["output"], f"{where}.output"),
            _decimal(entry.get("cache_write", inp), f"{where}.cache_write"),
            _decimal(entry.get("cache_read", inp), f"{where}.cache_read"),
        )
    return prices, date


def price_table(files: Iterable[str | Path] = (), flags: Iterable[str] = ()) -> PriceTable:
    """The built-in table, then each file, then each flag, later ones winning."""
    table = PriceTable()
    for f in files:
        prices, date = load_price_file(f)
        table = table.with_prices(prices, date=date)
    flagged = dict(parse_price_flag(flag) for flag in flags)
    return table.with_prices(flagged) if flagged else table
