"""The teardown receipt of a child whose own host stopped and reaped its shell at its end."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

from exarch_actors.actors.agent import AgentOutcome, AgentStats
from exarch_actors.actors.agent_executor import AgentExecutor
from exarch_actors.runtime.settlement.executor import EnvironmentState, ExecutionSpec
from exarch_actors.runtime.state.session_dir import SessionDir


class EndedInOrder:
    """The executor's view of an agent process (``ExecutedAgent``): its shell pid as ``Born``
    named it, then as its ``EndReport`` named it, and whether its host stopped it in order."""

    def __init__(self, session: SessionDir, shell_pid: int) -> None:
        self.name = "kid"
        self.site = SimpleNamespace(session=session)
        self.done = threading.Event()
        self.outcome: AgentOutcome | None = None
        self.stats = AgentStats()
        self.node = "local"
        self.pid_now: int | None = shell_pid
        self.stopped = False
        self.scratch_kept: str | None = None

    @property
    def shell_stopped(self) -> bool:
        return self.stopped

    def shell_pid(self) -> int | None:
        return self.pid_now

    def shell_healthy(self) -> bool:
        return True

    def cancel(self, cause: str) -> None:
        self.done.set()

    def end(self, shell_pid: int) -> None:
        self.pid_now, self.stopped = shell_pid, True
        self.outcome = AgentOutcome.CANCELLED
        self.done.set()


def test_a_shell_its_host_reaped_is_destroyed_even_if_its_pid_now_names_a_live_process(
    tmp_path: Path,
) -> None:
    """The host reaped its shell before ``Ended``: its pid is free and may already name another
    process (here a live ``sleep``); the receipt trusts the report, not ``/proc``."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        agent = EndedInOrder(SessionDir.at(tmp_path), shell_pid=other.pid)
        executor = AgentExecutor(agent, stop_shell=lambda _agent: None)
        executor.execute(ExecutionSpec(node_id="kid"))
        agent.end(shell_pid=other.pid)
        receipt = executor.teardown(1.0)
        assert receipt.state is EnvironmentState.DESTROYED
        assert receipt.destroyed
        assert other.poll() is None  # nothing of ours was killed for it
    finally:
        other.kill()
        other.wait()


def test_a_receipt_names_the_shell_the_agent_had_at_its_end_after_a_rollback(
    tmp_path: Path,
) -> None:
    first = subprocess.Popen(["sleep", "60"])
    try:
        agent = EndedInOrder(SessionDir.at(tmp_path), shell_pid=first.pid)
        executor = AgentExecutor(agent, stop_shell=lambda _agent: None)
        admitted = executor.execute(ExecutionSpec(node_id="kid"))
        assert admitted.pid == first.pid
        agent.end(shell_pid=first.pid + 1)  # a rollback's shell, reaped by its host
        receipt = executor.teardown(1.0)
        assert receipt.pid == first.pid + 1
        assert receipt.destroyed
        assert not (tmp_path / "scratch" / "kid").exists()
    finally:
        first.kill()
        first.wait()


def test_a_shell_not_stopped_in_order_and_still_running_is_not_reported_destroyed(
    tmp_path: Path,
) -> None:
    """The report is trusted only when it says stopped: a live shell otherwise is alive."""
    shell = subprocess.Popen(["sleep", "60"])
    try:
        agent = EndedInOrder(SessionDir.at(tmp_path), shell_pid=shell.pid)
        executor = AgentExecutor(agent, stop_shell=lambda _agent: None)
        executor.execute(ExecutionSpec(node_id="kid"))
        receipt = executor.teardown(1.0)
        assert receipt.state is EnvironmentState.ALIVE_UNDELETABLE
        assert not receipt.destroyed
    finally:
        shell.kill()
        shell.wait()


def test_a_shell_its_host_on_another_node_stopped_in_order_is_destroyed_not_alive(
    tmp_path: Path,
) -> None:
    """A Ray-hosted agent's host stopped its shell before ``Ended``: its host answers for it
    (a local pid says nothing about another machine), and a shell stopped in order is gone --
    the receipt read "still running after close" while the host called it healthy."""
    agent = EndedInOrder(SessionDir.at(tmp_path), shell_pid=4242)
    agent.node = "node-1"
    executor = AgentExecutor(agent, stop_shell=lambda _agent: None)
    executor.execute(ExecutionSpec(node_id="kid"))
    agent.end(shell_pid=4243)
    receipt = executor.teardown(1.0)
    assert receipt.state is EnvironmentState.DESTROYED, receipt.detail
    assert receipt.destroyed and receipt.pid == 4243


def test_a_scratch_its_host_on_another_node_could_not_remove_is_not_reported_destroyed(
    tmp_path: Path,
) -> None:
    agent = EndedInOrder(SessionDir.at(tmp_path), shell_pid=4242)
    agent.node = "node-1"
    agent.scratch_kept = "[Errno 13] Permission denied"  # what its EndReport said
    executor = AgentExecutor(agent, stop_shell=lambda _agent: None)
    executor.execute(ExecutionSpec(node_id="kid"))
    agent.end(shell_pid=4243)
    receipt = executor.teardown(1.0)
    assert receipt.state is EnvironmentState.ALIVE_UNDELETABLE
    assert not receipt.destroyed
    assert "node-1" in receipt.detail and "Permission denied" in receipt.detail
