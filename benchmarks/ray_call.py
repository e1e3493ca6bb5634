"""One ral call through a Ray-hosted agent, beside a bare Ray actor call, in one run.

- bare: ``ray.get(a.ping.remote(x))`` on a live actor (the agent host's own actor class), the
  floor any Ray-hosted work pays per round trip;
- agent, local and ray: a real fleet (``actors/fleet.py``) on the scripted provider, one trunk
  making CALLS ral calls (``let v = add 1 2``, each a model turn, a tool call in its shell, the
  bus events and the journal) then replying; ``--agents process`` on this machine's fork server,
  then ``--backend ray``. The per-call figure is the difference of two runs (CALLS and
  CALLS + EXTRA calls) over EXTRA, so the host's start is not in it.

The issue's goal reads: (ray per call - local per call) <= 1.2 x the bare Ray call.

- throughput: a trunk starts AGENTS children, each making CALLS ral calls then replying; ral
  calls per second from the trunk's start to the fleet's end (spawns included), local process
  backend and Ray backend (on a two-node cluster, ``--placement spread``, with an address).

    PYTHONPATH=. python benchmarks/ray_call.py [--quick] [--ray-address HOST:PORT]
    (no address: a local Ray instance; run it in `unshare -n` with lo up to keep it on loopback)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.fleet import Fleet, FleetConfig
from actors.ray_backend import RayBackend
from actors.ray_launcher import NodeLauncher
from runtime.providers import make_provider
from runtime.providers.scenario import parse_scenario
from runtime.providers.scripted import ScenarioPlayback
from runtime.state.session_dir import SessionDir


def scenario(calls: int) -> str:
    return f"""
[fleet]
prompt = "benchmark"

[[agents.trunk]]
ral = ["let v = add 1 2"]
repeat = {calls}

[[agents.trunk]]
ral = ["reply $v"]
"""


def fleet_seconds(calls: int, backend: Any) -> float:
    """Wall time of a trunk making ``calls`` ral calls, from its start to its end."""
    playback = ScenarioPlayback(parse_scenario(scenario(calls)))
    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(
            SessionDir(Path(d)),
            lambda name: make_provider("scripted", scenario=playback, agent_name=name),
            FleetConfig(agents="process", backend=backend),
        )
        try:
            t = time.perf_counter()
            trunk = fleet.start_trunk("benchmark")
            while not fleet.wait_empty(0.01):
                pass
            seconds = time.perf_counter() - t
            assert trunk.replied, trunk.outcome
        finally:
            fleet.close()
    return seconds


def throughput_scenario(agents: int, calls: int) -> str:
    spawns = ", ".join(f"\"agent w{i} 'go'\"" for i in range(agents))
    return f"""
[fleet]
prompt = "benchmark"

[[agents.trunk]]
ral = [{spawns}]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = {agents}

[[agents.trunk]]
ral = ["reply 0"]

[[agents."w*"]]
ral = ["let v = add 1 2"]
repeat = {calls}

[[agents."w*"]]
ral = ["reply $v"]
"""


def throughput(backend: Any, agents: int, calls: int) -> float:
    """Ral calls per second of ``agents`` children making ``calls`` each."""
    playback = ScenarioPlayback(parse_scenario(throughput_scenario(agents, calls)))
    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(
            SessionDir(Path(d)),
            lambda name: make_provider("scripted", scenario=playback, agent_name=name),
            FleetConfig(agents="process", backend=backend),
        )
        try:
            t = time.perf_counter()
            fleet.start_trunk("benchmark")
            while not fleet.wait_empty(0.01):
                pass
            seconds = time.perf_counter() - t
            fy = fleet.close()
        except BaseException:
            fleet.close()
            raise
    assert fy.done == agents, fy
    return agents * (calls + 2) / seconds  # + the trunk's spawn call and each reply


def per_call(backend: Any, calls: int, extra: int, rounds: int) -> tuple[float, float]:
    """Medians over ``rounds`` of (T(calls + extra) - T(calls)) / extra, and of the rest of
    T(calls) (the trunk's host start, its end and shutdown), in seconds."""
    out, start = [], []
    for _ in range(rounds):
        small = fleet_seconds(calls, backend)
        large = fleet_seconds(calls + extra, backend)
        out.append((large - small) / extra)
        start.append(small - calls * out[-1])
    return statistics.median(out), statistics.median(start)


def bare_call(n: int) -> float:
    import ray

    host_class: Any = ray.remote(NodeLauncher)
    actor: Any = host_class.options(num_cpus=0).remote()
    try:
        ray.get(actor.ping.remote(0))
        times = []
        for i in range(n):
            t = time.perf_counter()
            ray.get(actor.ping.remote(i))
            times.append(time.perf_counter() - t)
    finally:
        ray.kill(actor)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ray-address")
    args = parser.parse_args()
    calls, extra, rounds, pings = (5, 20, 1, 200) if args.quick else (10, 100, 3, 2000)
    agents, agent_calls = (4, 10) if args.quick else (20, 50)
    backend = RayBackend(args.ray_address)
    backend._connect()
    try:
        bare = bare_call(pings)
        local, local_start = per_call(None, calls, extra, rounds)
        remote, remote_start = per_call(backend, calls, extra, rounds)
        local_rate = throughput(None, agents, agent_calls)
        ray_rate = throughput(backend, agents, agent_calls)
    finally:
        backend.close()
    overhead = remote - local
    row = {
        "bare_ray_call_ms": round(bare * 1e3, 3),
        "agent_call_local_ms": round(local * 1e3, 3),
        "agent_call_ray_ms": round(remote * 1e3, 3),
        "ray_overhead_ms": round(overhead * 1e3, 3),
        "overhead_over_bare": round(overhead / bare, 2),
        "host_start_and_stop_local_s": round(local_start, 3),
        "host_start_and_stop_ray_s": round(remote_start, 3),
        "agents": agents,
        "calls_per_agent": agent_calls,
        "throughput_local_calls_s": round(local_rate),
        "throughput_ray_calls_s": round(ray_rate),
    }
    print(json.dumps(row))
    print(
        f"bare Ray actor call {row['bare_ray_call_ms']} ms; one ral call through an agent: "
        f"local {row['agent_call_local_ms']} ms, Ray-hosted {row['agent_call_ray_ms']} ms; "
        f"Ray's overhead {row['ray_overhead_ms']} ms = {row['overhead_over_bare']}x the bare call"
    )
    print(
        f"a trunk's host started and stopped: local {row['host_start_and_stop_local_s']} s, "
        f"Ray {row['host_start_and_stop_ray_s']} s"
    )
    print(
        f"throughput, {agents} agents x {agent_calls} calls: local {round(local_rate)} calls/s, "
        f"Ray {round(ray_rate)} calls/s"
    )


if __name__ == "__main__":
    main()
