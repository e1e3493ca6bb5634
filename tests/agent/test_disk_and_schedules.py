"""The disk warning (every 32 ral calls, once per excursion, nothing walked unconfigured) and the
self-wakeup / pin verbs in running agents."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exarch_actors.runtime.constants import DISK_WARN_CHECK_INTERVAL
from tests.agent.conftest import Live, Run
from tests.support.waiting import wait_for

HUNDRED_CALLS = """
[fleet]
prompt = "go"

[[agents.trunk]]
ral = ["1"]
repeat = 100

[[agents.trunk]]
ral = ["reply done"]
repeat = 2
"""


@pytest.mark.slow
def test_a_disk_ceiling_warns_once_per_excursion_checked_every_32_calls(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(HUNDRED_CALLS, "--disk-warn-bytes", "1")
    assert run.code == 0, run.stderr
    records = run.jsonl("transcript.jsonl")
    warnings = [
        i for i, r in enumerate(records) if r["kind"] == "SystemNote" and "disk" in r["text"]
    ]
    assert len(warnings) == 1, "one warning for one excursion (checks at 32, 64, 96 stay latched)"
    ios_before = sum(1 for r in records[: warnings[0]] if r["kind"] == "Io")
    assert ios_before == DISK_WARN_CHECK_INTERVAL, "measured after the 32nd call, not before"
    assert "ceiling of 1 B" in records[warnings[0]]["text"]
    assert not [e for e in run.events("trunk") if "disk" in str(e.get("text", ""))], (
        "report only: never model-facing"
    )


def test_without_a_ceiling_nothing_is_walked_and_nothing_is_said(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(HUNDRED_CALLS, interactive=False)
    assert live.fleet.wait_empty(30)
    assert live.trunk.stats.ral_calls == 102
    assert live.trunk.disk_warn.last_total is None, "no walk, ever"
    assert not [n for n in live.kinds("SystemNote") if "disk" in n["text"]]


@pytest.mark.slow
def test_an_armed_schedule_parks_the_agent_until_it_wakes_it(
    run_scenario: Callable[..., Run],
) -> None:
    # Turn 1 arms the schedule and stops without replying: must_reply spends its budget (3),
    # the turn ends, and the trunk parks UntilCancelled instead of quiescing. The wakeup is
    # the next turn; it disarms and replies.
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["schedule tick 0.2 'time to check'"]

        [[agents.trunk]]
        text = "waiting for my wakeup"
        repeat = 4

        [[agents.trunk]]
        ral = ["unschedule tick", "reply woke"]

        [[agents.trunk]]
        ral = ["reply woke"]
        """,
        timeout=30,
    )
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "woke"
    events = run.events("trunk")
    wakeups = [e for e in events if e["kind"] == "user" and e["source"] == "wakeup"]
    assert len(wakeups) == 1 and "time to check" in wakeups[0]["text"]
    nudges_before = [e["nudge"] for e in events[: events.index(wakeups[0])] if e["kind"] == "nudge"]
    assert nudges_before == ["must_reply"] * 3
    unschedule = [
        r for r in run.kinds("transcript.jsonl", "Io") if r["script"] == "unschedule tick"
    ]
    assert unschedule[0]["value"] == "[value]\ntrue"


@pytest.mark.slow
def test_a_pin_is_reminded_with_must_reply_additively_and_repeats_while_pinned(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["pin task 'write the report'"]

        [[agents.trunk]]
        text = "thinking"
        repeat = 5

        [[agents.trunk]]
        ral = ["unpin task", "reply done"]

        [[agents.trunk]]
        ral = ["reply done"]
        """
    )
    assert run.code == 0, run.stderr
    events = run.events("trunk")
    nudges = [e for e in events if e["kind"] == "nudge"]
    kinds = [n["nudge"] for n in nudges]
    assert kinds == ["must_reply", "pinned_reminder"] * 3 + ["pinned_reminder"] * 2 + [
        "self_verify"
    ]
    i = events.index(nudges[0])
    assert events[i + 1] is nudges[1], "both nudges of one stop are posted together"
    assert "task: write the report" in nudges[1]["text"]


def test_a_schedule_on_a_child_holds_it_until_its_wakeup_and_then_it_replies(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'wait for the tick'"]

        [[agents.trunk]]
        text = "waiting"

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2

        [[agents.kid]]
        ral = ["schedule tick 0.2 'tick'"]

        [[agents.kid]]
        text = "parked"
        repeat = 4

        [[agents.kid]]
        ral = ["reply ticked"]
        """,
        interactive=False,
    )
    wait_for(lambda: "kid" in live.fleet.agents, what="kid born")
    kid = live.fleet.agents["kid"]
    wait_for(lambda: kid.park_mode().value == "UntilCancelled" and kid.stats.state == "idle")
    assert live.fleet.wait_empty(10)
    assert kid.outcome is not None and kid.outcome.value == "replied"
    assert kid.reply_value == "ticked"


SIX_HUNDRED_KB = "join (map { |x| '" + "x" * 100 + "' } (range 6000))"


@pytest.mark.slow
def test_the_disk_warning_counts_the_scratch_directory_inside_the_session_once(
    run_scenario: Callable[..., Run],
) -> None:
    # 600 kB in scratch/trunk, inside the session directory: counted twice it would cross the
    # 1 MB ceiling at the first check (call 32). The warning comes only once a second 600 kB
    # file really puts the session over, at the check after call 64.
    run = run_scenario(
        f"""
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let d = (env EXARCH_SCRATCH); write-text $d/a ({SIX_HUNDRED_KB})"]

        [[agents.trunk]]
        ral = ["1"]
        repeat = 39

        [[agents.trunk]]
        ral = ["let d = (env EXARCH_SCRATCH); write-text $d/b ({SIX_HUNDRED_KB})"]

        [[agents.trunk]]
        ral = ["1"]
        repeat = 30

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2
        """,
        "--disk-warn-bytes",
        "1000000",
    )
    assert run.code == 0, run.stderr
    records = run.jsonl("transcript.jsonl")
    warnings = [
        i for i, r in enumerate(records) if r["kind"] == "SystemNote" and "disk" in r["text"]
    ]
    assert len(warnings) == 1
    assert sum(1 for r in records[: warnings[0]] if r["kind"] == "Io") == 64


def test_the_resources_disk_rows_count_the_scratch_directory_once(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        f"""
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let d = (env EXARCH_SCRATCH); write-text $d/a ({SIX_HUNDRED_KB})"]

        [[agents.trunk]]
        text = "written"
        stop = "end_turn"
        """
    )
    live.wait_idle(1)
    live.steer("/resources")
    (event,) = wait_for(lambda: live.kinds("Resources") or None, what="the /resources event")
    rows = dict(event["rows"])
    assert rows["disk.scratch"] == 600_000
    assert rows["disk.log_dir"] < 600_000, "the log dir row leaves the nested scratch out"
    assert rows["disk.total"] == rows["disk.log_dir"] + rows["disk.scratch"]
