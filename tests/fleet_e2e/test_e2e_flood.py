"""A flood of 10,000 ``message`` calls at one busy agent, through the real desk.

``victim`` is busy in ral ``sleep 30``, so nothing drains its inbox: the first INBOX_SOURCE_CAP
agent messages are queued and every other one is rejected *to the sending script* as a
catchable ral error ``inbox full``. The sending script counts the outcomes itself (a ``fold``,
since ral has no mutation), so the count the test asserts is the one the sender saw.
At close, the 64 queued messages the victim never read are recorded, not dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from e2e_support import (
    FleetRun,
    fleet_factory,
)

from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
from tests.support.waiting import wait_for as wait_until

fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)

FLOOD = 10_000

COUNT = (
    "fold { |acc, i| "
    'try { message victim "m $i"; put $acc accepted (add $acc[accepted] 1) } '
    "catch e { if (contains (get $e message) 'inbox full') "
    "{ put $acc full (add $acc[full] 1) } "
    "else { put $acc other (append $acc[other] (get $e message)) } } } "
    f"[accepted: 0, full: 0, other: []] (range {FLOOD})"
)

SCENARIO = f"""
[fleet]
prompt = "delegate"
[[agents.trunk]]
ral = ["agent victim 'work'"]
[[agents.trunk]]
text = "victim is busy"
stop = "end_turn"
[[agents.trunk]]
ral = ['''{COUNT}''', "try {{ message victim 'one more' }} catch e {{ get $e message }}"]
[[agents.trunk]]
text = "flooded"
stop = "end_turn"
[[agents.victim]]
ral = ["sleep 30"]
"""


@pytest.mark.slow
def test_ten_thousand_messages_at_a_busy_agent_accept_exactly_the_source_cap_and_reject_the_rest(
    fleet_of: Callable[..., FleetRun],
) -> None:
    run = fleet_of(SCENARIO)
    fleet = run.fleet
    trunk = fleet.start_trunk(run.prompt, interactive=True)
    wait_until(lambda: "victim" in fleet.agents, what="victim born")
    victim = fleet.agents["victim"]
    wait_until(lambda: victim.eval_root.busy, what="victim busy")
    wait_until(lambda: trunk.stats.state == "idle", what="trunk parked")

    fleet.registry.steer("trunk", "flood the victim")
    io = run.recorder.wait_for(
        "Io", "trunk", timeout=40.0, where=lambda e: e.call_id == "call_trunk_2_0"
    )
    # the script's own count, as its value came back to the model
    m = re.search(r"\[accepted: (\d+), full: (\d+), other: (\[.*?\])\]", io.value, re.S)
    assert m is not None, io.value
    accepted, full, other = int(m.group(1)), int(m.group(2)), m.group(3)
    assert (accepted, full, other) == (INBOX_SOURCE_CAP, FLOOD - INBOX_SOURCE_CAP, "[]")
    assert io.error is None
    refusal = run.recorder.wait_for(
        "Io", "trunk", where=lambda e: e.call_id == "call_trunk_2_1"
    ).value
    assert "inbox full" in refusal and "victim" in refusal, refusal
    assert f"cap of {INBOX_SOURCE_CAP} for source agent_message" in refusal, refusal
    assert victim.inbox.depths()["agent_message"] == INBOX_SOURCE_CAP
    queued = [(type(m).__name__, getattr(m, "text", None)) for m in victim.inbox.items()]
    assert queued == [("AgentMessage", f"m {i}") for i in range(INBOX_SOURCE_CAP)]  # first 64
    assert victim.eval_root.busy  # still in its sleep: nothing drained

    run.close()
    unread = [
        r for r in run.transcript() if r["kind"] == "InboxRejected" and r["agent"] == "victim"
    ]
    assert len(unread) == INBOX_SOURCE_CAP
    assert {r["reason"] for r in unread} == {"recipient ended"}
