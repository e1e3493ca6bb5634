"""Spawn fuel at depth 3 through the real desk (what tests/fleet_settlement's chain example,
run through the CLI, does not already check).

trunk (3) → a (2) → b (1) → c (0). c still sees the ``agent`` verb; the desk refuses it with
``spawn fuel exhausted``: catchable in ral, an error of the call when uncaught, and nothing is
registered, journalled or announced for the refused name. c itself is born, works, replies and
dies like any other agent.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from e2e_support import (
    FleetRun,
    fleet_factory,
)

from tests.support.waiting import wait_for as wait_until

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

SCENARIO = """
[fleet]
prompt = "delegate as deep as you can"
[[agents.trunk]]
ral = ["agent a 'deeper'"]
[[agents.trunk]]
text = "waiting for a"
stop = "end_turn"
[[agents.a]]
ral = ["agent b 'deeper'"]
[[agents.a]]
text = "waiting for b"
stop = "end_turn"
[[agents.a]]
ral = ["reply 'a done'"]
[[agents.b]]
ral = ["agent c 'deeper'"]
[[agents.b]]
text = "waiting for c"
stop = "end_turn"
[[agents.b]]
ral = ["reply 'b done'"]
[[agents.c]]
ral = [
  "try { agent d 'deeper still' } catch e { get $e message }",
  "agent d 'deeper still'",
  "reply 'c done'",
]
"""


def test_the_desk_refuses_agent_at_depth_three_catchably_and_registers_nothing(
    fleet_of: Callable[..., FleetRun],
) -> None:
    run = fleet_of(SCENARIO)
    fleet = run.fleet
    fleet.start_trunk(run.prompt, interactive=True)
    wait_until(lambda: "a" in fleet.agents and fleet.agents["a"].done.is_set(), what="a ended")
    c = fleet.agents["c"]
    assert c.fuel == 0 and "agent" in c.desk.verbs()  # still advertised at 0

    caught = run.recorder.wait_for("Io", "c", where=lambda e: e.call_id == "call_c_0_0")
    assert caught.error is None and "spawn fuel exhausted" in caught.value
    uncaught = run.recorder.wait_for("Io", "c", where=lambda e: e.call_id == "call_c_0_1")
    assert uncaught.error is not None and "spawn fuel exhausted" in uncaught.value
    assert "d" not in fleet.agents and fleet.registry.lookup("d") is None

    run.close()
    born = {r["agent"]: r["fuel"] for r in run.transcript() if r["kind"] == "Born"}
    assert born == {"trunk": 3, "a": 2, "b": 1, "c": 0}
    died = {r["agent"]: r["outcome"] for r in run.transcript() if r["kind"] == "Died"}
    assert {k: died[k] for k in ("a", "b", "c")} == {"a": "replied", "b": "replied", "c": "replied"}
    assert not any(r["id"] == "d" for r in run.journal())
    replies = {r["id"]: r.get("reply") for r in run.journal() if r["kind"] == "execution-result"}
    assert replies == {"a": "a done", "b": "b done", "c": "c done"}
