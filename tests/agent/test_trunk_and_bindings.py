"""Three rules of the agent model, through the real fleet: the trunk is an ordinary root, a
panicking call's lease renewals survive its rollback, and a binding over the large-binding limit
reaches the model as a residency nudge once per excursion."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.agent.conftest import Live, Run
from tests.support.waiting import wait_for


def test_a_cascade_stops_the_trunks_run_through_its_shell_root_as_it_stops_any_childs(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'wait'", "sleep 60"]

        [[agents.kid]]
        ral = ["sleep 60"]
        """,
        interactive=False,
    )
    fleet, trunk = live.fleet, live.trunk
    wait_for(lambda: "kid" in fleet.agents, what="kid born")
    kid = fleet.agents["kid"]
    wait_for(lambda: trunk.eval_root.busy and kid.eval_root.busy, what="both in `sleep 60`")
    for agent in (trunk, kid):  # no special case: every node registers its root's terminal cancel
        entry = fleet.registry.lookup(agent.name)
        assert entry is not None and entry.eval_root == agent.eval_root.end, agent.name
    fleet.cancel_all("interrupted")
    assert fleet.wait_empty(30), "the cascade ends the trunk's run long before 60 s"
    assert trunk.outcome is not None and trunk.outcome.value == "cancelled"
    assert trunk.eval_root.cancelled and kid.eval_root.cancelled, "both roots tripped"
    assert trunk.eval_root.reason == "interrupted"
    (sleep,) = [r for r in live.kinds("Io") if r["agent"] == "trunk" and r["script"] == "sleep 60"]
    assert sleep["error"] == "error" and "cancelled" in sleep["value"]


@pytest.mark.slow
def test_a_name_used_by_a_call_that_crashed_survives_the_rollback_of_that_call(
    run_scenario: Callable[..., Run],
) -> None:
    # `keep` is bound at call 1 and used again only by call 257, which SIGKILLs its shell.
    # Without its renewal the rollback's boundary (256 calls after call 1) would prune it.
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let keep = 41"]

        [[agents.trunk]]
        ral = ["1", "1", "1", "1", "1", "1", "1", "1"]
        repeat = 31

        [[agents.trunk]]
        ral = ["1", "1", "1", "1", "1", "1", "1"]

        [[agents.trunk]]
        ral = ["echo $keep; fault crash"]

        [[agents.trunk]]
        ral = ["reply (add $keep 1)"]
        repeat = 2
        """,
        env={"EXARCH_FAULTS": "1"},
        timeout=120,
    )
    assert run.code == 0, run.stderr
    (rollback,) = run.kinds("record.jsonl", "Rollback")
    assert rollback["epoch"] == 257
    assert run.kinds("record.jsonl", "Prune") == []
    assert run.stdout.strip() == "42"


BLOB = "let blob = { join (map { |x| '" + "x" * 100 + "' } (range 12000)) }"


@pytest.mark.slow
def test_a_large_binding_reaches_the_model_as_a_residency_nudge_once_per_excursion(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        f"""
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["{BLOB}", "let big = blob"]

        [[agents.trunk]]
        ral = ["let big = blob"]

        [[agents.trunk]]
        ral = ["let big = 'small now'"]

        [[agents.trunk]]
        ral = ["let big = blob"]

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2
        """
    )
    assert run.code == 0, run.stderr
    notices = [n for n in run.kinds("transcript.jsonl", "Notice") if n["notice"] == "LargeBinding"]
    assert len(notices) == 3, "the transcript still records every large write"
    events = run.events("trunk")
    assert run.nudges() == ["residency", "residency", "self_verify"]
    first = next(e for e in events if e["kind"] == "nudge")
    size = notices[0]["data"]["size"]  # the binding's encoded size: 1.2 MB of text
    assert f"`big` holds {size} bytes, over the 1048576-byte" in first["text"]
    assert "file path" in first["text"]
    i = events.index(first)
    assert [e["kind"] for e in events[i - 3 : i]] == ["assistant", "tool_result", "tool_result"]
    assert events[i + 1]["kind"] == "assistant", "posted after the batch, before the next request"
