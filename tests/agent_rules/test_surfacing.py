"""Which worker completions are surfaced to their agent, and when (runtime.shell.surfacing)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.constants import VALUE_CAP
from exarch_actors.runtime.shell.surfacing import SurfaceRule, surface_text


def test_a_park_watches_running_workers_and_the_agent_waits_for_them() -> None:
    rule = SurfaceRule()
    parked = rule.park(running=["w1-1", "w1-2"], settled=[], stamp=3)
    assert parked.now == () and parked.watched == ("w1-1", "w1-2") and parked.waits
    assert rule.waiting and rule.stamp == 3
    assert rule.settled("w1-1") is True, "parked: surfaced the moment it settles"
    assert rule.waiting
    assert rule.settled("w1-2") is True
    assert not rule.waiting


def test_a_park_surfaces_at_once_what_settled_unclaimed_during_the_turn() -> None:
    rule = SurfaceRule()
    parked = rule.park(running=[], settled=["w2-1"], stamp=0)
    assert parked.now == ("w2-1",) and parked.waits and not rule.waiting
    again = rule.park(running=[], settled=["w2-1"], stamp=0)
    assert again.now == () and not again.waits, "a result is surfaced once"


def test_a_completion_during_a_model_turn_waits_for_the_next_park() -> None:
    rule = SurfaceRule()
    rule.park(running=["w1-1", "w1-2"], settled=[], stamp=0)
    rule.unpark()
    assert rule.settled("w1-1") is False, "the running turn may still await it"
    assert rule.settled("w1-2") is False
    # w1-2 was claimed by await meanwhile (gone from the registry); w1-1 was not
    parked = rule.park(running=[], settled=["w1-1"], stamp=0)
    assert parked.now == ("w1-1",)


def test_cancelled_or_reaped_workers_are_never_surfaced() -> None:
    rule = SurfaceRule()
    rule.park(running=["w1-1", "w1-2"], settled=[], stamp=0)
    rule.dismiss("w1-1")  # the model cancelled it
    assert rule.settled("w1-1") is False
    rule.unpark()
    rule.dismiss("w1-2")  # reaped by policy: its notice stays in the transcript
    assert rule.park(running=[], settled=["w1-1", "w1-2"], stamp=0).now == ()
    assert not rule.pending(running=[], settled=["w1-1", "w1-2"])


def test_pending_reads_without_changing_anything() -> None:
    rule = SurfaceRule()
    assert rule.pending(running=["w1-1"], settled=[])
    assert rule.pending(running=[], settled=["w1-1"])
    assert not rule.pending(running=[], settled=[])
    assert not rule.waiting and not rule.parked
    assert rule.park(running=[], settled=["w1-1"], stamp=0).now == ("w1-1",)


def test_reset_forgets_everything_watched() -> None:
    rule = SurfaceRule()
    rule.park(running=["w1-1"], settled=[], stamp=0)
    rule.reset()
    assert not rule.waiting and rule.settled("w1-1") is False


def test_the_surface_text_digests_a_value_under_the_value_cap() -> None:
    text = surface_text("w3-1", value="x" * (VALUE_CAP * 3), error=None, stdout="hi\n")
    head, body = text.split("\n", 1)
    assert head.startswith("[worker w3-1 finished: done;") and "await" in head
    assert body.startswith("[value]\n") and "bytes elided from the middle" in body
    assert "[stdout]\nhi\n" in body
    assert len(body.encode()) < VALUE_CAP + 200


def test_the_surface_text_of_a_failed_worker_carries_its_error() -> None:
    text = surface_text("w3-2", value=None, error="worker w3-2 failed: 1:1 boom")
    assert text.startswith("[worker w3-2 finished: failed;")
    assert "[error]\nworker w3-2 failed: 1:1 boom" in text


events_st = st.lists(
    st.one_of(
        st.tuples(st.just("spawn"), st.integers(0, 5)),
        st.tuples(st.just("settle"), st.integers(0, 5)),
        st.tuples(st.just("claim"), st.integers(0, 5)),
        st.tuples(st.just("dismiss"), st.integers(0, 5)),
        st.tuples(st.just("park"), st.just(0)),
        st.tuples(st.just("unpark"), st.just(0)),
    ),
    max_size=40,
)


@given(events_st)
def test_no_worker_is_surfaced_twice_and_none_claimed_or_dismissed_is_surfaced(
    events: list[tuple[str, int]],
) -> None:
    """A model of the shell's registry drives the rule; every surface is checked against it."""
    rule = SurfaceRule()
    running: set[str] = set()
    settled: set[str] = set()  # settled and unclaimed: still in the registry
    dismissed: set[str] = set()
    surfaced: set[str] = set()
    spawned = 0

    def check(wid: str) -> None:
        assert wid in settled, f"{wid} surfaced but not a settled, unclaimed result"
        assert wid not in dismissed, f"{wid} surfaced after it was dismissed"
        assert wid not in surfaced, f"{wid} surfaced twice"
        surfaced.add(wid)

    for op, n in events:
        if op == "spawn" and not rule.parked:  # spawns happen only in runs, mid-turn
            spawned += 1
            running.add(f"s{spawned}")
        elif op == "settle" and running:
            wid = sorted(running)[n % len(running)]
            running.discard(wid)
            settled.add(wid)
            if rule.settled(wid):
                check(wid)
        elif op == "claim" and settled and not rule.parked:  # await runs mid-turn
            settled.discard(sorted(settled)[n % len(settled)])
        elif op == "dismiss" and (running | settled):
            wid = sorted(running | settled)[n % len(running | settled)]
            rule.dismiss(wid)
            dismissed.add(wid)
        elif op == "park":
            for wid in rule.park(sorted(running), sorted(settled), stamp=0).now:
                check(wid)
        elif op == "unpark":
            rule.unpark()
    if rule.parked:  # parked: every unclaimed, undismissed result has been told
        assert (settled - dismissed) <= surfaced
