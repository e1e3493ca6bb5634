"""A child process's start time and its reap (``actors/process.py``): the start time is
psutil's, known from the start; a reap knows the exit, and still kills what the child left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

import psutil
import pykka
import pytest

from exarch_actors.actors.agent_shell import WorkerCount
from exarch_actors.actors.call_result import ShellClosed
from exarch_actors.actors.mailbox import QuotaMailbox
from exarch_actors.actors.process import ChildProcess
from exarch_actors.actors.process_identity import create_time, exited, kill_and_wait, start_ticks
from exarch_actors.actors.shell import ShellActor, run_call
from exarch_actors.actors.shell_host import host_main
from exarch_actors.runtime.cancel import CancelScope
from tests.support.waiting import HANG_GUARD, killed_or_gone, pid_alive, wait_for


def _leave_a_program(data: Connection, ctl: Connection, memory_bytes: int | None) -> None:
    """A child that starts a program in a session of its own (as the ral evaluator does, but
    without the tie to its own life), tells its pid, and exits with code 3."""
    program = subprocess.Popen(["sleep", "600"], start_new_session=True)
    data.send_bytes(str(program.pid).encode())
    data.recv_bytes()  # the control side adopted it
    os._exit(3)


def _exit_at_once(data: Connection, ctl: Connection, memory_bytes: int | None) -> None:
    os._exit(5)


def _hang(data: Connection, ctl: Connection, memory_bytes: int | None) -> None:
    data.recv_bytes()  # never sent: the reap's kill ends it


def test_create_time_equals_psutils_create_time_for_every_process_on_the_box() -> None:
    compared = 0
    for pid in psutil.pids():
        try:
            expected = psutil.Process(pid).create_time()
        except psutil.Error:
            continue  # gone meanwhile
        got = create_time(pid)
        if got is None and not psutil.pid_exists(pid):
            continue  # gone between the two reads
        assert got == expected, pid
        compared += 1
    assert compared >= 3


def test_create_time_of_a_process_that_is_gone_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert create_time(proc.pid) is None


def test_a_host_start_time_is_psutils_and_stays_known_after_it_exited() -> None:
    host = ChildProcess(host_main, name="ral-shell-start-time")
    try:
        assert host.started_at == psutil.Process(host.pid).create_time()
    finally:
        host.kill()
        host.reap(grace=0.0)
    assert not pid_alive(host.pid)
    assert host.started_at is not None


def test_reaping_a_child_that_exited_reports_its_exit_code() -> None:
    host = ChildProcess(_exit_at_once, name="exit-5")
    assert host.reap(grace=HANG_GUARD) == 5
    assert not pid_alive(host.pid)


def test_reaping_a_child_that_outlives_the_grace_kills_it() -> None:
    host = ChildProcess(_hang, name="hang")
    assert host.reap(grace=0.05) == -9
    assert not pid_alive(host.pid)


def test_reaping_a_child_that_exited_still_kills_the_program_it_left_behind() -> None:
    host = ChildProcess(_leave_a_program, name="leaves-a-program")
    program = int(host.data.conn.recv_bytes())
    host.adopt_program(program)  # what the shell's pump does with the child's notice frame
    host.data.conn.send_bytes(b"go")
    wait_for(lambda: host.proc.exitcode is not None, HANG_GUARD, "the child's exit")
    assert pid_alive(program)  # the child is gone; its program is not
    assert host.reap(grace=HANG_GUARD) == 3
    wait_for(lambda: not pid_alive(program), HANG_GUARD, "the program's death")


def test_reaping_a_child_kills_a_program_it_adopted_that_leads_no_group_of_its_own() -> None:
    program = subprocess.Popen(["sleep", "600"])  # in this process's group: no killpg reaches it
    host = ChildProcess(_exit_at_once, name="exit-5")
    host.adopt_program(program.pid)
    try:
        assert host.reap(grace=HANG_GUARD) == 5
        assert program.wait(HANG_GUARD) == -9
    finally:
        program.kill()
        program.wait()


def test_reaping_never_kills_a_process_that_reused_an_adopted_programs_pid() -> None:
    program = subprocess.Popen(["sleep", "600"])
    host = ChildProcess(_exit_at_once, name="exit-5")
    host.adopt_program(program.pid)
    ticks = start_ticks(program.pid)
    assert ticks is not None
    host._known[program.pid] = ticks - 1  # the adopted program started earlier: not this one
    try:
        host.reap(grace=HANG_GUARD)
        assert program.poll() is None and pid_alive(program.pid)
    finally:
        program.kill()
        program.wait()


def test_start_ticks_is_the_start_time_psutil_reads_in_clock_ticks() -> None:
    started = psutil.Process(os.getpid()).create_time()
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    assert ticks / os.sysconf("SC_CLK_TCK") + psutil.boot_time() == started


def _actor(ref: Any) -> ShellActor:
    actor = ref._actor_weakref()
    assert isinstance(actor, ShellActor)
    return actor


def _idle_shell(start_shell: Any) -> tuple[Any, Any, int]:
    """A started shell that ran one call: its actor ref, its proxy, its host's pid."""
    ref = start_shell()
    shell = ref.proxy()
    assert shell.run("let a = 1").get().error is None
    return ref, shell, shell.host_pid().get()


