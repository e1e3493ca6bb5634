"""``run_call``: a ral call on the caller's thread when the shell actor is idle, through its
mailbox otherwise, with the actor's guarantees either way (order, cancel, rollback)."""

from __future__ import annotations

import threading
from typing import Any

import psutil
import pykka
import pytest

from exarch_actors.actors.shell import run_call
from exarch_actors.runtime.cancel import CancelScope
from tests.support.waiting import HANG_GUARD, wait_for


def _thread_of_each_run(ref: Any) -> list[str]:
    """Record the thread each ``run`` executes on (wrapping the actor's bound method)."""
    actor = ref._actor_weakref()
    seen: list[str] = []
    inner = actor.run

    def run(script: str) -> Any:
        seen.append(threading.current_thread().name)
        return inner(script)

    actor.run = run
    return seen


def test_an_idle_shell_runs_the_call_on_the_callers_thread(start_shell) -> None:
    ref = start_shell()
    shell = ref.proxy()
    shell.run("let a = 41").get()  # on_start is done: the actor is ready and idle
    seen = _thread_of_each_run(ref)
    r = run_call(shell, "add $a 1").get(timeout=HANG_GUARD)
    assert r.error is None and r.value == "42"
    assert seen == [threading.current_thread().name]
    assert r.host_pid == shell.host_pid().get()
    assert r.host_started_at == psutil.Process(r.host_pid).create_time()


def test_a_busy_shell_takes_the_call_through_its_mailbox_after_the_call_in_flight(
    start_shell,
) -> None:
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()
    shell.run("1").get()
    seen = _thread_of_each_run(ref)
    first = shell.run("sleep 30")
    wait_for(lambda: root.busy)
    second = run_call(shell, "let b = 2; $b")  # on this thread it would block for 30 s
    with pytest.raises(pykka.Timeout):  # queued, not run
        second.get(timeout=0)
    root.interrupt("esc")
    assert first.get(timeout=HANG_GUARD).error_kind == "cancelled"
    r = second.get(timeout=HANG_GUARD)
    assert r.error is None and r.value == "2"
    assert threading.current_thread().name not in seen  # both ran on the actor's thread


def test_a_message_queued_before_the_call_is_served_before_it(start_shell) -> None:
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()
    shell.run("let a = 1").get()
    busy = shell.run("sleep 30")
    wait_for(lambda: root.busy)
    cleared = shell.clear()  # queued behind the sleep
    r = run_call(shell, "$a")
    root.interrupt("esc")
    busy.get(timeout=HANG_GUARD)
    cleared.get(timeout=HANG_GUARD)
    assert r.get(timeout=HANG_GUARD).error_kind == "elaboration"  # the clear went first


def test_an_envelope_taken_but_not_yet_served_keeps_the_mailbox_busy() -> None:
    from exarch_actors.actors.shell import _ShellMailbox

    class Envelope:
        message = "probe"
        reply_to = None

    box = _ShellMailbox()
    assert box.idle()
    box.put(Envelope())  # type: ignore[arg-type]
    assert not box.idle()
    box.get()  # the actor thread took it and has not yet taken the actor's lock
    assert not box.idle()
    box.served()
    assert box.idle()


def test_an_interrupt_of_the_callers_token_before_the_run_attaches_still_stops_it(
    start_shell,
) -> None:
    shell = start_shell().proxy()
    shell.run("1").get()
    token = CancelScope()
    token.cancel("esc")  # tripped before the run reached the host: EvalRoot had no run to stop
    r = run_call(shell, "sleep 30", token).get(timeout=HANG_GUARD)
    assert r.error_kind == "cancelled"
    assert run_call(shell, "1").get(timeout=HANG_GUARD).value == "1"


def test_a_token_tripped_mid_run_stops_it_with_no_eval_root_call(start_shell) -> None:
    """The trunk registers no eval root: a cascade trips only its token, and the run on the
    caller's thread must notice it (as ``await_run`` does through the mailbox)."""
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    shell.run("1").get()
    token = CancelScope()

    def cascade() -> None:
        wait_for(lambda: root.busy)
        token.cancel("interrupted")

    registry = threading.Thread(target=cascade)
    registry.start()
    try:
        r = run_call(shell, "sleep 30", token).get(timeout=HANG_GUARD)
    finally:
        registry.join(HANG_GUARD)
    assert r.error_kind == "cancelled"


