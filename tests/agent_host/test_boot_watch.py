"""The deadlines of births in the background (``actors/boot_watch.py``): an overdue birth's
callback runs once, a birth done in time never has it run, and a closed watch runs nothing."""

from __future__ import annotations

import threading

from exarch_actors.actors.boot_watch import BootWatch
from tests.support.waiting import wait_for


def test_an_overdue_birth_has_its_callback_run_once_and_one_done_in_time_never() -> None:
    watch = BootWatch(timeout=0.05)
    calls: list[str] = []
    late = threading.Event()
    try:
        watch.watch("done-in-time", lambda: calls.append("done-in-time"))
        watch.done("done-in-time")
        def overdue() -> None:
            calls.append("overdue")
            late.set()

        watch.watch("overdue", overdue)
        assert late.wait(10)
        wait_for(lambda: len(watch) == 0, 10, "nothing left pending")
    finally:
        watch.close()
    assert calls == ["overdue"]


def test_a_closed_watch_runs_no_callback_and_takes_no_more_births() -> None:
    watch = BootWatch(timeout=0.05)
    calls: list[str] = []
    watch.watch("pending", lambda: calls.append("pending"))
    watch.close()
    watch.watch("after", lambda: calls.append("after"))
    assert len(watch) == 0
    assert calls == []