def _closed_and_stopped(ref: Any, shell: Any) -> None:
    """A closed shell names no host and refuses a call; its on_stop then finds it closed."""
    assert shell.host_pid().get(timeout=HANG_GUARD) is None
    with pytest.raises(ShellClosed):
        shell.run("let b = 2").get(timeout=HANG_GUARD)
    ref.stop(block=True, timeout=HANG_GUARD)


def test_an_idle_shell_closed_on_the_calling_thread_has_its_host_reaped_and_refuses_calls(
    start_shell,
) -> None:
    ref, shell, pid = _idle_shell(start_shell)
    closed, host_pid = _actor(ref).close_here()
    assert (closed, host_pid) == (True, pid)
    assert not pid_alive(pid)  # reaped when close_here returned, not later
    _closed_and_stopped(ref, shell)
    with pytest.raises(pykka.ActorDeadError):
        shell.run("let b = 2").get(timeout=HANG_GUARD)


def test_an_idle_shell_ended_on_the_calling_thread_has_its_host_sigkilled_and_left_to_reap(
    start_shell,
) -> None:
    ref, shell, pid = _idle_shell(start_shell)
    closed, host_pid, host = _actor(ref).end_here()
    assert (closed, host_pid) == (True, pid)
    assert host is not None and host.pid == pid
    assert killed_or_gone(pid)  # no instruction of it runs after end_here returned
    assert host.reap(grace=HANG_GUARD) == -signal.SIGKILL  # killed, not asked to exit
    assert not pid_alive(pid)
    _closed_and_stopped(ref, shell)


def test_a_child_killed_behind_the_living_has_its_main_thread_in_the_idle_class_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = ChildProcess(_hang, name="hang")
    seen: list[int] = []
    kill = child._kill

    def kill_seeing_the_policy(exited: bool) -> None:  # the class the child is signalled in
        if not seen:  # the first kill (the reap kills again, what the child left)
            seen.append(os.sched_getscheduler(child.pid))
        kill(exited)

    monkeypatch.setattr(child, "_kill", kill_seeing_the_policy)
    assert not killed_or_gone(child.pid)
    assert os.sched_getscheduler(child.pid) == os.SCHED_OTHER
    child.kill_behind()
    assert killed_or_gone(child.pid)
    assert seen == [os.SCHED_IDLE]
    assert child.reap(grace=HANG_GUARD) == -signal.SIGKILL


def test_a_child_killed_alive_is_not_searched_for_programs_again_by_a_later_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a SIGKILLed child starts nothing more: a terminal cancel's kill, the end's and the
    # reap's find nothing new, so only the first reads its children from /proc
    child = ChildProcess(_hang, name="hang")
    searched: list[int] = []
    note = child.note_children

    def note_counted() -> None:
        searched.append(1)
        note()

    monkeypatch.setattr(child, "note_children", note_counted)
    child.kill_behind()
    child.kill_behind()
    child.kill()
    assert killed_or_gone(child.pid)
    assert child.reap(grace=HANG_GUARD) == -signal.SIGKILL
    assert searched == [1]


def _busy_shell(start_shell: Any, script: str) -> tuple[Any, Any, int, Any, Any]:
    """A started shell busy in ``script``: its ref, proxy, host pid, eval root and the run."""
    ref = start_shell()
    shell = ref.proxy()
    pid = shell.host_pid().get()
    root = shell.eval_root.get()
    running = shell.run(script)
    wait_for(lambda: root.busy, HANG_GUARD, "the call to start")
    return ref, shell, pid, root, running


def test_a_shell_busy_in_a_call_is_not_closed_on_the_calling_thread(start_shell) -> None:
    ref, _, pid, root, running = _busy_shell(start_shell, "/bin/sleep 30")
    assert _actor(ref).close_here() == (False, None)
    assert _actor(ref).end_here() == (False, None, None)
    assert pid_alive(pid)
    root.cancel("test over")
    assert running.get(timeout=HANG_GUARD).error_kind == "cancelled"
    assert ref.is_alive()


class _SentFrames:
    """A host's control channel that records the frames sent on it (and sends them)."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.sent: list[tuple[str, str]] = []

    def try_send(self, kind: str, **fields: Any) -> bool:
        self.sent.append((kind, str(fields.get("reason"))))
        return bool(self._channel.try_send(kind, **fields))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def _sleep_on_a_caller(shell: Any, token: CancelScope) -> tuple[threading.Thread, list[Any]]:
    """A ``run_call`` of a 30 s program on a caller's thread; its answer lands in the list."""
    answer: list[Any] = []
    caller = threading.Thread(target=lambda: answer.append(run_call(shell, "/bin/sleep 30", token)))
    caller.start()
    return caller, answer


