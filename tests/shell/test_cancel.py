"""Cancelling a busy shell or worker through the eval root: within 100 ms, bypassing mailboxes."""

from __future__ import annotations

import time
from typing import Any

import psutil

from tests.support.waiting import wait_for

BOUND = 0.100


def _cancel_and_time(future: Any, cancel: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    cancel()
    result = future.get(timeout=5)
    return time.perf_counter() - t, result


def test_interrupting_a_native_sleep_returns_cancelled_within_100ms_and_the_shell_lives_on(
    start_shell,
) -> None:
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()
    shell.run("let a = 1").get()
    future = shell.run("sleep 10")
    wait_for(lambda: root.busy)
    elapsed, r = _cancel_and_time(future, lambda: root.interrupt("esc"))
    assert r.error_kind == "cancelled" and not r.rolled_back
    assert elapsed < BOUND, elapsed
    assert shell.run("echo $a").get().stdout == "1\n"


def test_interrupting_an_external_program_kills_it_within_100ms(start_shell) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    host = psutil.Process(shell.host_pid().get())
    future = shell.run("/bin/sleep 10")
    program = wait_for(lambda: next(iter(host.children()), None))
    elapsed, r = _cancel_and_time(future, lambda: root.interrupt())
    assert r.error_kind == "cancelled"
    assert elapsed < BOUND, elapsed
    wait_for(lambda: not program.is_running(), timeout=1.0)


def test_cancelling_the_root_is_sticky_until_clear(start_shell) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    future = shell.run("fault hang")
    wait_for(lambda: root.busy)
    elapsed, r = _cancel_and_time(future, lambda: root.cancel("agent-cancel"))
    assert r.error_kind == "cancelled" and elapsed < BOUND
    later = shell.run("echo hi").get()
    assert later.error_kind == "cancelled" and "agent-cancel" in later.error
    shell.clear().get()
    assert not root.cancelled
    assert shell.run("echo hi").get().stdout == "hi\n"


def test_a_busy_worker_is_cancelled_within_100ms_of_the_root_cancel(start_shell) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    shell.run("let h = spawn { /bin/sleep 10 }").get()
    me = psutil.Process()
    program = wait_for(lambda: next((p for p in me.children(recursive=True) if _is_sleep(p)), None))
    worker = program.parent()
    t = time.perf_counter()
    root.cancel("cascade")
    wait_for(lambda: not program.is_running() or program.status() == psutil.STATUS_ZOMBIE)
    elapsed = time.perf_counter() - t
    assert elapsed < BOUND, elapsed
    wait_for(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE)


def test_cancel_verb_stops_a_busy_worker_and_await_reports_it(start_shell) -> None:
    shell = start_shell().proxy()
    shell.run("let h = spawn { sleep 10 }").get()
    t = time.perf_counter()
    r = shell.run("cancel $h; await $h").get()
    assert time.perf_counter() - t < BOUND + 0.05
    assert r.error is not None and "cancelled" in r.error


def _is_sleep(p: psutil.Process) -> bool:
    try:
        return p.name() == "sleep"
    except psutil.Error:
        return False
