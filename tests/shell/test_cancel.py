"""Cancelling a busy shell or worker through the eval root, bypassing mailboxes.

How fast (docs/language.md's 100 ms bound) is measured by ``benchmarks/cancel_latency.py``; these
tests
assert that the run comes back ``cancelled`` and its programs die, ``HANG_GUARD`` against hangs.
"""

from __future__ import annotations

from typing import Any

import psutil

from tests.support.waiting import HANG_GUARD, wait_for


def _cancel(future: Any, cancel: Any) -> Any:
    cancel()
    return future.get(timeout=HANG_GUARD)


def test_interrupting_a_native_sleep_returns_cancelled_and_the_shell_lives_on(
    start_shell,
) -> None:
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()
    shell.run("let a = 1").get()
    future = shell.run("sleep 10")
    wait_for(lambda: root.busy)
    r = _cancel(future, lambda: root.interrupt("esc"))
    assert r.error_kind == "cancelled" and not r.rolled_back
    assert shell.run("echo $a").get().stdout == "1\n"


def test_interrupting_an_external_program_kills_it_and_returns_cancelled(start_shell) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    host = psutil.Process(shell.host_pid().get())
    future = shell.run("/bin/sleep 10")
    program = wait_for(lambda: next(iter(host.children()), None))
    r = _cancel(future, lambda: root.interrupt())
    assert r.error_kind == "cancelled"
    wait_for(lambda: not program.is_running(), HANG_GUARD, "the program killed")


def test_cancelling_the_root_is_sticky_until_clear(start_shell) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    future = shell.run("fault hang")
    wait_for(lambda: root.busy)
    r = _cancel(future, lambda: root.cancel("agent-cancel"))
    assert r.error_kind == "cancelled"
    later = shell.run("echo hi").get()
    assert later.error_kind == "cancelled" and "agent-cancel" in later.error
    shell.clear().get()
    assert not root.cancelled
    assert shell.run("echo hi").get().stdout == "hi\n"


def test_a_root_cancel_kills_a_busy_workers_program_and_the_worker(start_shell) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    shell.run("let h = spawn { /bin/sleep 10 }").get()
    me = psutil.Process()
    program = wait_for(lambda: next((p for p in me.children(recursive=True) if _is_sleep(p)), None))
    worker = program.parent()
    root.cancel("cascade")
    wait_for(lambda: not program.is_running() or program.status() == psutil.STATUS_ZOMBIE)
    wait_for(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE)


def test_cancel_verb_stops_a_busy_worker_and_await_reports_it(start_shell) -> None:
    shell = start_shell().proxy()
    shell.run("let h = spawn { sleep 10 }").get()
    r = shell.run("cancel $h; await $h").get(timeout=HANG_GUARD)
    assert r.error is not None and "cancelled" in r.error


def _is_sleep(p: psutil.Process) -> bool:
    try:
        return p.name() == "sleep"
    except psutil.Error:
        return False


def test_an_interrupt_landing_just_after_the_run_frame_leaves_stops_that_run(
    start_shell, monkeypatch
) -> None:
    """The interleaving a loaded machine produces: the caller is descheduled right after the
    ``run`` frame is written, and an Esc arrives before it resumes. The interrupt must reach
    the run the host is about to start, not be dropped as "no run in flight"."""
    from actors.frames import Channel

    shell = start_shell().proxy()
    root = shell.eval_root.get()
    shell.run("let a = 1").get()
    send_fields = Channel.send_fields  # how the control side writes a run frame

    def send_then_interrupt(self: Channel, kind: str, fields: dict[str, Any]) -> None:
        send_fields(self, kind, fields)
        if kind == "run" and fields.get("source") == "/bin/sleep 30":  # the call below
            root.interrupt("esc")

    monkeypatch.setattr(Channel, "send_fields", send_then_interrupt)
    r = shell.run("/bin/sleep 30").get(timeout=HANG_GUARD)
    assert r.error_kind == "cancelled"
    monkeypatch.undo()
    assert shell.run("echo $a").get().stdout == "1\n"
