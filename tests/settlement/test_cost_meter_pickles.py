"""An agent process sends its stats (its spend meter among them) to the control process."""

from __future__ import annotations

import pickle
from decimal import Decimal

from exarch_actors.runtime.messages import Usage
from exarch_actors.runtime.providers.prices import Price, PriceTable
from exarch_actors.runtime.settlement.cost import SpendMeter


def test_a_spend_meter_crosses_a_pipe_with_its_figures_and_keeps_counting() -> None:
    prices = PriceTable({"m": Price(Decimal(3), Decimal(15), Decimal(0), Decimal(0))})
    meter = SpendMeter()
    meter.charge("m", Usage(1_000_000, 0), prices)
    copy = pickle.loads(pickle.dumps(meter))
    assert copy.read() == meter.read()
    copy.charge("m", Usage(0, 1_000_000), prices)
    assert copy.read().cost == Decimal(18)
