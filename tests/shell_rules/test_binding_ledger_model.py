"""The ledger against a deliberately naive model over random runs of define/use/list/fail/prune."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from exarch_actors.runtime.constants import BINDING_IDLE_CALLS
from exarch_actors.runtime.shell.ledger import BindingLedger

BASELINE = frozenset({"lib", "helper"})
DEFINABLE = ["a", "b", "c", "d", "lib"]
HARVESTABLE = [*DEFINABLE, "helper", "echo", "add", "local"]  # Σ and lexical names included


class LedgerVersusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = BindingLedger()
        self.ledger.arm(BASELINE)
        self.clock = 0
        self.last: dict[str, int] = {}  # the model: leased name -> epoch of last use

    def _run(self, harvest: set[str]) -> int:
        self.clock += 1
        assert self.ledger.tick() == self.clock
        self.ledger.renew(harvest, self.clock)
        for name in harvest:
            if name in self.last:
                self.last[name] = self.clock
        return self.clock

    @rule(name=st.sampled_from(DEFINABLE), harvest=st.sets(st.sampled_from(HARVESTABLE)))
    def define(self, name: str, harvest: set[str]) -> None:
        epoch = self._run(harvest)
        self.ledger.note_define(name, epoch, 16)
        if name not in BASELINE:
            self.last[name] = epoch

    @rule(harvest=st.sets(st.sampled_from(HARVESTABLE), min_size=1))
    def use(self, harvest: set[str]) -> None:
        self._run(harvest)

    @rule()
    def fail(self) -> None:
        self.clock += 1
        self.ledger.tick()

    @rule(calls=st.integers(min_value=1, max_value=300))
    def idle(self, calls: int) -> None:
        for _ in range(calls):
            self.fail()

    @rule()
    def list_and_probe(self) -> None:
        before = dict(self.last)
        assert self.ledger.names() == frozenset(self.last)
        assert self.ledger.figures(self.clock).live == len(self.last)
        assert before == self.last

    @rule(sink=st.booleans(), busy=st.sets(st.sampled_from(DEFINABLE)))
    def prune(self, sink: bool, busy: set[str]) -> None:
        out = self.ledger.prune(
            self.clock, sink_installed=sink, mid_frame=False, pins_running_work=busy.__contains__
        )
        if not sink:
            assert out.fell == () and out.pinned == () and out.waited
            return
        idle = {n for n, e in self.last.items() if self.clock - e >= BINDING_IDLE_CALLS}
        assert set(out.fell) == idle - busy
        assert set(out.pinned) == idle & busy
        for name in out.fell:
            del self.last[name]

    @rule()
    def checkpoint_and_restore(self) -> None:
        self.ledger = BindingLedger.from_state(self.ledger.to_state())

    @invariant()
    def same_leases_and_stamps(self) -> None:
        assert {n: self.ledger.last_use(n) for n in self.ledger.names()} == self.last
        assert self.ledger.clock == self.clock


LedgerVersusModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_ledger_agrees_with_the_naive_model = pytest.mark.slow(LedgerVersusModel.TestCase)
