"""Cancellation arriving mid-fork: the parent is cancelled while its ``agent`` verb is in flight.

The verb runs on the parent's shell-actor thread (an enquiry from the busy shell host): it
registers the child, builds it (a new shell host process), admits it in the journal and
launches its drive. The cancel here comes from another thread at the one moment a test can pin
down without a sleep: right after the child registers (``after``), or right before, so the child
registers under a parent that is already cancelled (``before``). Either way the child is tripped
at once: its drive ends cancelled before its model is ever asked, its journal ends with a
terminal ``cancelled`` record, and none of the run's processes remain.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from e2e_support import (
    FleetRun,
    alive,
    descendants,
    fleet_factory,
)

from tests.support.waiting import HANG_GUARD
from tests.support.waiting import wait_for as wait_until

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

SCENARIO = """
[fleet]
prompt = "delegate"
[[agents.trunk]]
ral = ["agent kid 'work'; sleep 30"]
[[agents.kid]]
ral = ["sleep 30"]
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_child_forked_while_its_parent_is_being_cancelled_ends_cancelled_before_any_turn(
    fleet_of: Callable[..., FleetRun], monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    before = descendants()
    run = fleet_of(SCENARIO)
    fleet = run.fleet
    real_register = fleet.registry.register

    def cancel_trunk_from_another_thread() -> None:
        t = threading.Thread(target=fleet.registry.cancel, args=("trunk", "mid-fork"))
        t.start()
        t.join()

    def register(name: str, parent: str | None = None, **kw: Any) -> Any:
        if name == "kid" and when == "before":
            cancel_trunk_from_another_thread()
        entry = real_register(name, parent, **kw)
        if name == "kid" and when == "after":
            cancel_trunk_from_another_thread()
        return entry

    monkeypatch.setattr(fleet.registry, "register", register)
    trunk = fleet.start_trunk(run.prompt)
    assert trunk.done.wait(10.0)
    wait_until(lambda: "kid" in fleet.agents, what="kid built")
    kid = fleet.agents["kid"]
    assert kid.done.wait(5.0)

    assert kid.outcome is not None and kid.outcome.value == "cancelled"
    assert kid.eval_root.cancelled and kid.eval_root.reason == "mid-fork"  # tripped at attach
    assert run.playback.cursor("kid") == 0  # ... before its model was asked anything
    assert kid.stats.ral_calls == 0
    assert trunk.outcome is not None and trunk.outcome.value == "cancelled"
    kid_pid = kid.shell_pid()
    assert kid_pid is not None and not alive(kid_pid)
    wait_until(lambda: not (descendants() - before), HANG_GUARD, "no process left")

    run.close()
    records = [r for r in run.journal() if r["id"] == "kid"]
    assert records[-1]["kind"] == "cancelled", records
    assert records[-1]["ack"] == "accepted"
    assert [r["kind"] for r in records].count("cancelled") == 1
    died = {r["agent"]: (r["outcome"], r["cause"]) for r in run.transcript() if r["kind"] == "Died"}
    assert died == {"kid": ("cancelled", "mid-fork"), "trunk": ("cancelled", "mid-fork")}
