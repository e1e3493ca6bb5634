"""The process backend's spawn and teardown: what is ready at ``Born``, what is settled when.

Real processes throughout (agent processes and shells from the control process's one fork
server); the settlement is read from the spawn journal on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
import pytest

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.priority import (
    AGENT_NICE,
    ENDING_NICE,
    REACHED_NICE,
    stand_aside,
    stand_back,
)
from exarch_actors.actors.process import ChildProcess
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.busy import busy_in_its_call
from tests.support.waiting import HANG_GUARD, killed_or_gone, pid_alive, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def process_fleet(tmp_path: Path) -> Iterator[Callable[[str], Fleet]]:
    fleets: list[Fleet] = []

    def start(toml: str) -> Fleet:
        playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
        fleet = Fleet(
            SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
        )
        fleets.append(fleet)
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        return fleet

    yield start
    for fleet in fleets:
        fleet.close()


def _children(n: int, script: str) -> str:
    spawns = "; ".join(f"agent s{i} 'go'" for i in range(n))
    return "\n".join(
        [
            "[fleet]",
            'prompt = "start"',
            "[[agents.trunk]]",
            f'ral = ["{spawns}"]',
            "[[agents.trunk]]",
            'text = "started"',
            'stop = "end_turn"',
            "repeat = 20",
            '[[agents."s*"]]',
            f'ral = ["{script}"]',
        ]
    )


def _journal(fleet: Fleet, name: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(fleet.session.journal).records if r["id"] == name]


def test_a_spawned_agent_process_is_born_with_its_shell_restored_from_the_one_fork_server(
    process_fleet: Callable[[str], Fleet],
) -> None:
    fleet = process_fleet(_children(3, "sleep 30; reply 1"))
    names = ["s0", "s1", "s2"]
    agents = wait_for(lambda: all(n in fleet.hosted for n in names), 60, "three children born")
    assert agents
    for name in names:
        agent = fleet.hosted[name]
        assert isinstance(agent, ProcessAgent)
        shell = agent.shell_pid()
        assert pid_alive(agent.pid) and pid_alive(shell), "both processes up at Born"
        # restored: the shell's first checkpoint is on disk before Born
        assert fleet.session.snapshot(name).exists()
        # one fork server: the shell is its child, like the agent process, never the agent's
        assert psutil.Process(shell).ppid() == psutil.Process(agent.pid).ppid()


def _thread_nices(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def _of_threads_left(pid: int, read: Callable[[int], int]) -> set[int]:
    """``read`` of each thread of a process that is ending: a thread (or the process) gone
    between the listing and the read is left out."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return set()
    out: set[int] = set()
    for tid in tids:
        try:
            out.add(read(int(tid)))
        except ProcessLookupError:
            pass
    return out


def _nices_of_threads_left(pid: int) -> set[int]:
    return _of_threads_left(pid, lambda tid: os.getpriority(os.PRIO_PROCESS, tid))


def _policies_of_threads_left(pid: int) -> set[int]:
    return _of_threads_left(pid, os.sched_getscheduler)


def test_every_thread_of_an_agent_process_and_of_its_shell_runs_at_the_agent_nice_below_the_control(
    process_fleet: Callable[[str], Fleet],
) -> None:
    control = os.getpriority(os.PRIO_PROCESS, 0)
    fleet = process_fleet(_children(1, "sleep 30; reply 1"))
    wait_for(lambda: busy_in_its_call(fleet, "s0"), 60, "s0 busy in its sleep")
    agent = fleet.hosted["s0"]
    assert isinstance(agent, ProcessAgent)
    shell = agent.shell_pid()
    assert shell is not None
    want = max(control, AGENT_NICE)
    assert _thread_nices(agent.pid) == {want}, "the reader, flusher and shell actor threads too"
    assert _thread_nices(shell) == {want}
    assert os.getpriority(os.PRIO_PROCESS, 0) == control, "the control process keeps its own"


