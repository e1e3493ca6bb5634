"""A cancel travels down the spawn tree as messages, hop by hop, in both agent backends.

trunk → kid → grandkid, each busy in a 30 s ral ``sleep``. ``registry.cancel("trunk")`` sends
the trunk an exit signal; each node it reaches trips its own scope and then signals its
children. Every hop leaves a ``CancelHop`` record in ``transcript.jsonl``: ``sent`` by the
registry for the hop, ``received`` where the recipient's mailbox is (an agent process records
its own, in its process), and one ``ended`` once the whole subtree has ended. The tests read
those records, so the hops themselves are what is observed, not only the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import pytest
from e2e_support import FleetRun, fleet_factory

from exarch_actors.actors.fleet import FleetConfig
from tests.support.busy import busy_in_its_call
from tests.support.waiting import HANG_GUARD, wait_for

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

TREE = """
[fleet]
prompt = "build the tree"
[[agents.trunk]]
ral = ["agent kid 'split'; sleep 30"]
[[agents.kid]]
ral = ["agent grandkid 'leaf'; sleep 30"]
[[agents.grandkid]]
ral = ["sleep 30"]
"""

NAMES = ("trunk", "kid", "grandkid")
Backend = Literal["thread", "process"]
BACKENDS: tuple[Backend, ...] = ("thread", "process")


def _hops(run: FleetRun) -> list[dict[str, Any]]:
    return [r for r in run.transcript() if r["kind"] == "CancelHop"]


def _start(fleet_of: Callable[..., FleetRun], toml: str, backend: Backend) -> FleetRun:
    run = fleet_of(toml, FleetConfig(agents=backend))
    run.fleet.start_trunk(run.prompt)
    return run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancel_reaches_the_grandchilds_running_evaluation_hop_by_hop(
    fleet_of: Callable[..., FleetRun], backend: Backend
) -> None:
    run = _start(fleet_of, TREE, backend)
    fleet = run.fleet
    wait_for(
        lambda: all(busy_in_its_call(fleet, n) for n in NAMES), 60, "every node busy in its sleep"
    )
    assert sorted(fleet.registry.cancel("trunk", "test")) == sorted(NAMES)
    wait_for(lambda: fleet.wait_empty(0), HANG_GUARD, "every node ended")
    wait_for(
        lambda: any(h["phase"] == "ended" for h in _hops(run)), HANG_GUARD, "the subtree's end"
    )
    run.close()

    hops = _hops(run)
    sent = [(h["sender"], h["agent"]) for h in hops if h["phase"] == "sent"]
    # each node is signalled by its parent, and only after its parent was
    assert sent == [(None, "trunk"), ("trunk", "kid"), ("kid", "grandkid")]
    received = {h["agent"]: h for h in hops if h["phase"] == "received"}
    assert {n: received[n]["sender"] for n in NAMES} == {
        "trunk": None,
        "kid": "trunk",
        "grandkid": "kid",
    }
    assert {h["cause"] for h in hops} == {"test"}
    order = [(h["phase"], h["agent"]) for h in hops]
    for parent, child in (("trunk", "kid"), ("kid", "grandkid")):
        # a hop is sent once its sender was signalled, and is received after it was sent
        assert order.index(("sent", parent)) < order.index(("sent", child))
        assert order.index(("sent", child)) < order.index(("received", child))
    ended = [h for h in hops if h["phase"] == "ended"]
    assert [(h["agent"], h["sender"]) for h in ended] == [("trunk", "trunk")]
    assert order.index(("ended", "trunk")) > max(order.index(("received", n)) for n in NAMES)

    # the grandchild's running evaluation was what the last hop stopped
    results = [e["message"] for e in run.events("grandkid") if e.get("kind") == "tool_result"]
    assert len(results) == 1 and results[0]["is_error"] is True
    assert "cancelled" in results[0]["content"]
    died = {r["agent"]: r for r in run.transcript() if r["kind"] == "Died"}
    assert {n: (died[n]["outcome"], died[n]["cause"]) for n in NAMES} == {
        n: ("cancelled", "test") for n in NAMES
    }


BUSY_CHILD = """
[fleet]
prompt = "start one"
[[agents.trunk]]
ral = ["agent s0 'work'; sleep 30"]
[[agents.s0]]
ral = ["sleep 30"]
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancel_arrives_through_the_agents_mailbox_ahead_of_its_queued_turns(
    fleet_of: Callable[..., FleetRun], backend: Backend
) -> None:
    run = _start(fleet_of, BUSY_CHILD, backend)
    fleet = run.fleet
    wait_for(lambda: busy_in_its_call(fleet, "s0"), 60, "s0 busy in its sleep")
    for i in range(3):  # three turns queued in its mailbox behind the busy one
        fleet.registry.message("trunk", "s0", f"queued {i}")
    fleet.registry.cancel("s0", "test")
    wait_for(lambda: fleet.hosted["s0"].done.is_set(), HANG_GUARD, "s0 ended")
    run.close()

    outcome = fleet.hosted["s0"].outcome
    assert outcome is not None and outcome.value == "cancelled"
    hops = [(h["phase"], h["sender"]) for h in _hops(run) if h["agent"] == "s0"]
    assert ("sent", None) in hops and ("received", None) in hops
    # the queued turns were never admitted: the cancel was served before them
    users = [
        e["message"]["content"]
        for e in run.events("s0")
        if e.get("kind") == "user" and isinstance(e.get("message"), dict)
    ]
    assert not any("queued" in str(u) for u in users), users
    undelivered = [
        r["message"]["text"]
        for r in run.transcript()
        if r["kind"] == "InboxRejected" and r["agent"] == "s0"
    ]
    assert sorted(undelivered) == ["queued 0", "queued 1", "queued 2"]
