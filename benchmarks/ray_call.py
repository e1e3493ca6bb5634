"""One ral call through a Ray-hosted agent, beside a bare Ray actor call, in one run.

- bare: ``ray.get(a.ping.remote(x))`` on a live actor (the agent host's own actor class), the
  floor any Ray-hosted work pays per round trip;
- agent, local and ray: a real fleet (``actors/fleet.py``) on the scripted provider, one trunk
  making CALLS ral calls (``let v = add 1 2``, each a model turn, a tool call in its shell, the
  bus events and the journal) then replying; ``--agents process`` on this machine's fork server,
  then ``--backend ray``. The per-call figure is the difference of two runs (CALLS and
  CALLS + EXTRA calls) over EXTRA, so the host's start is not in it.

The issue's goal reads: (ray per call - local per call) <= 1.2 x the bare Ray call.

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
from actors.ray_backend import RayBackend, _RayHost
from runtime.providers import make_provider
from runtime.providers.scenario import parse_scenario
from runtime.providers.scripted import ScenarioPlayback
from runtime.session_dir import SessionDir


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


def per_call(backend: Any, calls: int, extra: int, rounds: int) -> float:
    """Median over ``rounds`` of (T(calls + extra) - T(calls)) / extra, in seconds."""
    out = []
    for _ in range(rounds):
        small = fleet_seconds(calls, backend)
        large = fleet_seconds(calls + extra, backend)
        out.append((large - small) / extra)
    return statistics.median(out)


def bare_call(n: int) -> float:
    import ray

    host_class: Any = ray.remote(_RayHost)
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
    backend = RayBackend(args.ray_address)
    backend._connect()
    try:
        bare = bare_call(pings)
        local = per_call(None, calls, extra, rounds)
        remote = per_call(backend, calls, extra, rounds)
    finally:
        backend.close()
    overhead = remote - local
    row = {
        "bare_ray_call_ms": round(bare * 1e3, 3),
        "agent_call_local_ms": round(local * 1e3, 3),
        "agent_call_ray_ms": round(remote * 1e3, 3),
        "ray_overhead_ms": round(overhead * 1e3, 3),
        "overhead_over_bare": round(overhead / bare, 2),
    }
    print(json.dumps(row))
    print(
        f"bare Ray actor call {row['bare_ray_call_ms']} ms; one ral call through an agent: "
        f"local {row['agent_call_local_ms']} ms, Ray-hosted {row['agent_call_ray_ms']} ms; "
        f"Ray's overhead {row['ray_overhead_ms']} ms = {row['overhead_over_bare']}x the bare call"
    )


if __name__ == "__main__":
    main()
