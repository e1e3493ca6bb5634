"""Cancellation: a cancelled run stops, kills its programs and reports `cancelled`.

The 100 ms bound of docs/language.md is a latency figure: ``benchmarks/cancel_latency.py`` measures
it
(docs/benchmarks.md); these tests assert the behaviour, with ``HANG_GUARD`` only against hangs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.ral import natives
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.interp import Interp
from exarch_actors.runtime.ral.natives import MAX_RANGE
from exarch_actors.runtime.ral.session import RunResult, Session
from tests.support.waiting import HANG_GUARD
from tests.support.waiting import wait_for as _wait_for


def _start(session: Session, src: str) -> tuple[threading.Thread, list[RunResult]]:
    out: list[RunResult] = []
    t = threading.Thread(target=lambda: out.append(session.run(src)), daemon=True)
    t.start()
    return t, out


def _stopped(t: threading.Thread) -> bool:
    """Whether the run's thread returned (a hang guard, not a latency claim)."""
    t.join(HANG_GUARD)
    return not t.is_alive()


def _reached(tmp_path: Path) -> tuple[str, Callable[[], bool]]:
    """A ral phrase that creates a marker file, and the condition that it has run: the run is
    past the phrase before it (no fixed sleep guesses how long that takes)."""
    marker = tmp_path / "reached"
    return f"/usr/bin/touch '{marker}'", marker.exists


def _sleep_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "sleep"]


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE  # killed; its new parent has yet to reap it
    except psutil.NoSuchProcess:
        return True


def test_cancelling_a_running_sleep_stops_it_before_the_next_phrase(
    session: Session, tmp_path: Path
) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(session, f"echo before; {touch}; sleep 10; echo after")
    _wait_for(reached)
    session.cancel()
    assert _stopped(t)
    r = out[0]
    assert r.error is not None and r.error.kind == "cancelled" and r.error.message == "cancelled"
    assert r.stdout == "before\n"


def test_cancelling_a_running_program_kills_it_and_reports_cancelled(session: Session) -> None:
    t, out = _start(session, "/bin/sleep 10")
    _wait_for(lambda: len(_sleep_children()) == 1)
    child = _sleep_children()[0]
    session.cancel()
    assert _stopped(t)
    assert out[0].error is not None and out[0].error.kind == "cancelled"
    assert _gone(child)
    assert _sleep_children() == []


def test_cancelling_kills_the_programs_whole_process_group(session: Session) -> None:
    t, out = _start(session, "sh -c '/bin/sleep 10 & /bin/sleep 10; wait'")
    _wait_for(lambda: len(_sleep_children()) == 2)
    kids = _sleep_children()
    session.cancel()
    assert _stopped(t)
    _wait_for(lambda: all(_gone(k) for k in kids), HANG_GUARD, "every program of the group gone")
    assert out[0].error is not None and out[0].error.kind == "cancelled"


def test_cancelling_a_busy_loop_stops_it_mid_loop(session: Session, tmp_path: Path) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(
        # the range is built before the signal: building 10 M items is one native call (~0.3 s)
        # with no poll point inside, which is not what this test measures
        session,
        f"let n = 0; let xs = range 10000000; {touch}; for i in $xs {{ let n = add $n 1 }}",
    )
    _wait_for(reached)
    session.cancel()
    assert _stopped(t)
    assert out[0].error is not None and out[0].error.kind == "cancelled"


def test_cancellation_is_not_catchable_by_try(session: Session, tmp_path: Path) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(session, f"try {{ {touch}; sleep 10 }} catch e {{ 'caught' }}")
    _wait_for(reached)  # the cancel lands inside the try
    session.cancel()
    assert _stopped(t)
    assert out[0].error is not None and out[0].error.kind == "cancelled"
    assert out[0].value != "caught"


def test_cancelling_while_awaiting_a_worker_stops_the_await(
    session: Session, tmp_path: Path
) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(session, f"let h = spawn {{ sleep 10 }}; {touch}; await $h")
    _wait_for(lambda: reached() and "h" in session.session_names())
    session.cancel()
    assert _stopped(t)
    assert out[0].error is not None and out[0].error.kind == "cancelled"
    assert session.run("cancel $h; 1").value == 1


