"""Cancellation: a cancelled run stops within 100 ms, kills its programs and reports `cancelled`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from runtime.cancel import CancelScope
from runtime.ral.session import RunResult, Session
from tests.support.waiting import wait_for as _wait_for


def _start(session: Session, src: str) -> tuple[threading.Thread, list[RunResult]]:
    out: list[RunResult] = []
    t = threading.Thread(target=lambda: out.append(session.run(src)), daemon=True)
    t.start()
    return t, out


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


def test_cancelling_a_running_sleep_stops_it_within_100ms(session: Session, tmp_path: Path) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(session, f"echo before; {touch}; sleep 10; echo after")
    _wait_for(reached)
    t0 = time.monotonic()
    session.cancel()
    t.join(2)
    elapsed = time.monotonic() - t0
    assert elapsed < 0.1, elapsed
    r = out[0]
    assert r.error is not None and r.error.kind == "cancelled" and r.error.message == "cancelled"
    assert r.stdout == "before\n"


def test_cancelling_a_running_program_kills_it_within_100ms(session: Session) -> None:
    t, out = _start(session, "/bin/sleep 10")
    _wait_for(lambda: len(_sleep_children()) == 1)
    child = _sleep_children()[0]
    t0 = time.monotonic()
    session.cancel()
    t.join(2)
    elapsed = time.monotonic() - t0
    assert elapsed < 0.1, elapsed
    assert out[0].error is not None and out[0].error.kind == "cancelled"
    assert _gone(child)
    assert _sleep_children() == []


def test_cancelling_kills_the_programs_whole_process_group(session: Session) -> None:
    t, out = _start(session, "sh -c '/bin/sleep 10 & /bin/sleep 10; wait'")
    _wait_for(lambda: len(_sleep_children()) == 2)
    kids = _sleep_children()
    session.cancel()
    t.join(2)
    _wait_for(lambda: all(_gone(k) for k in kids), 1.0)
    assert out[0].error is not None and out[0].error.kind == "cancelled"


def test_cancelling_a_busy_loop_stops_it_within_100ms(session: Session, tmp_path: Path) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(
        # the range is built before the signal: building 10 M items is one native call (~0.3 s)
        # with no poll point inside, which is not what this test measures
        session,
        f"let n = 0; let xs = range 10000000; {touch}; for i in $xs {{ let n = add $n 1 }}",
    )
    _wait_for(reached)
    t0 = time.monotonic()
    session.cancel()
    t.join(2)
    assert time.monotonic() - t0 < 0.1
    assert out[0].error is not None and out[0].error.kind == "cancelled"


def test_cancellation_is_not_catchable_by_try(session: Session, tmp_path: Path) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(session, f"try {{ {touch}; sleep 10 }} catch e {{ 'caught' }}")
    _wait_for(reached)  # the cancel lands inside the try
    session.cancel()
    t.join(2)
    assert out[0].error is not None and out[0].error.kind == "cancelled"
    assert out[0].value != "caught"


def test_cancelling_while_awaiting_a_worker_stops_the_await(
    session: Session, tmp_path: Path
) -> None:
    touch, reached = _reached(tmp_path)
    t, out = _start(session, f"let h = spawn {{ sleep 10 }}; {touch}; await $h")
    _wait_for(lambda: reached() and "h" in session.session_names())
    t0 = time.monotonic()
    session.cancel()
    t.join(2)
    assert time.monotonic() - t0 < 0.1
    assert out[0].error is not None and out[0].error.kind == "cancelled"
    assert session.run("cancel $h; 1").value == 1


def test_the_session_is_usable_after_a_cancelled_run(session: Session) -> None:
    t, _ = _start(session, "sleep 10")
    _wait_for(lambda: session._run_scope is not None)
    session.cancel()
    t.join(2)
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
        _wait_for(lambda: workers.running() == [], 1.0)  # type: ignore[attr-defined]
    finally:
        s.close()


def test_fault_hang_blocks_until_cancelled(tmp_path: Path) -> None:
    s = Session(faults=True)
    try:
        touch, reached = _reached(tmp_path)
        t, out = _start(s, f"{touch}; fault hang")
        _wait_for(reached)
        t0 = time.monotonic()
        s.cancel()
        t.join(2)
        assert time.monotonic() - t0 < 0.1
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
