"""A real agent host process: it starts from the control process's fork server with its own
shell host, answers over its channel, is cancelled mid ``sleep``, gives inbox verdicts, and
never outlives its control process. Every process here is real."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from exarch_actors.actors.agent_host import AgentHost
from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
from exarch_actors.runtime.fleet.agent_channel import DeliverResult, PeerGone, ScriptResult
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import HANG_GUARD, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def start_host(tmp_path: Path) -> Iterator[Callable[[str], AgentHost]]:
    hosts: list[AgentHost] = []

    def start(name: str) -> AgentHost:
        host = AgentHost(name, SessionDir(tmp_path))
        hosts.append(host)
        host.wait_born()
        return host

    yield start
    for h in hosts:
        h.shutdown(timeout=5)


def test_an_agent_host_is_born_in_its_own_process_with_its_own_shell_and_answers_a_ping(
    start_host: Callable[[str], AgentHost],
) -> None:
    host = start_host("a")
    assert host.born is not None
    assert host.born.pid == host.pid != os.getpid()
    shell = psutil.Process(host.born.shell_pid or 0)
    assert shell.pid != host.pid
    assert host.ping(7).seq == 7
    assert host.ping(8).pid == host.pid


def test_a_ral_call_through_the_agent_host_returns_the_shells_result_and_keeps_its_bindings(
    start_host: Callable[[str], AgentHost],
) -> None:
    host = start_host("a")
    first = host.run("let x = 41; echo $x")
    assert (first.stdout, first.error) == ("41\n", None)
    second = host.run("echo $x")
    assert second.stdout == "41\n"
    assert second.epoch == first.epoch + 1
    assert second.host_pid == host.born.shell_pid  # type: ignore[union-attr]


def test_a_cancel_frame_stops_a_running_sleep_and_the_host_reports_it_cancelled(
    start_host: Callable[[str], AgentHost],
) -> None:
    host = start_host("a")
    results: list[ScriptResult] = []
    runner = threading.Thread(target=lambda: results.append(host.run("sleep 30", timeout=20)))
    runner.start()
    # the probe is answered by the host's reader thread while its main thread runs the sleep
    wait_for(lambda: host.probe()["busy"], what="the sleep to be in flight")
    host.cancel("the cascade reached a")
    runner.join(30)
    result = results[0]
    assert result.error_kind == "cancelled"
    assert result.error is not None and "cancelled" in result.error
    # sticky: the next call is refused as cancelled without running
    assert host.run("echo hi").error_kind == "cancelled"
    assert host.probe()["cancelled"] == "the cascade reached a"
    ex = host.shutdown()
    assert ex.died is not None and ex.died.status == "cancelled"


def test_the_65th_agent_result_into_a_host_inbox_is_rejected_with_inbox_full_and_the_first_64_kept(
    start_host: Callable[[str], AgentHost],
) -> None:
    host = start_host("parent")
    verdicts = [
        host.deliver(DeliverResult("parent", f"c{i}", i)) for i in range(INBOX_SOURCE_CAP + 1)
    ]
    assert all(v.accepted for v in verdicts[:INBOX_SOURCE_CAP])
    last = verdicts[-1]
    assert (last.accepted, last.rejection) == (False, "InboxFull")
    assert "holds its cap of 64" in last.detail
    assert host.probe()["inbox"]["agent_result"] == INBOX_SOURCE_CAP


def test_a_sigkilled_host_is_seen_as_end_of_file_with_its_signal_and_its_shell_is_killed(
    tmp_path: Path,
) -> None:
    host = AgentHost("victim", SessionDir(tmp_path))
    born = host.wait_born()
    shell = psutil.Process(born.shell_pid or 0)
    os.kill(host.pid, signal.SIGKILL)
    ex = host.wait_exit(timeout=20)
    assert ex is not None
    assert ex.crashed
    assert ex.exitcode == -signal.SIGKILL
    assert "signal 9" in ex.cause
    with pytest.raises(PeerGone):
        host.ping()
    host.reap()
    wait_for(lambda: not _alive(shell), what="the dead host's shell to end")


def test_an_orderly_shutdown_reports_died_and_exits_zero(tmp_path: Path) -> None:
    host = AgentHost("calm", SessionDir(tmp_path))
    born = host.wait_born()
    shell = psutil.Process(born.shell_pid or 0)
    ex = host.shutdown("fleet closed")
    assert not ex.crashed
    assert ex.exitcode == 0
    assert ex.died is not None and (ex.died.status, ex.died.cause) == ("shutdown", "fleet closed")
    wait_for(lambda: not _alive(shell), what="the shell to end with its host")


PARENT = """
import sys, time
from exarch_actors.actors.agent_host import AgentHost
from exarch_actors.runtime.state.session_dir import SessionDir
from pathlib import Path
here = Path(sys.argv[1])
hosts = [AgentHost(f"h{i}", SessionDir.at(here)) for i in range(3)]
born = []
for i, h in enumerate(hosts):
    born.append(h.wait_born())
    h.run(f"let w = spawn {{ write-text {here}/ready-{i} 1; sleep 60 }}")