def test_the_session_is_usable_after_a_cancelled_run(session: Session) -> None:
    t, _ = _start(session, "sleep 10")
    _wait_for(lambda: session._run_scope is not None)
    session.cancel()
    assert _stopped(t)
    assert session.run("add 1 1").value == 2


def test_cancel_between_runs_does_not_poison_the_next_run(session: Session) -> None:
    session.cancel()
    assert session.run("add 2 2").value == 4


def test_cancelling_the_root_scope_cancels_running_workers() -> None:
    root = CancelScope()
    s = Session(root_scope=root, faults=False)
    try:
        assert s.run("let h = spawn { sleep 10 }").error is None
        root.cancel()
        # the root is gone, so new runs are cancelled at once; the worker settled as cancelled
        r = s.run("1")
        assert r.error is not None and r.error.kind == "cancelled"
        workers = s.workers
        _wait_for(lambda: workers.running() == [], HANG_GUARD)  # type: ignore[attr-defined]
    finally:
        s.close()


def test_fault_hang_blocks_until_cancelled(tmp_path: Path) -> None:
    s = Session(faults=True)
    try:
        touch, reached = _reached(tmp_path)
        t, out = _start(s, f"{touch}; fault hang")
        _wait_for(reached)
        s.cancel()
        assert _stopped(t)
        assert out[0].error is not None and out[0].error.kind == "cancelled"
    finally:
        s.close()


def test_a_worker_spawned_by_a_worker_outlives_its_parent(session: Session) -> None:
    r = session.run(
        "let outer = spawn { spawn { sleep 0.05; 'inner done' } }; let h = await $outer"
    )
    assert r.error is None
    assert session.run("await $h").value == "inner done"


def test_finished_runs_do_not_accumulate_under_the_root_scope(session: Session) -> None:
    for _ in range(50):
        session.run("add 1 2")
    session.run("1")
    assert len(session.root_scope._children) <= 2


def test_building_a_ten_million_item_range_stops_at_a_cancel() -> None:
    """``range`` polls while it builds: a cancel landing in ``for i in (range 10000000)`` is not
    held up by the whole list being built first (which took over a second under load)."""
    scope = CancelScope()
    scope.cancel("mid-range")
    it = Interp(ctx=DynamicContext(), scope=scope, sigma={})
    with pytest.raises(Cancelled, match="mid-range"):
        natives._range(it, [MAX_RANGE])
    live = Interp(ctx=DynamicContext(), scope=CancelScope(), sigma={})
    assert natives._range(live, [3, 200_003, 2]) == list(range(3, 200_003, 2))  # chunked


def test_a_wait_begun_before_an_ancestor_is_cancelled_wakes_at_the_cancel() -> None:
    root = CancelScope()
    leaf = root.child().child()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(leaf.wait(HANG_GUARD)))
    waiter.start()
    _wait_for(lambda: leaf._event is not None)  # the waiter made the Event and blocks on it
    root.cancel("stop")
    waiter.join(HANG_GUARD)
    assert woke == [True] and leaf.reason == "stop"


def test_a_wait_on_a_scope_cancelled_before_anyone_waited_returns_at_once() -> None:
    scope = CancelScope()
    scope.cancel("early")
    assert scope._event is None  # nothing waited: no Event was made
    assert scope.wait(HANG_GUARD) is True


def test_a_cancelled_scope_stays_cancelled_and_a_fresh_child_takes_its_place() -> None:
    token = CancelScope()
    turn = token.child()
    turn.cancel("interrupt")
    assert turn.wait(0) and not token.cancelled
    assert not hasattr(turn, "reset")  # no way back: a cancelled scope stays cancelled
    turn.detach()
    fresh = token.child()
    assert turn.cancelled and turn.reason == "interrupt" and not fresh.cancelled
    token.cancel("close")
    assert fresh.cancelled and fresh.reason == "close"
    assert turn.reason == "interrupt"  # its first cause stands
