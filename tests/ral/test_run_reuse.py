"""A session run reuses the last run's cancel scope and Interp only while that scope stands.

The rule (runtime/ral/session.py's invariants): a cancelled scope is never reused, a cancel
reaches only the run in flight, and every per-run field of the Interp starts afresh. So a
cancel that lands anywhere in a run stops that run and no later one, and a reused Interp
answers exactly as a new one would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.ral.session import RunResult, Session
from exarch_actors.runtime.ral.values import render

NAMES = ["a", "b", "c", "d"]
SCRIPT = "; ".join(f"let {n} = {i}" for i, n in enumerate(NAMES, 1)) + "; 0"
"""Every ``let`` is followed by a phrase, whose start is a poll point."""


def _clean(r: RunResult) -> bool:
    return r.error is None


@pytest.fixture
def session() -> Iterator[Session]:
    s = Session(faults=False)
    try:
        yield s
    finally:
        s.close()


def _cancel_while_showing(session: Session, reason: str) -> Callable[[Any], str]:
    """A ``show`` that cancels ``session`` as the run renders its value: after the run's last
    poll point, before it ends."""

    def show(value: Any) -> str:
        session.cancel(reason)
        return render(value)

    return show


@pytest.mark.parametrize("k", range(1, len(NAMES) + 1))
def test_a_cancel_at_any_define_of_a_run_stops_that_run_and_not_the_next(k: int) -> None:
    """The cancel lands at the k-th top-level ``let`` (the define chokepoint, inside the run's
    scope): the names up to it are bound, none after, and the next run is untouched -- on a
    session whose previous run was clean, so the cancelled scope is a reused one."""
    session: Session

    def hook(name: str, value: Any) -> None:
        if name == NAMES[k - 1]:
            session.cancel("esc")

    session = Session(faults=False, define_hook=hook)
    try:
        assert _clean(session.run("1"))  # the next run reuses this one's scope
        r = session.run(SCRIPT)
        assert r.error is not None and r.error.kind == "cancelled"
        assert [n for n in NAMES if n in session.bindings()] == NAMES[:k]
        after = session.run("add 1 1")
        assert _clean(after) and after.value == 2
        again = session.run("add 2 2")  # and the scope it got is reused in turn
        assert _clean(again) and again.value == 4
    finally:
        session.close()


def test_a_cancel_landing_after_a_runs_last_phrase_is_not_carried_into_the_next_run(
    session: Session,
) -> None:
    """Tripped while the run renders its value -- after its last poll point, before it ends --
    the scope is spent: the next run gets a new one instead of starting cancelled."""
    session.run("1")
    session.run("2", show=_cancel_while_showing(session, "late"))
    r = session.run("add 1 2")
    assert _clean(r) and r.value == 3


def test_a_cancel_landing_as_a_failed_run_ends_is_not_carried_into_the_next_run(
    session: Session,
) -> None:
    """A failed run renders its (unit) value after its scope is judged reusable; a cancel that
    lands there still spends the scope, and the next run sees that and takes a new one."""
    session.run("1")
    failed = session.run("fail boom", show=_cancel_while_showing(session, "late"))
    assert failed.error is not None and failed.error.kind == "runtime"
    r = session.run("add 1 2")
    assert _clean(r) and r.value == 3


def test_a_cancel_between_runs_reaches_no_run_even_with_a_reusable_scope(session: Session) -> None:
    assert _clean(session.run("1"))
    session.cancel("between")  # no run in flight: nothing to trip
    r = session.run("add 1 1")
    assert _clean(r) and r.value == 2


def test_a_cancelled_run_leaves_no_stop_flag_on_the_interp_the_next_run_uses(
    session: Session,
) -> None:
    session.run("1")
    first = session._interp
    session.run("let x = 1", show=_cancel_while_showing(session, "x"))
    session.run("1")
    assert session._interp is not first  # the spent one was dropped
    assert session._interp is not None and not session._interp.stop


_STEPS = st.sampled_from(
    [
        "echo hi",
        "echo a b; echo c",
        "let x = add 1 2",
        "let y = 5; echo $y",
        "fail boom",
        "nosuchname_zz",
        "1",
        "[1, 2, 3]",
        "let f = { |n| echo $n; add $n 1 }; f 3",
        "(",
    ]
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_STEPS, min_size=1, max_size=10))
def test_a_reused_interp_answers_every_run_as_a_new_one_would(steps: list[str]) -> None:
    """Output, errors, referenced and defined names, the value and its display: nothing of
    one run shows in the next."""
    reused, fresh = Session(faults=False), Session(faults=False)
    try:
        for src in steps:
            fresh._interp = None  # a new scope and Interp for every run
            got, want = reused.run(src, show=render), fresh.run(src, show=render)
            assert got == want
    finally:
        reused.close()
        fresh.close()


def test_a_run_that_escaped_with_an_internal_error_leaves_nothing_in_the_next_runs_output() -> None:
    """``fault panic`` escapes ``Session.run`` (the host's panic) after the run wrote output;
    a session used again after it (the REPL) starts the next run with none of it."""
    session = Session(faults=True)
    try:
        assert _clean(session.run("1"))
        with pytest.raises(Exception, match="panic"):
            session.run("echo stale; let s = 1; fault panic")
        r = session.run("echo fresh")
        assert _clean(r) and r.stdout == "fresh\n" and r.defined == ()
    finally:
        session.close()