# Every worker is running its body (so past its start: a host stopped while the fork server
# still served its request for a worker can hold the fork server blocked in that request, so
# it never sees the control process go. Seen once under load: the fork server outlived the
# kill with every stopped host; our reading of it, a failure of the test's own freezing).
while not all((here / f"ready-{i}").exists() for i in range(3)):
    time.sleep(0.02)
for b in born:
    print(b.pid, b.shell_pid, flush=True)
time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)  # a guard: a fresh interpreter starts ten processes, on a loaded box
def test_every_agent_host_and_shell_dies_when_their_control_process_is_sigkilled(
    tmp_path: Path,
) -> None:
    """The hosts and shells are SIGSTOPped first, so none can notice its pipes closing: only the
    kernel's parent-death signal (through the fork server's exit) can end them. Every wait is
    on what happens (a line printed, a process gone), bounded only by hang guards."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    watched: dict[int, psutil.Process] = {}
    try:
        assert proc.stdout is not None
        pids = [int(x) for _ in range(3) for x in proc.stdout.readline().split()]
        assert len(pids) == 6
        # a spawned worker's process starts after `spawn` returns: wait for all three (read
        # once, the tree missed one on an idle box)
        tree = wait_for(
            lambda: _at_least(psutil.Process(proc.pid).children(recursive=True), 1 + 6 + 3),
            timeout=3 * HANG_GUARD,
            what="the fork server, 3 hosts, 3 shells and 3 workers",
        )
        watched = {p.pid: p for p in tree} | {pid: psutil.Process(pid) for pid in pids}
        assert len(tree) >= 1 + 6 + 3  # fork server, 3 hosts + 3 shells, 3 workers
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait(HANG_GUARD)
        try:
            wait_for(
                lambda: not [p for p in watched.values() if _alive(p)],
                timeout=3 * HANG_GUARD,  # ten processes woken by SIGKILL on a loaded box
                what="every host, shell and worker of the killed control process to end",
            )
        except AssertionError as e:  # say which outlived it (it failed once, passed on rerun)
            raise AssertionError(f"{e}; still alive: {_described(watched, pids)}") from None
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        for p in watched.values():  # survivors of a failed run are no longer our children
            with contextlib.suppress(psutil.Error):
                p.kill()


def _described(watched: dict[int, psutil.Process], stopped: list[int]) -> list[str]:
    """Each process still alive: pid, name, state, parent, and whether it was SIGSTOPped."""
    out = []
    for pid, p in watched.items():
        if not _alive(p):
            continue
        try:
            out.append(
                f"{pid} {p.name()} {p.status()} ppid={p.ppid()}"
                f"{' (stopped here)' if pid in stopped else ''}"
            )
        except psutil.Error:
            out.append(f"{pid} (gone while read)")
    return out


def _at_least(tree: list[psutil.Process], n: int) -> list[psutil.Process] | None:
    return tree if len(tree) >= n else None


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