def _stand_back_and_tell(data: Connection, ctl: Connection, memory_bytes: int | None) -> None:
    """A child with two more threads, one already at nice 15 (or its own, if higher), that
    stands back and sends its nice before, then the nice of each of its threads (its own
    first)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    done = threading.Event()
    ready = threading.Barrier(3)

    def idle(nice: int | None) -> None:
        if nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, max(before, nice))
        ready.wait()
        done.wait()

    threads = [threading.Thread(target=idle, args=(n,)) for n in (None, 15)]
    for t in threads:
        t.start()
    ready.wait()
    stand_back()
    tids = [threading.get_native_id(), *(t.native_id or 0 for t in threads)]
    nices = [os.getpriority(os.PRIO_PROCESS, t) for t in tids]
    data.send_bytes(json.dumps([before, nices]).encode())
    done.set()
    for t in threads:
        t.join()


def _child_tells(target: Callable[[Connection, Connection, int | None], None], name: str) -> Any:
    """Run ``target`` in a child process, reap it, and return the JSON it sent."""
    child = ChildProcess(target, name=name)
    try:
        assert child.data.conn.poll(HANG_GUARD)
        return json.loads(child.data.conn.recv_bytes())
    finally:
        child.reap(grace=HANG_GUARD)


def test_standing_back_lowers_every_thread_to_the_ending_nice_and_none_above_it() -> None:
    before, nices = _child_tells(_stand_back_and_tell, "stand-back")
    low = max(before, ENDING_NICE)
    assert nices == [low, low, max(before, 15)]


def _stand_back_twice_and_tell(data: Connection, ctl: Connection, memory_bytes: int | None) -> None:
    """A child that stands back at 15, then at the ending nice (below it), then at 17, and
    sends how many times each call read its threads from ``/proc`` and its nice after each."""
    import exarch_actors.actors.priority as priority

    reads: list[int] = []
    listdir = os.listdir

    def counted(path: str) -> list[str]:
        if path == "/proc/self/task":
            reads[-1] += 1
        return listdir(path)

    priority.os.listdir = counted  # type: ignore[assignment]  # this child only
    out = []
    for nice in (15, ENDING_NICE, 17):
        reads.append(0)
        stand_back(nice)
        out.append([reads[-1], os.getpriority(os.PRIO_PROCESS, 0)])
    data.send_bytes(json.dumps(out).encode())


def test_standing_back_again_at_a_nice_no_higher_than_before_reads_nothing() -> None:
    first, again, lower = _child_tells(_stand_back_twice_and_tell, "stand-back-twice")
    assert first == [1, 15]
    assert again == [0, 15]  # ENDING_NICE (10) is below 15: nothing to do
    assert lower == [1, 17]


def _stand_aside_and_tell(data: Connection, ctl: Connection, memory_bytes: int | None) -> None:
    """A child with one more thread that stands aside and sends the policy of each of its
    threads (its own first), before and after."""
    done = threading.Event()
    ready = threading.Barrier(2)

    def wait() -> None:
        ready.wait()
        done.wait()

    thread = threading.Thread(target=wait)
    thread.start()
    ready.wait()
    tids = [threading.get_native_id(), thread.native_id or 0]
    before = [os.sched_getscheduler(t) for t in tids]
    stand_aside()
    after = [os.sched_getscheduler(t) for t in tids]
    data.send_bytes(json.dumps([before, after]).encode())
    done.set()
    thread.join()


def test_standing_aside_moves_every_thread_from_the_normal_class_to_the_idle_class() -> None:
    before, after = _child_tells(_stand_aside_and_tell, "stand-aside")
    assert before == [os.SCHED_OTHER, os.SCHED_OTHER]
    assert after == [os.SCHED_IDLE, os.SCHED_IDLE]


def test_after_a_cascade_every_slot_is_settled_cancelled_behind_a_destroyed_receipt_and_every_process_is_reaped(  # noqa: E501
    process_fleet: Callable[[str], Fleet],
) -> None:
    n = 8
    fleet = process_fleet(_children(n, "sleep 60; reply 1"))
    names = [f"s{i}" for i in range(n)]
    wait_for(
        lambda: all(busy_in_its_call(fleet, x) for x in names), 90, "every child busy in its sleep"
    )
    agents = [a for a in (fleet.hosted[x] for x in names) if isinstance(a, ProcessAgent)]
    assert len(agents) == n
    pids = [p for a in agents for p in (a.pid, a.shell_pid())]
    assert all(pid_alive(p) for p in pids)
    fleet.cancel_all("test")
    wait_for(lambda: all(a.done.is_set() for a in agents), 60, "every child settled")
    for name in names:
        records = _journal(fleet, name)
        assert records[-1]["kind"] == "cancelled", records[-1]
        receipts = [r for r in records if r["kind"] == "environment-teardown"]
        assert [r["destroyed"] for r in receipts] == [True], receipts
        assert not [r for r in records if r["kind"] == "teardown-unconfirmed"]
    fy = fleet.close()
    assert fy.cancelled == n and fy.never_settled == 0
    assert not [p for p in pids if pid_alive(p)], "every agent process and shell reaped"


def test_a_cancelled_agent_s_busy_shell_is_killed_at_the_cancel_and_its_call_answered_cancelled(
    process_fleet: Callable[[str], Fleet],
) -> None:
    # The cancel makes the ending agent's eval root terminal: its busy host is SIGKILLed, not
    # asked to unwind (it would have answered `1:1 cancelled`, its position in the script),
    # and the call is answered cancelled with the cascade's cause, no rollback recorded.
    fleet = process_fleet(_children(1, "sleep 60; reply 1"))
    wait_for(lambda: busy_in_its_call(fleet, "s0"), 60, "s0 busy in its sleep")
    agent = fleet.hosted["s0"]
    assert isinstance(agent, ProcessAgent)
    assert agent.eval_stopped_at is None
    before = time.time()
    fleet.registry.cancel("s0", "stop now")
    assert agent.wait(60), "s0 settled"
    # the instant of the kill reaches the spawn site with its end (the cascade's reach)
    assert agent.eval_stopped_at is not None and before <= agent.eval_stopped_at <= time.time()
    # once its shell was killed it stood back: every thread at the reached nice (the reaper
    # holds a settled process >= 0.1 s before telling it to exit; one already gone has none)
    assert _nices_of_threads_left(agent.pid) <= {REACHED_NICE}
    events = [json.loads(x) for x in fleet.session.events("s0").read_text().splitlines()]
    (result,) = [e["message"] for e in events if e["kind"] == "tool_result"]
    assert result["is_error"] and result["content"] == "[error]\ncancelled: stop now"
    record = fleet.session.record
    kept = read_jsonl(record).records if record.exists() else []
    assert [r for r in kept if r["kind"] == "Rollback"] == []


def test_an_agent_process_whose_end_is_reported_runs_what_is_left_of_it_in_the_idle_class(
    process_fleet: Callable[[str], Fleet], monkeypatch: pytest.MonkeyPatch
) -> None:
    # its shell's reap, its threads' stop, the wait to be told to exit and its exit are no
    # one's wait: they run when the cores have nothing else to do. The settled process is
    # held here (not handed to the reaper, which would tell it to exit) while it is read.
    held: list[tuple[ProcessAgent, Any]] = []
    release = ProcessAgent.release
    monkeypatch.setattr(ProcessAgent, "release", lambda agent, reaper: held.append((agent, reaper)))
    fleet = process_fleet(_children(2, "sleep 30; reply 1"))
    wait_for(
        lambda: busy_in_its_call(fleet, "s0") and busy_in_its_call(fleet, "s1"),
        60,
        "both busy in their sleep",
    )
    agent, other = fleet.hosted["s0"], fleet.hosted["s1"]
    assert isinstance(agent, ProcessAgent) and isinstance(other, ProcessAgent)
    assert _policies_of_threads_left(agent.pid) == {os.SCHED_OTHER}
    try:
        fleet.registry.cancel("s0", "stop now")
        assert agent.wait(60), "s0 settled"
        # stood aside right after sending its end, which the settlement may overtake
        wait_for(
            lambda: _policies_of_threads_left(agent.pid) == {os.SCHED_IDLE},
            30,
            "s0 in the idle class",
        )
        assert _policies_of_threads_left(other.pid) == {os.SCHED_OTHER}, "s1 still busy"
    finally:
        for ended, reaper in held:  # the reaper collects them, as the fleet's close waits for
            release(ended, reaper)


def test_an_agent_that_ended_has_its_shell_stopped_when_its_slot_settles_and_its_process_reaped_after(  # noqa: E501
    process_fleet: Callable[[str], Fleet],
) -> None:
    fleet = process_fleet(_children(1, "reply 7"))
    agent = wait_for(lambda: fleet.hosted.get("s0"), 60, "s0 born")
    assert isinstance(agent, ProcessAgent)
    shell = agent.shell_pid()
    assert shell is not None
    assert agent.wait(60), "s0 settled"
    # the settlement ran after the agent process had stopped its own shell: SIGKILLed (it
    # runs no instruction more), its reclaim in the idle class left to the agent process to reap
    assert agent.shell_stopped
    assert killed_or_gone(shell)
    records = _journal(fleet, "s0")
    assert records[-1]["kind"] == "settled" and records[-1]["status"] == "done"
    receipts = [r for r in records if r["kind"] == "environment-teardown"]
    assert [r["destroyed"] for r in receipts] == [True]
    # reaped off the settlement path, without waiting for the fleet to close; the agent
    # process reaps its shell before it exits
    wait_for(lambda: not pid_alive(agent.pid), 30, "s0's process reaped")
    assert not pid_alive(shell)
    fy = fleet.close()
    assert fy.never_settled == 0


POOL_SCRIPT = """
import sys, time
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.priority import AGENT_NICE
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir

