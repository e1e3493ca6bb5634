"""The price table, its overrides, and the cost rule: exact dollars from tokens by kind, and
unknown (no usage, no price) never counted as zero."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.messages import Usage
from exarch_actors.runtime.providers.prices import (
    PRICES_DATE,
    BadPrice,
    Price,
    PriceTable,
    parse_price_flag,
    price_table,
)
from exarch_actors.runtime.settlement.cost import (
    FleetSpend,
    SpendMeter,
    dollars,
    round_trip_cost,
    show,
)

SONNET = PriceTable().price("claude-sonnet-4-5")


def test_a_dated_model_name_is_priced_as_its_table_entry_and_nothing_looser_is() -> None:
    table = PriceTable()
    assert table.price("claude-sonnet-4-5-20250929") == table.price("claude-sonnet-4-5")
    assert table.price("gpt-4o-mini-2024-07-18") == table.price("gpt-4o-mini")
    assert table.price("gpt-4o-mini") != table.price("gpt-4o")
    assert table.price("claude-3-5-haiku-latest") == table.price("claude-3-5-haiku")
    assert table.price("gpt-5-pro") is None  # not gpt-5's price
    assert table.price("local") is None and table.price("") is None
    assert table.date == PRICES_DATE


def test_the_cost_of_a_round_trip_prices_each_kind_of_token_apart() -> None:
    assert SONNET is not None
    usage = Usage(1_000_000 + 2_000_000 + 4_000_000, 1_000_000, 2_000_000, 4_000_000)
    # 1M plain input at $3, 2M cache writes at $3.75, 4M cache reads at $0.30, 1M output at $15
    assert round_trip_cost(SONNET, usage) == Decimal("3") + Decimal("7.5") + Decimal(
        "1.2"
    ) + Decimal("15")


def test_no_usage_or_no_price_is_an_unknown_cost_never_zero() -> None:
    assert round_trip_cost(SONNET, None) is None
    assert round_trip_cost(None, Usage(10, 10)) is None
    meter = SpendMeter()
    meter.charge("claude-sonnet-4-5", Usage(1000, 10), PriceTable())
    meter.charge("mystery-model", Usage(1000, 10), PriceTable())
    figures = meter.read()
    assert figures.cost is None and not figures.cost_known
    assert figures.known_cost == Decimal("0.00315")
    assert figures.unpriced_models == ("mystery-model",)
    assert figures.to_json()["usd"] is None and figures.to_json()["knownUsd"] == "0.003150"
    assert show(figures.cost) == "$?"
    assert SpendMeter().read().cost == 0  # no round trip at all: exactly nothing spent


@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.integers(0, 10**5),
            st.integers(0, 10**6),
            st.integers(0, 10**6),
        ),
        max_size=20,
    )
)
def test_a_meter_sums_round_trip_costs_exactly(trips: list[tuple[int, int, int, int]]) -> None:
    meter = SpendMeter()
    expected = Decimal(0)
    for plain, out, write, read in trips:
        usage = Usage(plain + write + read, out, write, read)
        meter.charge("claude-sonnet-4-5", usage, PriceTable())
        cost = round_trip_cost(SONNET, usage)
        assert cost is not None and cost >= 0
        expected += cost
    figures = meter.read()
    assert figures.cost == expected
    assert figures.cache_read == sum(t[3] for t in trips)


def test_price_flags_and_files_override_the_table_and_cache_prices_default_to_input(
    tmp_path: Path,
) -> None:
    assert parse_price_flag("local=0.5,1.5") == (
        "local",
        Price(Decimal("0.5"), Decimal("1.5"), Decimal("0.5"), Decimal("0.5")),
    )
    toml = tmp_path / "p.toml"
    toml.write_text(
        'date = "2026-02-01"\n[models."gpt-4o"]\ninput = 9\noutput = 0.1\ncache_read = 0.25\n'
    )
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"models": {"mine": {"input": "1", "output": "2"}}}))
    table = price_table([toml, js], ["mine=3,4,5,6"])
    assert table.date == "2026-02-01"
    assert table.price("gpt-4o") == Price(Decimal(9), Decimal("0.1"), Decimal(9), Decimal("0.25"))
    assert table.price("mine") == Price(Decimal(3), Decimal(4), Decimal(5), Decimal(6))
    assert set(table.overridden) == {"gpt-4o", "mine"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("local", "expected MODEL=INPUT,OUTPUT"),
        ("local=1", "give 2 prices"),
        ("local=1,x", "not a number"),
        ("local=1,-2", "not a non-negative price"),
    ],
)
def test_a_bad_price_flag_is_refused_with_its_text(text: str, says: str) -> None:
    with pytest.raises(BadPrice, match=says):
        parse_price_flag(text)


def test_a_bad_price_file_is_refused_naming_the_file_and_entry(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[models.m]\ninput = 1\n")
    with pytest.raises(BadPrice, match=r"bad.toml: models.m: output is missing"):
        price_table([bad])
    with pytest.raises(BadPrice, match="cannot read price file"):
        price_table([tmp_path / "missing.json"])


def test_the_fleet_budget_is_reported_reached_exactly_once_and_unknown_spend_counted_apart() -> (
    None
):
    spend = FleetSpend(PriceTable(), Decimal("1"))
    assert spend.charge(Decimal("0.6")) is False
    assert spend.charge(None) is False
    assert spend.charge(Decimal("0.4")) is True
    assert spend.charge(Decimal("0.4")) is False
    assert spend.reached and spend.known == Decimal("1.4")
    message = spend.budget_message()
    assert "spent $1.400000 of $1.000000" in message
    assert "1 round trips of unknown cost not counted" in message
    assert dollars(None) is None


def test_resources_card_shows_tokens_by_kind_and_an_unknown_cost_with_its_reason() -> None:
    from exarch_actors.runtime.fleet.probes import ResourceFigures, resource_rows

    meter = SpendMeter()
    meter.charge("claude-haiku-4-5", Usage(3000, 100, 1000, 1500), PriceTable())
    rows = {
        r.name: r
        for r in resource_rows(ResourceFigures(spend=meter.read().to_json(), prices_date="d"))
    }
    assert rows["tokens.cache_write"].value == 1000 and rows["tokens.cache_read"].value == 1500
    # 500 x $1 + 1000 x $1.25 + 1500 x $0.10 + 100 x $5 per million
    assert rows["cost.usd"].value == "0.002400" and rows["cost.usd"].detail == "prices of d"
    meter.charge("unpriced", Usage(10, 1), PriceTable())
    rows = {r.name: r for r in resource_rows(ResourceFigures(spend=meter.read().to_json()))}
    assert rows["cost.usd"].value is None
    assert rows["cost.usd"].detail == "unknown: no price for unpriced (known part $0.002400)"
