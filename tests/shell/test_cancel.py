"""Cancelling a busy shell or worker through the eval root, bypassing mailboxes.

How fast (docs/language.md's 100 ms bound) is measured by ``benchmarks/cancel_latency.py``; these
tests
assert that the run comes back ``cancelled`` and its programs die, ``HANG_GUARD`` against hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pykka
import pytest

from exarch_actors.runtime.state.durable import read_jsonl
from tests.support.waiting import HANG_GUARD, ended, killed_or_gone, wait_for


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


def test_a_terminal_cancel_whose_kill_is_recorded_after_the_pump_saw_the_death_is_cancelled(
    start_shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the killing thread preempted between the SIGKILL and its record: the pump sees the host
    # die first, and must still answer cancelled, not a panic rolled back (1 run in 40 did)
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()
    host = ref._actor_weakref()._host
    kill = host.kill
    asked = threading.Event()  # the pump, the host's death seen, asks whether it was killed
    killed_when_dead = root.killed_when_dead

    def asking(dead: Any) -> str | None:
        asked.set()
        return killed_when_dead(dead)

    def kill_then_preempted(*args: Any, **kwargs: Any) -> None:
        kill(*args, **kwargs)
        asked.wait(HANG_GUARD)  # preempted until the pump has seen the death and asks

    monkeypatch.setattr(root, "killed_when_dead", asking)
    monkeypatch.setattr(host, "kill", kill_then_preempted)
    running = shell.run("/bin/sleep 30")
    wait_for(lambda: root.busy)
    root.make_terminal()
    r = _cancel(running, lambda: root.cancel("parent ended"))
    assert (r.error_kind, r.error, r.rolled_back) == ("cancelled", "cancelled: parent ended", False)


def test_a_terminal_cancel_kills_a_host_spinning_in_c_at_once_cancelled_not_rolled_back(
    start_shell, tmp_path: Path
) -> None:
    # A plain cancel of `fault spin` (C code holding the GIL, no poll point) waits out the
    # 2 s grace, kills the host and rolls the call back as a panic with a fresh host. An ending
    # agent's shell is made terminal: the host is SIGKILLed at the cancel, the call answered
    # cancelled, no host booted and no rollback recorded; what the call bound is not committed.
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    shell.run("let a = 1").get()
    pid = shell.host_pid().get()
    future = shell.run("let b = 2; fault spin")
    wait_for(lambda: root.busy)
    root.make_terminal()
    r = _cancel(future, lambda: root.cancel("parent ended"))
    assert r.error_kind == "cancelled" and r.error == "cancelled: parent ended"
    assert not r.rolled_back and r.host_pid == pid
    assert killed_or_gone(pid)
    assert shell.host_pid().get() == pid, "no fresh host booted for an ending agent"
    record = tmp_path / "record.jsonl"
    assert (
        not record.exists()
        or [x for x in read_jsonl(record).records if x["kind"] == "Rollback"] == []
    )
    assert set(shell.durable_snapshot().get().bindings) == {"a"}
    later = shell.run("echo hi").get()
    assert later.error_kind == "cancelled", "the cancel stays sticky"


def _busy_in_sleep(
    start_shell: Any, monkeypatch: pytest.MonkeyPatch, kill: str, before: Callable[[], Any]
) -> tuple[Any, Any, Any]:
    """A shell, its eval root and its host, whose ``kill`` method (``kill`` or ``kill_behind``)
    first runs ``before``."""
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()  # the actor has started: its host is up
    host = ref._actor_weakref()._host
    method = getattr(host, kill)

    def spied() -> None:
        before()
        method()

    monkeypatch.setattr(host, kill, spied)
    return shell, root, host


def test_a_terminal_cancel_answers_the_call_only_once_its_host_is_signalled(
    start_shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two threads reach the run: the cascade (the root's cancel) and the agent's re-sent
    # interrupt. The one that kills holds the kill; the other only wakes the pump, which must
    # not answer `cancelled` while the host can still run.
    gate = threading.Event()
    shell, root, host = _busy_in_sleep(
        start_shell, monkeypatch, "kill", lambda: gate.wait(HANG_GUARD)
    )
    future = shell.run("sleep 60")
    wait_for(lambda: root.busy)
    root.make_terminal()
    killer = threading.Thread(target=root.cancel, args=("parent ended",))
    killer.start()
    wait_for(lambda: root._killing is host)
    root.interrupt("esc")
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.3)
    assert not killed_or_gone(host.pid)
    gate.set()
    r = future.get(timeout=HANG_GUARD)
    killer.join(HANG_GUARD)
    assert r.error_kind == "cancelled" and killed_or_gone(host.pid)


def test_a_terminal_root_made_behind_kills_the_host_behind_the_living_stamps_the_kill_then_calls_back(  # noqa: E501
    start_shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an agent process reaps its host after its end is reported: the host's reclaim may run
    # in the idle class (kill_behind); an in-process agent's close waits for the exit: plain kill
    behind: list[int] = []
    shell, root, host = _busy_in_sleep(
        start_shell, monkeypatch, "kill_behind", lambda: behind.append(1)
    )
    future = shell.run("sleep 60")
    wait_for(lambda: root.busy)
    assert root.killed_at is None
    after: list[tuple[bool, int]] = []
    root.make_terminal(
        behind=True,
        after_kill=lambda: after.append((killed_or_gone(host.pid), threading.get_ident())),
    )
    before = time.time()
    r = _cancel(future, lambda: root.cancel("parent ended"))
    assert r.error == "cancelled: parent ended" and behind == [1]
    assert root.killed_at is not None and before <= root.killed_at <= time.time()
    assert after == [(True, threading.get_ident())], "once, after the kill, on the killing thread"


def test_a_terminal_root_kills_a_host_only_for_a_run_in_flight(start_shell) -> None:
    # Made terminal while idle, the cancel has no run to reach: the host lives until the
    # shell is closed (an agent's end kills it behind the living then).
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    pid = shell.host_pid().get()
    root.make_terminal()
    root.cancel("parent ended")
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and not killed_or_gone(pid)
    assert shell.run("1").get().error_kind == "cancelled"


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
    wait_for(lambda: ended(program))
    wait_for(lambda: ended(worker))


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
    from exarch_actors.actors.frames import Channel

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
