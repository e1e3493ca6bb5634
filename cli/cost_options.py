"""The money flags shared by ``run`` and ``fleet`` (the rules live in ``runtime/settlement/cost.py``
and
``runtime/providers/prices.py``; docs/cost.md)::

    --prices FILE                                  a TOML or JSON price file (repeatable)
    --price MODEL=INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]   dollars per million tokens (repeatable)
    --budget USD                                   cancel the fleet when its spend reaches this

``@cost_options`` adds them and hands the command one frozen :class:`CostChoice` (keyword
``cost``). A bad price file or flag is a usage error (exit 2) naming it, and so is a budget on a
model with no price (``cli/runner.py``): a budget that cannot see the spend would stop nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import click

from exarch_actors.runtime.providers.prices import BadPrice, PriceTable, price_table


@dataclass(frozen=True)
class CostChoice:
    """The price table the flags describe and the budget, if any."""

    prices: PriceTable = field(default_factory=PriceTable)
    budget: Decimal | None = None


class Dollars(click.ParamType):
    """A positive amount of US dollars: ``0.50``, ``$2``."""

    name = "usd"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Decimal) or value is None:
            return value
        text = str(value).strip().removeprefix("$")
        try:
            amount = Decimal(text)
        except InvalidOperation:
            self.fail(f"{value!r} is not an amount of dollars", param, ctx)
        if not amount.is_finite() or amount <= 0:
            self.fail(f"{value!r} is not a positive amount of dollars", param, ctx)
        return amount


def cost_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--prices``, ``--price`` and ``--budget``; the command receives ``cost``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        prices: tuple[str, ...],
        price: tuple[str, ...],
        budget: Decimal | None,
        **kwargs: Any,
    ) -> Any:
        try:
            table = price_table(prices, price)
        except BadPrice as e:
            raise click.UsageError(str(e)) from None
        return command(*args, cost=CostChoice(table, budget), **kwargs)

    options = [
        click.option(
            "--prices",
            multiple=True,
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="A TOML or JSON price file replacing the built-in table's entries "
            "(docs/cost.md; repeatable).",
        ),
        click.option(
            "--price",
            multiple=True,
            metavar="MODEL=IN,OUT[,CW,CR]",
            help="Dollars per million tokens for MODEL: input, output[, cache write, cache "
            "read] (repeatable; wins over --prices).",
        ),
        click.option(
            "--budget",
            type=Dollars(),
            metavar="USD",
            help="Cancel the whole fleet when its spend reaches USD dollars: outcome `budget`, "
            "exit 1. Needs a price for the model.",
        ),
    ]
    decorated: Callable[..., Any] = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
