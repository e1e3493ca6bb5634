"""The fan-in rules (``runtime/fleet/fanin.py``) on their own: where each child's end goes, what
a wait answers and when, and when a refusal leaves a reply held."""

from __future__ import annotations

import pytest

from exarch_actors.runtime.fleet.fanin import (
    ChildEnd,
    FanIn,
    NotAChild,
    WaitAnswer,
    held_notice,
    is_held_notice,
)


def replied(child: str, value: int) -> ChildEnd:
    return ChildEnd(child, "replied", value)


def fan(*children: str) -> FanIn:
    f = FanIn()
    for c in children:
        f.spawned("p", c)
    return f


def test_an_end_with_no_wait_pending_on_it_is_delivered_to_the_inbox() -> None:
    f = fan("a")
    inbox: list[ChildEnd] = []
    assert f.settle("p", replied("a", 1), inbox.append) is None
    assert inbox == [replied("a", 1)]


def test_an_end_a_wait_is_pending_on_goes_to_the_wait_and_never_to_the_inbox() -> None:
    f = fan("a", "b")
    inbox: list[ChildEnd] = []
    answers: list[WaitAnswer] = []
    assert f.begin_wait("p", "w", None, answers.append) is None
    assert f.settle("p", replied("a", 1), inbox.append) is None  # b still runs
    done = f.settle("p", replied("b", 2), inbox.append)
    assert done is not None and answers == []
    done()
    assert inbox == []
    assert answers == [WaitAnswer((replied("a", 1), replied("b", 2)), (), 0)]


def test_a_wait_on_ends_already_delivered_or_held_answers_at_once_and_collects_them() -> None:
    f = fan("a", "b")
    inbox: list[ChildEnd] = []
    f.settle("p", replied("a", 1), inbox.append)
    f.settle("p", replied("b", 2), inbox.append)
    assert f.held("p", "b")  # the inbox refused b's result
    answer = f.begin_wait("p", "w", None, lambda _: None)
    assert answer == WaitAnswer((replied("a", 1), replied("b", 2)), (), 0)
    assert f.begin_wait("p", "w2", None, lambda _: None) == WaitAnswer((), (), 0)  # collected


def test_a_refusal_of_a_result_a_wait_already_took_holds_nothing() -> None:
    f = fan("a")
    f.settle("p", replied("a", 1), lambda _: None)
    f.begin_wait("p", "w", ["a"], lambda _: None)
    assert not f.held("p", "a")
    assert f.held_names("p") == []


def test_a_timed_out_wait_answers_what_settled_and_names_the_rest_running() -> None:
    f = fan("a", "b")
    f.begin_wait("p", "w", None, lambda _: None)
    f.settle("p", replied("a", 1), lambda _: None)
    assert f.stop_wait("p", "w", None) == WaitAnswer((replied("a", 1),), ("b",), 0)
    inbox: list[ChildEnd] = []
    f.settle("p", replied("b", 2), inbox.append)  # no wait any more: to the inbox
    assert inbox == [replied("b", 2)]


def test_a_withdrawn_wait_gives_back_what_it_collected_to_the_inbox() -> None:
    f = fan("a", "b")
    inbox: list[ChildEnd] = []
    f.begin_wait("p", "w", None, lambda _: None)
    f.settle("p", replied("a", 1), inbox.append)
    assert inbox == []
    assert f.stop_wait("p", "w", inbox.append) is None
    assert inbox == [replied("a", 1)]
    assert f.stop_wait("p", "w", inbox.append) is None  # once


def test_naming_a_stranger_is_refused_by_name() -> None:
    f = fan("a")
    with pytest.raises(NotAChild, match="'x' is not a child of p"):
        f.begin_wait("p", "w", ["a", "x"], lambda _: None)
    with pytest.raises(NotAChild):
        f.read("p", "x")


def test_a_read_of_a_running_child_is_none_and_of_a_settled_one_collects_it() -> None:
    f = fan("a")
    assert f.read("p", "a") is None
    f.settle("p", replied("a", 1), lambda _: None)
    assert f.held("p", "a")
    assert f.read("p", "a") == replied("a", 1)
    assert f.held_names("p") == []


def test_the_held_notice_is_one_idempotent_wakeup_that_counts_and_names_them() -> None:
    notice = held_notice([f"c-{i}" for i in range(25)])
    assert is_held_notice(notice)
    assert notice.prompt.startswith("25 replies from your children were held back")
    assert "c-19 and 5 more" in notice.prompt
    assert held_notice(["a"]).prompt.startswith("1 reply from your children was held back")
