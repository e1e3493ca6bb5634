"""Worker results wake their agent: an agent that ends its turn while ral workers it spawned are
still running waits (no must_reply, no quiescence), and each completion is surfaced into its
inbox as a ``Surface`` — quota-checked, rejected never dropped, dropped by the generation guard
after ``/clear``; ``await`` still works on a surfaced worker; reaps stay transcript-only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
from tests.agent.conftest import Live, Run
from tests.support.waiting import wait_for


def surfaces(events: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in events if e["kind"] == "user" and e["source"] == "surface"]


@pytest.mark.slow
def test_a_headless_trunk_with_a_running_worker_waits_and_is_woken_by_its_result(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let h = spawn { sleep 0.5; add 40 2 }"]

        [[agents.trunk]]
        text = "The worker is running; I will wait for its result."
        stop = "end_turn"

        [[agents.trunk]]
        ral = ["let v = await $h; reply $v"]

        [[agents.trunk]]
        ral = ["reply $v"]
        """
    )
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "42"
    (told,) = surfaces(run.events("trunk"))
    assert told.startswith("[worker w1-1 finished: done;")
    assert told.endswith("[value]\n42")
    assert run.nudges() == ["self_verify"], "waiting for a worker is not a reason to nudge"
    awaited = [r for r in run.kinds("transcript.jsonl", "Io") if "await" in r["script"]]
    assert awaited[0]["error"] is None, "await on a surfaced worker still yields its value"
    assert run.kinds("transcript.jsonl", "InboxRejected") == []


def test_a_child_waiting_for_its_workers_is_not_nudged_and_hears_of_each_one(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["agent kid 'search'"]

        [[agents.trunk]]
        text = "waiting for kid"
        stop = "end_turn"

        [[agents.trunk]]
        ral = ["reply done"]
        repeat = 2

        [[agents.kid]]
        ral = ["let good = spawn { sleep 0.2; 'found it' }; let bad = spawn { fail boom }"]

        [[agents.kid]]
        text = "Two searches are running."
        stop = "end_turn"

        [[agents.kid]]
        text = "One is in."
        stop = "end_turn"

        [[agents.kid]]
        ral = ["reply (await $good)"]
        """,
        interactive=False,
    )
    assert live.fleet.wait_empty(30)
    kid = live.fleet.agents["kid"]
    assert kid.outcome is not None and kid.outcome.value == "replied"
    assert kid.reply_value == "found it"
    events = live.events("kid")
    assert [e["nudge"] for e in events if e["kind"] == "nudge"] == []
    told = sorted(surfaces(events))
    assert len(told) == 2
    assert told[0].startswith("[worker w1-1 finished: done;") and "found it" in told[0]
    assert told[1].startswith("[worker w1-2 finished: failed;")
    assert "[error]\nworker w1-2 failed: " in told[1] and "boom" in told[1]


FLOOD = INBOX_SOURCE_CAP + 2


@pytest.mark.slow
def test_surfaced_results_beyond_the_inbox_quota_are_rejected_and_recorded(
    live_fleet: Callable[..., Live],
) -> None:
    # Every worker has settled before the turn ends (the script waits until `settled` is true
    # of each, which claims none), so the park surfaces all of them at once into an inbox whose
    # surface quota holds 64: the last two are refused and recorded, never dropped. They are
    # spawned in two halves, the second once the first has settled, so no more than half run
    # at once (a shell's live-worker cap).
    half = FLOOD // 2
    setup = (
        "let spawn_range = { |a, b| map { |i| spawn { $i } } (range $a $b) }; "
        "let rec wait = { |hs| if (gt (len (filter { |h| not (settled $h) } $hs)) 0) "
        "{ sleep 0.05; wait $hs } else { 'all settled' } }"
    )
    live = live_fleet(
        f"""
        [fleet]
        prompt = "flood"

        [[agents.trunk]]
        ral = [
          "{setup}",
          "wait (spawn_range 0 {half})",
          "wait (spawn_range {half} {FLOOD})",
        ]

        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"
        repeat = {FLOOD + 2}
        """,
        interactive=True,
    )

    def refused() -> list[dict[str, Any]]:
        return [r for r in live.kinds("InboxRejected") if r["source"] == "surface"]

    wait_for(lambda: len(refused()) >= FLOOD - INBOX_SOURCE_CAP, 30, "the refused surfaces")
    rejected = refused()
    assert len(rejected) == FLOOD - INBOX_SOURCE_CAP
    for r in rejected:
        assert r["reason"] == "inbox full" and r["cap"] == INBOX_SOURCE_CAP
        assert r["sender"].startswith("worker w3-"), "the last ones, surfaced after the quota"
        assert r["message"]["type"] == "Surface" and "finished: done" in r["message"]["batch"][0]
    live.wait_events(lambda ev: len(surfaces(ev)) >= INBOX_SOURCE_CAP, timeout=60)
    told = surfaces(live.events())
    assert refused() == rejected, "nothing else was refused"
    senders = {r["sender"].removeprefix("worker ") for r in rejected}
    heard = {t.split()[1] for t in told}
    assert len(told) == INBOX_SOURCE_CAP == len(heard)
    spawned = {f"w{call}-{n}" for call in (2, 3) for n in range(1, half + 1)}
    assert heard | senders == spawned, "each one accounted for"


def test_after_clear_a_worker_completion_from_before_it_is_dropped_and_recorded(
    live_fleet: Callable[..., Live],
) -> None:
    live = live_fleet(
        """
        [fleet]
        prompt = "start"

        [[agents.trunk]]
        ral = ["let h = spawn { sleep 60 }"]

        [[agents.trunk]]
        text = "The worker runs; I will hear of it."
        stop = "end_turn"
        """,
        interactive=True,
    )
    live.wait_idle(1)  # parked, the running worker watched
    live.steer("/clear")
    (stale,) = wait_for(
        lambda: [r for r in live.kinds("InboxRejected") if r["source"] == "surface"] or None,
        30,
        "the stale surface recorded",
    )
    assert stale["reason"] == "stale generation" and stale["sender"] == "worker w1-1"
    assert "was cancelled (clear)" in stale["message"]["batch"][0]
    live.wait_idle(2)
    assert surfaces(live.events()) == [], "no pre-clear worker output reaches the new context"


@pytest.mark.slow
def test_a_reaped_worker_stays_in_the_transcript_while_a_finished_one_is_surfaced(
    run_scenario: Callable[..., Run],
) -> None:
    # `stuck` runs untouched for 256 ral calls and is reaped (idle); `quick` finishes normally.
    # At the turn's end only quick's result reaches the model; the reap is a transcript Notice.
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let stuck = spawn { sleep 120 }"]

        [[agents.trunk]]
        ral = ["1", "1", "1", "1", "1", "1", "1", "1"]
        repeat = 32

        [[agents.trunk]]
        ral = ["let quick = spawn { 'quick result' }"]

        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"

        [[agents.trunk]]
        ral = ["reply (await $quick)"]
        repeat = 2
        """,
        timeout=120,
    )
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "quick result"
    (told,) = surfaces(run.events("trunk"))
    assert told.startswith("[worker w258-1 finished: done;") and "quick result" in told
    reaps = [n for n in run.kinds("transcript.jsonl", "Notice") if n["notice"] == "Reap"]
    assert [r["data"]["worker"] for r in reaps] == ["w1-1"]
    assert reaps[0]["data"]["reason"] == "idle"
    assert not any("w1-1" in str(e.get("text", "")) for e in run.events("trunk"))
