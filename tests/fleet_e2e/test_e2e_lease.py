"""The idle lease through the real fleet, on an injected clock (``FleetConfig.clock``).

A fake clock cannot wake a real timer, so after moving it a test nudges the registry's own
reaper thread (``lease_changed``, the same wake a register gives it); the reaping
itself is the reaper's. Bound: 100 fake seconds.

Only ``registry.steer`` (a human message) renews a lease. The model-facing ``message`` verb,
sent by the trunk's ral through the real desk, does not; neither does a ``/resources`` probe,
pushed as a ``Command`` exactly as the frontend pushes a typed slash line.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from e2e_support import (
    FakeClock,
    FleetRun,
    fleet_factory,
)

from exarch_actors.actors.fleet import FleetConfig
from exarch_actors.runtime.fleet.inbox import Command
from exarch_actors.runtime.fleet.registry import DEADLINE
from tests.support.waiting import wait_for as wait_until

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

BOUND = 100.0

PARKED = """
[fleet]
prompt = "delegate"
[[agents.trunk]]
ral = ["agent kid 'delegate further'"]
[[agents.trunk]]
text = "kid is working"
stop = "end_turn"
[[agents.kid]]
ral = ["agent gk 'think hard'"]
[[agents.kid]]
text = "waiting for gk"
stop = "end_turn"
[[agents.gk]]
text = "still thinking"
delay_ms = 60000
"""

SIBLINGS = """
[fleet]
prompt = "delegate"
[[agents.trunk]]
ral = ["agent steered 'work'; agent messaged 'work'"]
[[agents.trunk]]
text = "both are working"
stop = "end_turn"
[[agents.trunk]]
ral = ["message messaged 'are you still there?'"]
[[agents.trunk]]
text = "pinged"
stop = "end_turn"
[[agents.steered]]
text = "thinking"
delay_ms = 60000
[[agents.messaged]]
text = "thinking"
delay_ms = 60000
"""


def _died(run: FleetRun, name: str) -> tuple[str, str]:
    event = run.recorder.wait_for("Died", name)
    return event.outcome, event.cause


def _reap_margin(run: FleetRun, name: str) -> float | None:
    return run.fleet.registry.lease_figures(name)["nearest_reap_secs"]


def test_a_child_parked_on_its_grandchild_is_reaped_with_cause_deadline_once_past_the_bound(
    fleet_of: Callable[..., FleetRun],
) -> None:
    clock = FakeClock()
    run = fleet_of(PARKED, FleetConfig(lease_bound=BOUND, clock=clock))
    fleet = run.fleet
    fleet.start_trunk(run.prompt, interactive=True)
    wait_until(lambda: "gk" in fleet.agents, what="gk born")
    kid, gk = fleet.agents["kid"], fleet.agents["gk"]
    wait_until(lambda: kid.stats.turns == 1 and kid.stats.state == "idle", what="kid parked")
    assert kid.park_mode().value == "HeldByChildren"

    clock.set(BOUND - 1)
    assert fleet.registry.fire_leases().reaped == ()  # one reaper pass, under the bound
    assert fleet.registry.is_live("kid") and fleet.registry.is_live("gk")

    clock.set(BOUND + 0.5)
    fleet.registry.lease_changed()  # wake the real reaper for the fake clock's jump
    assert kid.done.wait(5.0) and gk.done.wait(5.0)
    assert _died(run, "kid") == ("cancelled", DEADLINE)
    assert _died(run, "gk") == ("cancelled", DEADLINE)
    assert fleet.registry.is_live("trunk")  # the interactive trunk holds no lease

    run.close()
    for name in ("kid", "gk"):
        assert [r["kind"] for r in run.journal() if r["id"] == name][-1] == "cancelled"


def test_steer_renews_the_idle_lease_while_message_and_a_resources_probe_do_not(
    fleet_of: Callable[..., FleetRun],
) -> None:
    clock = FakeClock()
    run = fleet_of(SIBLINGS, FleetConfig(lease_bound=BOUND, clock=clock))
    fleet = run.fleet
    trunk = fleet.start_trunk(run.prompt, interactive=True)
    wait_until(
        lambda: run.playback.cursor("steered") == 1 and run.playback.cursor("messaged") == 1,
        what="both children waiting on their model",
    )
    wait_until(lambda: trunk.stats.state == "idle", what="trunk parked")
    steered, messaged = fleet.agents["steered"], fleet.agents["messaged"]

    clock.set(80.0)
    fleet.registry.steer("steered", "keep at it")  # a human message: the only renewal
    fleet.registry.steer("trunk", "ping messaged")  # the trunk's ral sends `message`
    wait_until(lambda: messaged.inbox.depths()["agent_message"] == 1, what="message delivered")
    trunk.inbox.push(Command("/resources"))  # the probe of the trunk: reads its children's leases
    messaged.inbox.push(Command("/resources"))  # queued behind its busy turn: renews nothing
    probe = run.recorder.wait_for("Resources", "trunk")
    rows = dict(probe.rows)
    assert rows["lease.nearest_reap_secs"] == 20.0  # messaged's, unrenewed since birth at 0
    assert rows["lease.demote_secs"] == BOUND
    assert _reap_margin(run, "steered") == BOUND
    assert _reap_margin(run, "messaged") == 20.0
    assert fleet.registry.engaged("steered") and not fleet.registry.engaged("messaged")

    clock.set(150.0)
    fleet.registry.lease_changed()
    assert messaged.done.wait(5.0)
    assert _died(run, "messaged") == ("cancelled", DEADLINE)
    assert fleet.registry.is_live("steered") and _reap_margin(run, "steered") == 30.0

    clock.set(180.5)
    fleet.registry.lease_changed()
    assert steered.done.wait(5.0)
    assert _died(run, "steered") == ("cancelled", DEADLINE)
