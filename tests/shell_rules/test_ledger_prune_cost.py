"""A ready boundary costs what aged out: the ledger's prune against the rule written naively
(every lease examined at every boundary), over random runs with pins, forgets and state round
trips; and a boundary with nothing due reads no lease at all."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from exarch_actors.runtime.shell.ledger import BindingLedger

NAMES = ["a", "b", "c", "d", "e", "base"]
IDLE = 4


def _naive_prune(last: dict[str, int], epoch: int, pins: set[str]) -> tuple[list[str], list[str]]:
    idle = [n for n, at in last.items() if epoch - at >= IDLE]
    return sorted(n for n in idle if n not in pins), sorted(n for n in idle if n in pins)


class PruneVersusNaive(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = BindingLedger()
        self.ledger.arm({"base"}, idle_calls=IDLE)
        self.clock = 0
        self.last: dict[str, int] = {}

    def _tick(self) -> int:
        self.clock += 1
        self.ledger.tick()
        return self.clock

    @rule(name=st.sampled_from(NAMES))
    def define(self, name: str) -> None:
        epoch = self._tick()
        self.ledger.note_define(name, epoch, 8)
        if name != "base":
            self.last[name] = epoch

    @rule(names=st.sets(st.sampled_from(NAMES), min_size=1))
    def use(self, names: set[str]) -> None:
        epoch = self._tick()
        self.ledger.renew(names, epoch)
        for n in names & set(self.last):
            self.last[n] = epoch

    @rule(calls=st.integers(min_value=1, max_value=2 * IDLE))
    def idle(self, calls: int) -> None:
        for _ in range(calls):
            self._tick()

    @rule(name=st.sampled_from(NAMES))
    def forget(self, name: str) -> None:
        self.ledger.forget(name)
        self.last.pop(name, None)

    @rule(pins=st.sets(st.sampled_from(NAMES)))
    def boundary(self, pins: set[str]) -> None:
        out = self.ledger.prune(
            self.clock, sink_installed=True, mid_frame=False, pins_running_work=pins.__contains__
        )
        fell, pinned = _naive_prune(self.last, self.clock, pins)
        assert (list(out.fell), list(out.pinned)) == (fell, pinned)
        for n in fell:
            del self.last[n]

    @rule()
    def round_trip(self) -> None:  # a resume, a rollback: the ledger rebuilt from its state
        self.ledger = BindingLedger.from_state(self.ledger.to_state())

    @invariant()
    def same_leases(self) -> None:
        assert self.ledger.names() == frozenset(self.last)


TestPruneVersusNaive = pytest.mark.slow(PruneVersusNaive.TestCase)
TestPruneVersusNaive.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


class _CountingReads(dict[str, int]):
    """A lease map that counts every walk over it."""

    walks = 0

    def __iter__(self) -> Any:
        _CountingReads.walks += 1
        return super().__iter__()

    def items(self) -> Any:
        _CountingReads.walks += 1
        return super().items()

    def keys(self) -> Any:
        _CountingReads.walks += 1
        return super().keys()

    def values(self) -> Any:
        _CountingReads.walks += 1
        return super().values()


def test_a_boundary_with_ten_thousand_leases_walks_none_of_them_and_drops_only_the_aged() -> None:
    ledger = BindingLedger()
    ledger.arm(set(), idle_calls=IDLE)
    ledger.tick()
    for i in range(10_000):
        ledger.note_define(f"v{i}", 1, 8)
    ledger._last_use = _CountingReads(ledger._last_use)
    for epoch in range(2, 2 + IDLE):
        ledger.tick()
        ledger.note_define("hot", epoch, 8)  # one binding changed per call
    _CountingReads.walks = 0
    examined: list[str] = []

    def pins(name: str) -> bool:
        examined.append(name)
        return False

    out = ledger.prune(1 + IDLE - 1, sink_installed=True, mid_frame=False, pins_running_work=pins)
    assert out.fell == () and examined == [] and _CountingReads.walks == 0
    out = ledger.prune(
        1 + IDLE, sink_installed=True, mid_frame=False, pins_running_work=lambda n: False
    )
    assert len(out.fell) == 10_000 and "hot" not in out.fell
    assert _CountingReads.walks == 0


def test_a_shell_that_never_prunes_keeps_its_due_heap_bounded_by_its_leases() -> None:
    ledger = BindingLedger()
    ledger.arm(set(), idle_calls=IDLE)
    for epoch in range(1, 5_001):  # no sink: the boundary waits, and the same names renew
        ledger.tick()
        ledger.renew({"a", "b"}, epoch)
        ledger.note_define("a", epoch, 8)
        ledger.note_define("b", epoch, 8)
    assert len(ledger._due) <= 2 * len(ledger.names()) + 64
