"""A dated model's price is looked up once per table and model (runtime/providers/prices.py):
the remembered answer is the scan's, and a table built with other prices scans afresh."""

from __future__ import annotations

from decimal import Decimal

from exarch_actors.runtime.providers.prices import Price, PriceTable


def _price(n: int) -> Price:
    return Price(Decimal(n), Decimal(n), Decimal(0), Decimal(0))


def test_a_dated_models_price_is_the_longest_table_name_and_stays_so_when_asked_again() -> None:
    table = PriceTable({"gpt-4o": _price(1), "gpt-4o-mini": _price(2)})
    assert table.price("gpt-4o-mini-2024-07-18") == _price(2)
    assert table.price("gpt-4o-mini-2024-07-18") == _price(2)
    assert table.price("gpt-4o-2024-08-06") == _price(1)
    assert table.price("worker-000") is None
    assert table.price("worker-000") is None


def test_a_table_with_new_prices_does_not_answer_with_the_old_tables_lookup() -> None:
    table = PriceTable({"gpt-4o": _price(1)})
    assert table.price("o3-2025-04-16") is None  # remembered: no table name fits
    wider = table.with_prices({"o3": _price(3)})
    assert wider.price("o3-2025-04-16") == _price(3)
    assert table.price("o3-2025-04-16") is None