def test_a_cascade_reaches_a_run_on_the_callers_thread_with_one_cancel_frame(start_shell) -> None:
    """The registry cancels the eval root, then the agent's token trips: the run's watch sends
    no interrupt of its own over the sticky cancel that already reached the run."""
    ref = start_shell()
    shell = ref.proxy()
    assert shell.run("let a = 1").get().error is None
    host = _actor(ref)._host
    assert host is not None
    spy = _SentFrames(host.ctl)
    host.ctl = spy  # type: ignore[assignment]  # the eval root sends through it
    root = shell.eval_root.get()
    token = CancelScope()
    caller, answer = _sleep_on_a_caller(shell, token)
    wait_for(lambda: root.busy, HANG_GUARD, "the call to start")
    root.cancel("cascade")
    token.cancel("cascade")
    caller.join(HANG_GUARD)
    assert answer[0].get(timeout=HANG_GUARD).error_kind == "cancelled"
    assert spy.sent == [("cancel", "cascade")]


def test_a_tripped_watch_still_interrupts_a_run_whose_eval_root_stands(start_shell) -> None:
    """The trunk's case: no eval root is cancelled, so the watch's interrupt is what stops it."""
    ref = start_shell()
    shell = ref.proxy()
    assert shell.run("let a = 1").get().error is None
    root = shell.eval_root.get()
    token = CancelScope()
    caller, answer = _sleep_on_a_caller(shell, token)
    wait_for(lambda: root.busy, HANG_GUARD, "the call to start")
    token.cancel("esc")
    caller.join(HANG_GUARD)
    result = answer[0].get(timeout=HANG_GUARD)
    assert result.error_kind == "cancelled" and not root.cancelled


def test_a_shell_ended_through_its_mailbox_behind_a_queued_probe_leaves_its_host_to_reap(
    start_shell,
) -> None:
    # an agent's end that finds a message still queued on its shell goes through the mailbox,
    # and still does not wait for the killed host's exit (reaped after the end's report)
    ref, shell, pid, root, running = _busy_shell(start_shell, "sleep 30")
    probe = shell.probe()  # queued behind the call, as a live view's was
    assert _actor(ref).end_here() == (False, None, None)
    ending = shell.end_behind()
    root.make_terminal()
    root.cancel("parent ended")
    assert running.get(timeout=HANG_GUARD).error_kind == "cancelled"
    assert probe.get(timeout=HANG_GUARD).host_pid == pid
    host_pid, host = ending.get(timeout=HANG_GUARD)
    assert host is not None and host_pid == host.pid == pid
    assert killed_or_gone(pid)
    assert host.reap(grace=HANG_GUARD) == -signal.SIGKILL  # killed, not asked to exit
    _closed_and_stopped(ref, shell)


def test_a_live_views_worker_count_asks_no_probe_of_a_shell_busy_in_a_call(start_shell) -> None:
    ref = start_shell()
    shell = ref.proxy()
    assert shell.run("let w = spawn { sleep 30 }").get().error is None
    count = WorkerCount()
    assert count.read(shell) is None  # asked; answered at the shell's next turn
    assert wait_for(lambda: count.read(shell) == 1, HANG_GUARD, "the probe answered") == 1
    root = shell.eval_root.get()
    running = shell.run("sleep 30")
    wait_for(lambda: root.busy, HANG_GUARD, "the call to start")
    for _ in range(3):
        assert count.read(shell, busy=True) == 1  # the last figure; nothing queued
    mailbox = _actor(ref).actor_inbox
    assert isinstance(mailbox, QuotaMailbox)
    assert mailbox.qsize() == 0  # only the call, in hand: no probe behind it
    root.interrupt("test over")
    assert running.get(timeout=HANG_GUARD).error_kind == "cancelled"


_SLOW_TO_EXIT = (
    "import mmap, threading\n"
    "m = mmap.mmap(-1, 256 << 20); m.write(b'x' * (256 << 20))\n"
    "for _ in range(32): threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    "print('ready', flush=True); threading.Event().wait()\n"
)
"""A process whose exit takes a while after its SIGKILL (256 MiB to free, 33 threads to end):
right after ``os.kill`` it was still running 6 times in 10 on the dev box."""


def _grandchild(code: str) -> tuple[subprocess.Popen[str], int]:
    """A Python running ``code`` under a shell that waits for it: not this process's child
    (as a dead run's processes are not resume's), so only a kill and a wait show its end."""
    sh = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "$0" & echo $!; wait', code],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert sh.stdout is not None
    pid = int(sh.stdout.readline())
    assert sh.stdout.readline() == "ready\n"
    return sh, pid


def test_kill_and_wait_returns_only_once_a_killed_process_that_is_not_a_child_has_exited() -> None:
    sh, pid = _grandchild(_SLOW_TO_EXIT)
    try:
        assert pid not in {c.pid for c in psutil.Process().children()}
        assert kill_and_wait([(pid, lambda: True)], HANG_GUARD) == []
        assert exited(pid)
    finally:
        sh.kill()
        sh.wait()
        sh.communicate()


def test_kill_and_wait_leaves_alone_a_process_whose_identity_no_longer_holds() -> None:
    sh, pid = _grandchild("print('ready', flush=True); import time; time.sleep(600)")
    try:
        assert kill_and_wait([(pid, lambda: False)], HANG_GUARD) == []
        assert not exited(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        sh.wait()
        sh.communicate()
