"""The process backend's spawn path: what a forked agent process inherits from the fork server,
and the warm pool's rules (``actors/host_pool.py``: a burst is served, a dead pooled process is
never handed out, nothing outlives the pool).

Real processes throughout: the suite's fork server, pooled agent processes and their shells.
Timing figures are in ``benchmarks/agent_processes.py`` and docs/benchmarks.md, not here.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.agent_site import SpawnRequest
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.host_pool import HostPool
from exarch_actors.actors.process import process_context, start_process
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.fork_probe import report_inherited
from tests.support.waiting import HANG_GUARD, pid_alive, wait_for

SCENARIO = """
[fleet]
prompt = "start"

[[agents.trunk]]
text = "noted"
repeat = 50

[[agents."s*"]]
ral = ["sleep 600"]

[[agents."s*"]]
ral = ["reply 0"]
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Fleet, ScenarioPlayback]]:
    playback = ScenarioPlayback(parse_scenario(SCENARIO))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(None, interactive=True)
        yield fleet, playback
    finally:
        fleet.close()


def _spawn(fleet: Fleet, playback: ScenarioPlayback, name: str) -> ProcessAgent:
    fleet.spawn(SpawnRequest("trunk", name, "go", None, playback.provider("trunk")))
    agent = fleet.hosted[name]
    assert isinstance(agent, ProcessAgent)
    return agent


def _inherited() -> dict[str, Any]:
    """What a process forked from the fork server finds it inherited (``fork_probe``)."""
    here, there = process_context().Pipe(duplex=True)
    proc = start_process(report_inherited, (there,), name="fork-probe")
    there.close()
    try:
        assert here.poll(HANG_GUARD * 3), "the probe never answered"
        got: dict[str, Any] = here.recv()
    finally:
        here.close()
        proc.join(HANG_GUARD)
    return got


def test_a_forked_process_inherits_the_prompt_files_prctl_and_a_frozen_heap() -> None:
    got = _inherited()
    assert got["prompt_files_cached"] >= 1  # read by the fork server, not after the fork
    assert got["prompt_fragments_cached"] == 1
    assert got["prctl_loaded"]
    assert got["frozen_objects"] > 1000  # the fork server froze its heap before forking


def test_a_forked_process_inherits_pickles_slot_names_of_what_it_sends_at_its_end() -> None:
    got = _inherited()
    assert got["slot_names_cached"] == [True, True]  # EndReport, AgentStats


def test_a_forked_process_inherits_a_warmed_ral_filled_pools_and_the_default_recursion_limit() -> (
    None
):
    got = _inherited()
    assert got["ral_warmed"]  # the fork server ran ral before it forked
    assert got["fillers"] > 100  # its pools' free blocks were taken before it forked
    if platform.libc_ver()[0] == "glibc":
        assert got["malloc_trimmed"]  # and its C heap's free pages given back
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.getrecursionlimit())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert got["recursion_limit"] == int(fresh.stdout)  # the warm-up's session put it back


def test_the_free_block_report_names_every_small_size_class() -> None:
    assert {16, 32, 512} <= set(_inherited()["free_block_classes"])


def test_a_burst_of_five_takes_from_a_pool_of_two_is_served_and_the_pool_refills() -> None:
    pool = HostPool(None, size=2)
    taken = []
    try:
        for _ in range(5):  # back to back: the last three were forked during the burst
            item = pool.take()
            assert item is not None
            taken.append(item)
        pids = [proc.pid for _, proc in taken]
        assert len(set(pids)) == 5 and all(pid_alive(p) for p in pids)
        refilled = wait_for(
            lambda: pool.idle_pids() if len(pool.idle_pids()) == 2 else None,
            HANG_GUARD * 3,
            "the pool refilled to two",
        )
        assert not set(refilled) & set(pids)
    finally:
        for conn, _ in taken:  # an end of file before its boot: the process exits
            conn.close()
        pool.close()
    for _, proc in taken:
        proc.join(HANG_GUARD)
        assert proc.exitcode is not None
    assert not [p for p in refilled if pid_alive(p)]


def test_back_to_back_spawns_each_run_in_a_pooled_process(
    fleet: tuple[Fleet, ScenarioPlayback],
) -> None:
    f, playback = fleet
    pool = f.host_pool
    assert pool is not None
    before = pool.served  # the trunk's
    agents = [_spawn(f, playback, f"s{i}") for i in range(4)]
    assert pool.served == before + 4
    assert len({a.pid for a in agents}) == 4 and all(pid_alive(a.pid) for a in agents)


def test_a_pooled_process_that_died_while_idle_is_not_handed_out(
    fleet: tuple[Fleet, ScenarioPlayback],
) -> None:
    f, playback = fleet
    pool = f.host_pool
    assert pool is not None
    first, second = wait_for(
        lambda: pool.idle_pids() if len(pool.idle_pids()) == 2 else None,
        HANG_GUARD * 3,
        "two pooled processes",
    )
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first), HANG_GUARD, "the pooled process dead")
    agent = _spawn(f, playback, "s0")
    assert agent.pid == second  # the next pooled one, not a fresh fork
    assert pid_alive(agent.pid)
    assert first not in agent.pids


def test_a_closed_pool_hands_out_nothing_and_leaves_no_process_behind() -> None:
    pool = HostPool(None, size=2)
    pooled = wait_for(
        lambda: pool.idle_pids() if len(pool.idle_pids()) == 2 else None,
        HANG_GUARD * 3,
        "two pooled processes",
    )
    pool.close()
    assert pool.take() is None
    assert pool.boot(b"") is None
    assert not [p for p in pooled if pid_alive(p)]
