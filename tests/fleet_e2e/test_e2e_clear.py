"""``/clear`` through the real fleet: a result from the cleared generation is dropped, recorded.

The trunk is interactive (it parks Held for its human, so it is still live when the late result
arrives and the drop is for the right reason: a stale generation, not an ended recipient). Its
child ``kid`` has already called ``reply`` and is still busy in ``sleep 30`` when the human's
``/clear`` reaches the trunk's turn boundary. The clear reaps the subtree and advances the
generation; kid's result, stamped with the old generation, reaches the spawn site afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from e2e_support import (
    FleetRun,
    fleet_factory,
)

from exarch_actors.runtime.fleet.inbox import Command
from tests.support.waiting import wait_for as wait_until

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

SCENARIO = """
[fleet]
prompt = "delegate"
[[agents.trunk]]
ral = ["agent kid 'work'"]
[[agents.trunk]]
text = "kid is working"
stop = "end_turn"
[[agents.kid]]
ral = ["reply 'late result'; sleep 30"]
"""


def test_a_child_result_arriving_after_its_parent_ran_clear_is_not_delivered_and_is_recorded(
    fleet_of: Callable[..., FleetRun],
) -> None:
    run = fleet_of(SCENARIO)
    fleet = run.fleet
    trunk = fleet.start_trunk(run.prompt, interactive=True)
    wait_until(lambda: "kid" in fleet.agents and fleet.agents["kid"].replied, what="kid replied")
    kid = fleet.agents["kid"]
    wait_until(lambda: kid.eval_root.busy, what="kid busy")
    wait_until(lambda: trunk.stats.state == "idle" and trunk.stats.turns == 1, what="trunk parked")
    generation = fleet.registry.generation

    trunk.inbox.push(Command("/clear"))  # the frontend's path for a typed slash line
    assert kid.done.wait(5.0)
    run.recorder.wait_for("Notice", "trunk")  # Cleared
    assert fleet.registry.generation == generation + 1
    assert kid.outcome is not None and kid.outcome.value == "cancelled"
    assert fleet.registry.is_live("trunk")  # the recipient is there: the drop is for staleness

    run.close()
    rejected = [r for r in run.transcript() if r["kind"] == "InboxRejected"]
    assert len(rejected) == 1, rejected
    record = rejected[0]
    assert (record["agent"], record["reason"], record["sender"]) == (
        "trunk",
        "stale generation",
        "kid",
    )
    assert record["message"]["type"] == "AgentResult"
    assert record["message"]["value"] == "late result"
    assert record["message"]["generation"] == generation
    # not delivered: the trunk's log (before and after the clear) never shows kid's result
    logs = list((run.session / "agents" / "trunk").glob("events*.jsonl"))
    assert logs
    assert not any("late result" in p.read_text() for p in logs)
    assert trunk.stats.handled == 2  # the prompt, then /clear; no third item for a result
    assert trunk.stats.turns == 1  # only the prompt reached the model
    died = [r for r in run.transcript() if r["kind"] == "Died" and r["agent"] == "kid"]
    assert [(d["outcome"], d["cause"]) for d in died] == [("cancelled", "clear")]
    kinds = [r["kind"] for r in run.journal() if r["id"] == "kid"]
    assert kinds[-1] == "cancelled"
