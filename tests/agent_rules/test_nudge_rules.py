"""The react rule set (runtime.fleet.nudge): table-driven cases and Hypothesis properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.fleet.nudge import (
    BUDGETS,
    CONTINUE_TEXT,
    MUST_REPLY_TEXT,
    SELF_VERIFY_TEXT,
    Nudge,
    NudgeDecision,
    NudgeInputs,
    NudgeKind,
    NudgeLatches,
    Outcome,
    ResidencyLatch,
    Verdict,
    classify,
    decide,
    pinned_reminder_text,
    waiting_matters,
)
from exarch_actors.runtime.shell.ledger import LargeBinding

K = NudgeKind
FRESH = NudgeLatches()


def kinds(d: NudgeDecision) -> list[NudgeKind]:
    return [n.kind for n in d.nudges]


# (id, inputs, expected verdict, expected nudge kinds)
CASES = [
    (
        "returning_end_turn_without_reply_is_told_to_reply",
        NudgeInputs(Outcome.END_TURN, returns=True),
        Verdict.CONTINUE_TURN,
        [K.MUST_REPLY],
    ),
    (
        "conversing_end_turn_with_nothing_pinned_just_ends",
        NudgeInputs(Outcome.END_TURN, returns=False),
        Verdict.END_TURN,
        [],
    ),
    (
        "truncation_asks_to_continue",
        NudgeInputs(Outcome.TRUNCATED, returns=False),
        Verdict.CONTINUE_TURN,
        [K.CONTINUE],
    ),
    (
        "truncation_of_a_returning_agent_asks_to_continue_not_to_reply",
        NudgeInputs(Outcome.TRUNCATED, returns=True),
        Verdict.CONTINUE_TURN,
        [K.CONTINUE],
    ),
    (
        "empty_reply_is_repaired",
        NudgeInputs(Outcome.EMPTY, returns=False),
        Verdict.CONTINUE_TURN,
        [K.EMPTY_REPAIR],
    ),
    (
        "early_stop_is_repaired",
        NudgeInputs(Outcome.EARLY_STOP, returns=True),
        Verdict.CONTINUE_TURN,
        [K.EMPTY_REPAIR],
    ),
    (
        "pinned_state_alone_is_reminded_for_a_conversing_agent",
        NudgeInputs(Outcome.END_TURN, returns=False, pins=("task: x",)),
        Verdict.CONTINUE_TURN,
        [K.PINNED_REMINDER],
    ),
    (
        "pinned_reminder_is_additive_with_must_reply",
        NudgeInputs(Outcome.END_TURN, returns=True, pins=("goal: y",)),
        Verdict.CONTINUE_TURN,
        [K.MUST_REPLY, K.PINNED_REMINDER],
    ),
    (
        "live_descendants_suspend_must_reply_and_pins",
        NudgeInputs(Outcome.END_TURN, returns=True, pins=("t: 1",), live_descendants=True),
        Verdict.SUSPENDED,
        [],
    ),
    (
        "live_descendants_suspend_even_truncation",
        NudgeInputs(Outcome.TRUNCATED, returns=False, live_descendants=True),
        Verdict.SUSPENDED,
        [],
    ),
    (
        "capped_matches_no_rule",
        NudgeInputs(Outcome.CAPPED, returns=True, pins=("t: 1",)),
        Verdict.END_TURN,
        [],
    ),
    (
        "cancelled_posts_nothing",
        NudgeInputs(Outcome.CANCELLED, returns=True, pins=("t: 1",)),
        Verdict.END_TURN,
        [],
    ),
    (
        "provider_error_posts_nothing",
        NudgeInputs(Outcome.PROVIDER_ERROR, returns=True, pins=("t: 1",)),
        Verdict.END_TURN,
        [],
    ),
    (
        "a_headless_trunks_first_reply_is_turned_back",
        NudgeInputs(Outcome.END_TURN, returns=True, replied=True, headless_trunk=True),
        Verdict.CONTINUE_TURN,
        [K.SELF_VERIFY],
    ),
    (
        "a_forked_childs_reply_is_honoured_at_once",
        NudgeInputs(Outcome.END_TURN, returns=True, replied=True, pins=("t: 1",)),
        Verdict.HONOUR_REPLY,
        [],
    ),
    (
        "a_headless_trunk_replying_with_live_children_waits_for_them",
        NudgeInputs(
            Outcome.END_TURN, returns=True, replied=True, headless_trunk=True, live_descendants=True
        ),
        Verdict.SUSPENDED,
        [],
    ),
]


@pytest.mark.parametrize(
    ("inputs", "verdict", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_table(inputs: NudgeInputs, verdict: Verdict, expected: list[NudgeKind]) -> None:
    d = decide(inputs, FRESH)
    assert d.verdict is verdict
    assert kinds(d) == expected


def test_the_self_verify_latch_honours_the_second_reply() -> None:
    inp = NudgeInputs(Outcome.END_TURN, returns=True, replied=True, headless_trunk=True)
    first = decide(inp, FRESH)
    assert first.nudges == (Nudge(K.SELF_VERIFY, SELF_VERIFY_TEXT),)
    second = decide(inp, first.latches.after_self_nudge())
    assert second.verdict is Verdict.HONOUR_REPLY and second.nudges == ()


def test_the_self_verify_latch_survives_a_genuine_turn_boundary() -> None:
    inp = NudgeInputs(Outcome.END_TURN, returns=True, replied=True, headless_trunk=True)
    latches = decide(inp, FRESH).latches.at_turn_boundary()
    assert decide(inp, latches).verdict is Verdict.HONOUR_REPLY


def test_suspended_self_verify_fires_when_the_children_settle() -> None:
    waiting = NudgeInputs(
        Outcome.END_TURN, returns=True, replied=True, headless_trunk=True, live_descendants=True
    )
    d = decide(waiting, FRESH)
    assert d.verdict is Verdict.SUSPENDED and not d.latches.self_verified
    settled = NudgeInputs(Outcome.END_TURN, returns=True, replied=True, headless_trunk=True)
    assert kinds(decide(settled, d.latches)) == [K.SELF_VERIFY]


def test_rules_resume_against_the_pin_register_live_when_children_settle() -> None:
    before = NudgeInputs(Outcome.END_TURN, returns=True, pins=("a: 1",), live_descendants=True)
    d = decide(before, FRESH)
    assert d.verdict is Verdict.SUSPENDED
    # a pin was added and the first removed while the agent waited: the reminder names the live one
    after = NudgeInputs(Outcome.END_TURN, returns=True, pins=("b: 2",))
    resumed = decide(after, d.latches)
    assert kinds(resumed) == [K.MUST_REPLY, K.PINNED_REMINDER]
    assert "b: 2" in resumed.nudges[1].text and "a: 1" not in resumed.nudges[1].text


def test_must_reply_stops_after_its_budget_and_the_turn_ends() -> None:
    inp = NudgeInputs(Outcome.END_TURN, returns=True)
    latches = FRESH
    for _ in range(BUDGETS[K.MUST_REPLY]):
        d = decide(inp, latches)
        assert d.nudges == (Nudge(K.MUST_REPLY, MUST_REPLY_TEXT),)
        latches = d.latches.after_self_nudge()
    d = decide(inp, latches)
    assert d.verdict is Verdict.END_TURN and d.nudges == ()


def test_a_genuine_turn_boundary_refills_the_budget_but_a_self_nudge_does_not() -> None:
    inp = NudgeInputs(Outcome.END_TURN, returns=True)
    latches = FRESH
    for _ in range(BUDGETS[K.MUST_REPLY]):
        latches = decide(inp, latches).latches
    assert decide(inp, latches.after_self_nudge()).nudges == ()
    assert kinds(decide(inp, latches.at_turn_boundary())) == [K.MUST_REPLY]


def test_the_pinned_reminder_is_budget_free_while_anything_is_pinned() -> None:
    inp = NudgeInputs(Outcome.END_TURN, returns=True, pins=("task: t",))
    latches = FRESH
    for _ in range(50):
        d = decide(inp, latches)
        assert K.PINNED_REMINDER in kinds(d)
        latches = d.latches
    assert kinds(d) == [K.PINNED_REMINDER]  # must_reply's budget is long spent; pins still remind


def test_spent_continue_budget_falls_through_to_must_reply() -> None:
    inp = NudgeInputs(Outcome.TRUNCATED, returns=True)
    latches = FRESH
    for _ in range(BUDGETS[K.CONTINUE]):
        d = decide(inp, latches)
        assert d.nudges == (Nudge(K.CONTINUE, CONTINUE_TEXT),)
        latches = d.latches
    assert kinds(decide(inp, latches)) == [K.MUST_REPLY]


def test_the_pinned_reminder_is_uniform_for_every_pin_kind() -> None:
    a = pinned_reminder_text(("task: write tests",))
    b = pinned_reminder_text(("goal: write tests",))
    assert a.replace("task", "goal") == b
    assert "unpin KEY" in a


def test_classify_maps_stop_reasons_to_outcomes() -> None:
    assert classify("end_turn", has_tool_calls=False, empty=False) is Outcome.END_TURN
    assert classify("max_tokens", has_tool_calls=False, empty=False) is Outcome.TRUNCATED
    assert classify("max_tokens", has_tool_calls=False, empty=True) is Outcome.TRUNCATED
    assert classify("end_turn", has_tool_calls=False, empty=True) is Outcome.EMPTY
    assert classify("stop_sequence", has_tool_calls=False, empty=False) is Outcome.EARLY_STOP


# --- properties -------------------------------------------------------------------------------

inputs_st = st.builds(
    NudgeInputs,
    outcome=st.sampled_from(list(Outcome)),
    returns=st.booleans(),
    replied=st.booleans(),
    pins=st.lists(st.text(min_size=1, max_size=8), max_size=3).map(tuple),
    live_descendants=st.booleans(),
    live_workers=st.booleans(),
    headless_trunk=st.booleans(),
)
latches_st = st.builds(
    NudgeLatches,
    fired=st.dictionaries(st.sampled_from(list(NudgeKind)), st.integers(0, 6)),
    self_verified=st.booleans(),
)


@given(inputs_st, latches_st)
def test_no_nudge_is_ever_posted_while_descendants_or_workers_live(
    i: NudgeInputs, lt: NudgeLatches
) -> None:
    if i.live_descendants or i.live_workers:
        d = decide(i, lt)
        assert d.nudges == ()
        assert d.latches == lt


def _matters(i: NudgeInputs, lt: NudgeLatches) -> bool:
    return waiting_matters(
        i.outcome, lt, replied=i.replied, returns=i.returns, headless_trunk=i.headless_trunk
    )


@given(inputs_st, latches_st)
def test_what_is_still_running_changes_no_decision_where_waiting_does_not_matter(
    i: NudgeInputs, lt: NudgeLatches
) -> None:
    if not _matters(i, lt):
        decisions = [
            decide(replace(i, live_descendants=d, live_workers=w), lt)
            for d in (False, True)
            for w in (False, True)
        ]
        assert all(d == decisions[0] for d in decisions)


@given(inputs_st, latches_st)
def test_waiting_matters_exactly_where_a_live_child_would_suspend_the_agent(
    i: NudgeInputs, lt: NudgeLatches
) -> None:
    suspended = decide(replace(i, live_descendants=True), lt).verdict is Verdict.SUSPENDED
    assert _matters(i, lt) == suspended


def test_a_returning_childs_honoured_reply_needs_no_read_of_what_still_runs() -> None:
    assert not waiting_matters(
        Outcome.END_TURN, FRESH, replied=True, returns=True, headless_trunk=False
    )
    assert waiting_matters(
        Outcome.END_TURN, FRESH, replied=False, returns=True, headless_trunk=False
    )


@given(inputs_st, latches_st)
def test_capped_cancelled_and_provider_errors_are_never_nudged(
    i: NudgeInputs, lt: NudgeLatches
) -> None:
    if i.outcome in (Outcome.CAPPED, Outcome.CANCELLED, Outcome.PROVIDER_ERROR):
        assert decide(i, lt).nudges == ()


@given(inputs_st, latches_st)
def test_verdict_and_nudges_agree(i: NudgeInputs, lt: NudgeLatches) -> None:
    d = decide(i, lt)
    assert (d.verdict is Verdict.CONTINUE_TURN) == bool(d.nudges)
    assert len(set(kinds(d))) == len(d.nudges)
    for n in d.nudges:
        assert d.latches.count(n.kind) == lt.count(n.kind) + 1


@given(inputs_st, latches_st)
def test_must_reply_only_for_returning_agents_and_pins_remind_iff_pinned(
    i: NudgeInputs, lt: NudgeLatches
) -> None:
    d = decide(i, lt)
    if K.MUST_REPLY in kinds(d):
        assert i.returns and not i.replied
    if K.PINNED_REMINDER in kinds(d):
        assert i.pins
    if (
        i.pins
        and not i.live_descendants
        and not i.live_workers
        and not i.replied
        and i.outcome not in (Outcome.CAPPED, Outcome.CANCELLED, Outcome.PROVIDER_ERROR)
    ):
        assert K.PINNED_REMINDER in kinds(d)


@given(inputs_st, latches_st)
def test_self_verify_turns_back_only_a_headless_trunks_first_reply(
    i: NudgeInputs, lt: NudgeLatches
) -> None:
    d = decide(i, lt)
    if K.SELF_VERIFY in kinds(d):
        assert i.headless_trunk and i.replied and not lt.self_verified
        assert d.latches.self_verified
    if i.replied and lt.self_verified and i.outcome not in (Outcome.CAPPED,):
        assert d.verdict is Verdict.HONOUR_REPLY


@given(latches_st)
def test_turn_boundary_resets_counts_and_self_nudge_resets_nothing(lt: NudgeLatches) -> None:
    assert lt.after_self_nudge() == lt
    b = lt.at_turn_boundary()
    assert all(b.count(k) == 0 for k in NudgeKind)
    assert b.self_verified == lt.self_verified


def test_running_workers_suspend_must_reply_like_live_descendants() -> None:
    alone = decide(NudgeInputs(Outcome.END_TURN, returns=True), FRESH)
    assert alone.verdict is Verdict.CONTINUE_TURN and kinds(alone) == [K.MUST_REPLY]
    waiting = decide(NudgeInputs(Outcome.END_TURN, returns=True, live_workers=True), FRESH)
    assert waiting.verdict is Verdict.SUSPENDED and waiting.nudges == ()
    assert waiting.latches == FRESH, "a suspension spends no budget"


def test_a_headless_trunks_self_verify_waits_for_its_running_workers() -> None:
    i = NudgeInputs(
        Outcome.END_TURN, returns=True, replied=True, headless_trunk=True, live_workers=True
    )
    assert decide(i, FRESH).verdict is Verdict.SUSPENDED
    done = NudgeInputs(Outcome.END_TURN, returns=True, replied=True, headless_trunk=True)
    later = decide(done, FRESH)
    assert kinds(later) == [K.SELF_VERIFY]


# --- the residency nudge ----------------------------------------------------------------------

LIMIT = 1 << 20


def big(name: str, size: int = LIMIT + 1) -> LargeBinding:
    return LargeBinding(name, size, LIMIT)


def test_a_binding_over_the_limit_is_nudged_once_per_excursion() -> None:
    latch = ResidencyLatch()
    latch, first = latch.after_run([big("blob")], ["blob"])
    assert [n.kind for n in first] == [K.RESIDENCY]
    assert "`blob`" in first[0].text and str(LIMIT + 1) in first[0].text
    assert "file path" in first[0].text
    latch, again = latch.after_run([big("blob", LIMIT * 2)], ["blob"])
    assert again == (), "rewritten over the limit: the same excursion"
    latch, quiet = latch.after_run([], ["other"])
    assert quiet == () and latch.latched == {"blob"}, "other writes do not end it"
    latch, small = latch.after_run([], ["blob"])
    assert small == () and latch.latched == frozenset(), "back under the limit: it ends"
    latch, second = latch.after_run([big("blob")], ["blob"])
    assert [n.kind for n in second] == [K.RESIDENCY], "a new excursion is nudged again"


def test_a_pruned_large_binding_ends_its_excursion() -> None:
    latch, _ = ResidencyLatch().after_run([big("blob")], ["blob"])
    latch, none = latch.after_run([], [], gone=["blob"])
    assert none == () and not latch.latched
    _, again = latch.after_run([big("blob")], ["blob"])
    assert len(again) == 1


def test_two_large_bindings_in_one_run_are_two_nudges_in_write_order() -> None:
    _, nudges = ResidencyLatch().after_run([big("b"), big("a"), big("b")], ["b", "a"])
    assert [n.text.split("`")[1] for n in nudges] == ["b", "a"]


runs_st = st.lists(
    st.tuples(
        st.sampled_from(["x", "y"]),
        st.sampled_from(["large", "small", "gone"]),
    ),
    max_size=30,
)


@given(runs_st)
def test_residency_nudges_equal_the_excursions_above_the_limit(runs: list[tuple[str, str]]) -> None:
    # reference model: a name is nudged each time it goes from "not large" to "large"
    latch = ResidencyLatch()
    got: list[str] = []
    state = {"x": False, "y": False}
    expected: list[str] = []
    for name, what in runs:
        if what == "large":
            latch, nudges = latch.after_run([big(name)], [name])
            if not state[name]:
                expected.append(name)
            state[name] = True
        elif what == "small":
            latch, nudges = latch.after_run([], [name])
            state[name] = False
        else:
            latch, nudges = latch.after_run([], [], gone=[name])
            state[name] = False
        got.extend(n.text.split("`")[1] for n in nudges)
    assert got == expected