toml = '[fleet]\\nprompt = "hi"\\n[[agents.trunk]]\\ntext = "hello"\\nrepeat = 5\\n'
playback = ScenarioPlayback(parse_scenario(toml))
fleet = Fleet(SessionDir.at(sys.argv[1]), playback.provider, FleetConfig(agents="process"))
fleet.start_trunk(playback.scenario.prompt, interactive=True)
while len(fleet.host_pool.idle_pids()) < 2:
    time.sleep(0.01)
print(" ".join(str(p) for p in fleet.host_pool.idle_pids()), flush=True)
time.sleep(600)
"""


def test_a_warm_pool_of_agent_processes_dies_with_a_sigkilled_control_process(
    tmp_path: Path,
) -> None:
    control = subprocess.Popen(
        [sys.executable, "-c", POOL_SCRIPT, str(tmp_path / "session")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert control.stdout is not None
        pooled = [int(p) for p in control.stdout.readline().split()]
        assert len(pooled) == 2 and all(pid_alive(p) for p in pooled)
        tree = psutil.Process(control.pid).children(recursive=True)
        assert {p.pid for p in tree} >= set(pooled)
    finally:
        control.kill()
        control.wait(30)
    wait_for(
        lambda: not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
        30,
        "every process the control process started (its warm pool too) gone",
    )


def test_a_closed_fleet_leaves_no_pooled_agent_process_behind(
    process_fleet: Callable[[str], Fleet],
) -> None:
    fleet = process_fleet(_children(1, "reply 1"))
    pool = fleet.host_pool
    assert pool is not None
    pooled = wait_for(lambda: pool.idle_pids() if len(pool.idle_pids()) == 2 else None, 60, "pool")
    fleet.close()
    assert not [p for p in pooled if pid_alive(p)]
    assert pool.idle_pids() == []


def test_a_settled_childs_scratch_is_removed_whether_empty_or_holding_files(
    process_fleet: Callable[[str], Fleet],
) -> None:
    fleet = process_fleet(_children(2, "sleep 60; reply 1"))
    names = ["s0", "s1"]
    wait_for(
        lambda: all(busy_in_its_call(fleet, x) for x in names),
        90,
        "both children busy in their sleep",
    )
    full = fleet.session.scratch("s1")
    (full / "made" / "deeper").mkdir(parents=True)
    (full / "made" / "deeper" / "notes.txt").write_text("kept until the settlement")
    assert fleet.session.scratch("s0").is_dir() and not any(fleet.session.scratch("s0").iterdir())
    fleet.cancel_all("test")
    agents = [fleet.hosted[x] for x in names]
    wait_for(lambda: all(a.done.is_set() for a in agents), 60, "both children settled")
    for name in names:
        receipts = [r for r in _journal(fleet, name) if r["kind"] == "environment-teardown"]
        assert [r["destroyed"] for r in receipts] == [True], receipts
        assert not fleet.session.scratch(name).exists(), name
    assert fleet.close().never_settled == 0


def test_a_child_whose_shell_a_rollback_replaced_reports_the_new_shell_stopped_and_settles_it(
    process_fleet: Callable[[str], Fleet],
) -> None:
    fleet = process_fleet(_children(1, "sleep 60") + '\n[[agents."s*"]]\nral = ["reply 1"]\n')
    wait_for(lambda: busy_in_its_call(fleet, "s0"), 90, "s0 busy in its sleep")
    agent = fleet.hosted["s0"]
    assert isinstance(agent, ProcessAgent)
    first = agent.shell_pid()
    assert first is not None and pid_alive(first)
    os.kill(first, signal.SIGKILL)  # the call rolls back onto a fresh shell host
    assert agent.wait(90), "s0 replied and settled"
    # its end report named the shell it ended with, stopped in order by its own process
    assert agent.shell_stopped
    last = agent.shell_pid()
    assert last is not None and last != first
    assert killed_or_gone(last)
    records = _journal(fleet, "s0")
    assert records[-1]["kind"] == "settled" and records[-1]["status"] == "done", records[-1]
    receipts = [r for r in records if r["kind"] == "environment-teardown"]
    assert [r["destroyed"] for r in receipts] == [True], receipts
    wait_for(lambda: not pid_alive(agent.pid), 30, "s0's process reaped")
    assert not pid_alive(last)  # its agent process reaped it before its own exit
    assert fleet.close().never_settled == 0


def test_a_shell_pid_reads_as_running_while_it_runs_and_gone_once_a_zombie_or_reaped() -> None:
    from exarch_actors.actors.agent_executor import _running

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        assert _running(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # it exits; unreaped, it stays a zombie
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 30, "a zombie")
        assert not _running(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not _running(child.pid)