def test_a_root_cancel_stops_a_run_on_the_callers_thread(start_shell) -> None:
    ref = start_shell()
    shell = ref.proxy()
    root = shell.eval_root.get()
    shell.run("1").get()

    def cascade() -> None:
        wait_for(lambda: root.busy)
        root.cancel("cascade")

    registry = threading.Thread(target=cascade)
    registry.start()
    try:
        r = run_call(shell, "sleep 30").get(timeout=HANG_GUARD)
    finally:
        registry.join(HANG_GUARD)
    assert r.error_kind == "cancelled"
    assert run_call(shell, "1").get(timeout=HANG_GUARD).error_kind == "cancelled"  # sticky


def test_a_panic_on_the_callers_thread_rolls_back_to_the_last_completed_call(
    start_shell,
) -> None:
    shell = start_shell().proxy()
    shell.run("let kept = 1").get()
    r = run_call(shell, "let lost = 2; fault panic").get(timeout=HANG_GUARD)
    assert r.rolled_back and r.error_kind == "panic"
    assert run_call(shell, "$kept").get(timeout=HANG_GUARD).value == "1"
    assert run_call(shell, "$lost").get(timeout=HANG_GUARD).error_kind == "elaboration"


def test_a_stopped_shell_answers_the_call_with_actor_dead(start_shell) -> None:
    ref = start_shell()
    shell = ref.proxy()
    shell.run("1").get()
    ref.stop(block=True, timeout=HANG_GUARD)
    with pytest.raises(pykka.ActorDeadError):
        run_call(shell, "1").get(timeout=HANG_GUARD)


def test_a_message_taken_off_the_mailbox_but_not_yet_counted_is_never_overtaken(
    start_shell, monkeypatch
) -> None:
    """The actor thread is descheduled right after taking a message off its queue: a caller
    asking then must find the actor not idle (its call goes through the mailbox, after that
    message), never run first on its own thread."""
    from exarch_actors.actors.mailbox import QuotaMailbox
    from exarch_actors.actors.shell import _ShellMailbox

    ref = start_shell()
    shell = ref.proxy()
    shell.run("1").get()
    actor = ref._actor_weakref()
    taken, asking = threading.Event(), threading.Event()
    take = QuotaMailbox.get

    def take_then_stall(self: Any, block: bool = True, timeout: float | None = None) -> Any:
        envelope = take(self, block, timeout)
        if not taken.is_set():
            taken.set()
            asking.wait(HANG_GUARD)  # the caller asks now (counted or not: the rule's case)
        return envelope

    idle = _ShellMailbox.idle

    def ask(self: Any) -> bool:
        asking.set()
        return idle(self)

    monkeypatch.setattr(QuotaMailbox, "get", take_then_stall)
    monkeypatch.setattr(_ShellMailbox, "idle", ask)
    shell.host_pid().get()  # the actor thread waited in the unpatched take: now in the new one
    probe = shell.probe()  # the message the actor thread takes and stalls on
    assert taken.wait(HANG_GUARD)
    ran_here: list[Any] = []
    caller = threading.Thread(target=lambda: ran_here.append(actor.run_here("1")))
    caller.start()
    caller.join(HANG_GUARD)
    assert not caller.is_alive()
    assert ran_here == [None]  # not idle: the call would go through the mailbox
    assert probe.get(timeout=HANG_GUARD).epoch >= 1


def test_a_run_watching_a_clear_token_waits_without_polling_and_leaves_no_callback_on_it(
    start_shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run on the caller's thread blocks until a frame or its token's trip (a cancel
    callback wakes it): the timed 50 ms read woke every agent busy in a long call 20 times a
    second. Its callback leaves the token with the run, so a token that lives across many
    calls gathers none."""
    from exarch_actors.actors.process import ChildProcess

    shell = start_shell().proxy()
    shell.run("1").get()
    waits: list[float | None] = []
    inner = ChildProcess.wait_frame

    def counted(self: ChildProcess, timeout: float | None, *args: Any, **kw: Any) -> Any:
        waits.append(timeout)
        return inner(self, timeout, *args, **kw)

    monkeypatch.setattr(ChildProcess, "wait_frame", counted)
    token = CancelScope()
    for _ in range(3):
        assert run_call(shell, "sleep 0.5", token).get(timeout=HANG_GUARD).error_kind is None
    assert waits and all(t is None for t in waits)  # never a timed read: no 0.05 s poll
    assert len(waits) < 3 * 5  # the 50 ms poll re-entered the wait ~10 times per call
    assert token._callbacks == []
    assert not token.cancelled
