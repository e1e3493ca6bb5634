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

- host start per agent: a trunk starts N children that reply at once; (T(N) - T(0)) / N, each
  child's host started, its one call and reply, its host stopped (the trunk spawns one after the
  other). Local process backend, Ray backend, and with ``--base DIR`` (a ``git archive`` copy of
  an earlier tree) the Ray backend of that tree too, run by this script in a subprocess against
  the same cluster, rounds interleaved.

- ``--steady-only ROUNDS``: only the bare call and the per-call figure within one run
  (:func:`steady_per_call`), local and Ray-hosted interleaved, as one JSON line: run two trees'
  copies of this script in turns for a before/after (docs/benchmarks.md, issue 40).

    PYTHONPATH=. python benchmarks/ray_call.py [--quick] [--ray-address HOST:PORT] [--base DIR]
    (no address: a local Ray instance; run it in `unshare -n` with lo up to keep it on loopback)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

# the tree measured: this one, or (``--base``'s subprocess) an earlier one
sys.path.insert(0, os.environ.get("RAY_CALL_CODE") or str(Path(__file__).resolve().parents[1]))

from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.ray_backend import RayBackend
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir


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


def _timed_fleet(
    toml: str,
    backend: Any,
    *,
    through_close: bool = False,
    inspect: Callable[[SessionDir], None] | None = None,
) -> tuple[float, Any, Any]:
    """Run ``toml``'s fleet on ``backend`` (None: this machine's fork server); the seconds from
    the trunk's start to the fleet empty (``through_close``: to the fleet closed, every host
    stopped), the trunk, and the fleet's yield. ``inspect`` reads the session directory after
    the close, before it is removed."""
    playback = ScenarioPlayback(parse_scenario(toml))
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
            fy = fleet.close()
            if through_close:
                seconds = time.perf_counter() - t
        except BaseException:
            fleet.close()
            raise
        if inspect is not None:
            inspect(SessionDir(Path(d)))
    return seconds, trunk, fy


def _tool_result_times(session: SessionDir) -> list[float]:
    """The trunk's tool results' timestamps (ms resolution), in seconds, in order."""
    out = []
    for line in session.events("trunk").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "tool_result":
            at = datetime.fromisoformat(str(r["at"]).replace("Z", "+00:00"))
            out.append(at.timestamp())
    return out


def steady_per_call(backend: Any, calls: int, skip: int = 15) -> float:
    """Seconds per ral call inside one run: the span from the ``skip``-th tool result to the
    ``skip``-th from the end over the calls between. Within one run, so a host's start and
    stop (tens of ms of noise, which swamped :func:`per_call`'s difference of two runs) are
    not in it; the timestamps' 1 ms resolution is 5 us a call over 200 calls."""
    times: list[float] = []
    _, trunk, _ = _timed_fleet(
        scenario(calls), backend, inspect=lambda s: times.extend(_tool_result_times(s))
    )
    assert trunk.replied, trunk.outcome
    window = times[skip : len(times) - skip]
    return (window[-1] - window[0]) / (len(window) - 1)


def fleet_seconds(calls: int, backend: Any) -> float:
    """Wall time of a trunk making ``calls`` ral calls, from its start to its end."""
    seconds, trunk, _ = _timed_fleet(scenario(calls), backend)
    assert trunk.replied, trunk.outcome
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
    seconds, _, fy = _timed_fleet(throughput_scenario(agents, calls), backend)
    assert fy.done == agents, fy
    return agents * (calls + 2) / seconds  # + the trunk's spawn call and each reply


def spawn_scenario(agents: int) -> str:
    spawns = ", ".join(f"\"agent w{i} 'go'\"" for i in range(agents))
    trunk = (
        f"""
[[agents.trunk]]
ral = [{spawns}]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = {agents}
"""
        if agents
        else ""
    )
    return f"""
[fleet]
prompt = "benchmark"
{trunk}
[[agents.trunk]]
ral = ["reply 0"]

[[agents."w*"]]
ral = ["reply 1"]
"""


def spawn_run(backend: Any, agents: int) -> float:
    """Seconds from the trunk's start to the fleet closed, the trunk starting ``agents``
    children that reply at once."""
    seconds, _, fy = _timed_fleet(spawn_scenario(agents), backend, through_close=True)
    assert fy.done == agents, fy
    return seconds


def host_start(backend: Any, agents: int) -> float:
    """Seconds per child: (T(agents) - T(0)) / agents, one round."""
    return (spawn_run(backend, agents) - spawn_run(backend, 0)) / agents


def base_host_start(base: str, address: str, agents: int) -> float:
    """:func:`host_start` of the Ray backend of the tree at ``base`` (this script in a
    subprocess with that tree first on its path and as its working directory, which Ray puts on
    its workers' path), on the cluster at ``address``."""
    env = {**os.environ, "RAY_CALL_CODE": base, "PYTHONPATH": base}
    p = subprocess.run(
        [sys.executable, __file__, "--host-start-only", str(agents), "--ray-address", address],
        capture_output=True, text=True, env=env, check=False, cwd=base,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["code"].startswith(base), out
    return float(out["host_start_s"])


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

    from exarch_actors.actors.ray_launcher import NodeLauncher

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
    parser.add_argument("--base", help="an earlier tree: its Ray backend's host start too")
    parser.add_argument("--host-start-only", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument(
        "--steady-only",
        type=int,
        metavar="ROUNDS",
        help="only the bare call and the per-call figure within one run, ROUNDS rounds",
    )
    args = parser.parse_args()
    if args.steady_only:
        steady_only(args.ray_address, args.steady_only, 60 if args.quick else 230)
        return
    if args.host_start_only:  # --base's subprocess
        code = os.environ.get("RAY_CALL_CODE")
        if code:  # this job's Ray workers import that tree too (not the installed one)
            import ray

            ray.init(
                address=args.ray_address,
                runtime_env={"env_vars": {"PYTHONPATH": code}},
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        backend = RayBackend(args.ray_address)
        try:
            spawn_run(backend, 1)  # warm: Ray's connection, this tree's first actors
            start = host_start(backend, args.host_start_only)
        finally:
            backend.close()
        import exarch_actors.actors as actors_package

        print(json.dumps({"code": actors_package.__file__, "host_start_s": start}))
        return
    calls, extra, rounds, pings = (5, 20, 1, 200) if args.quick else (10, 100, 3, 2000)
    agents, agent_calls = (4, 10) if args.quick else (20, 50)
    spawns = 4 if args.quick else 10
    steady_calls = 60 if args.quick else 230  # a turn's steps are capped at MAX_STEPS (250)
    backend = RayBackend(args.ray_address)
    backend._connect()
    starts: dict[str, list[float]] = {"local": [], "ray": [], "base": []}
    try:
        address = args.ray_address or require_address()
        bare = bare_call(pings)
        spawn_run(None, 1)
        spawn_run(backend, 1)  # warm: a launcher on the node(s) the children use
        for _ in range(rounds):
            starts["local"].append(host_start(None, spawns))
            starts["ray"].append(host_start(backend, spawns))
            if args.base:
                starts["base"].append(base_host_start(args.base, address, spawns))
        local, local_start = per_call(None, calls, extra, rounds)
        remote, remote_start = per_call(backend, calls, extra, rounds)
        steady: dict[str, list[float]] = {"local": [], "ray": []}
        for _ in range(rounds):  # interleaved: the box's load falls on both alike
            steady["local"].append(steady_per_call(None, steady_calls))
            steady["ray"].append(steady_per_call(backend, steady_calls))
        local_rate = throughput(None, agents, agent_calls)
        ray_rate = throughput(backend, agents, agent_calls)
    finally:
        backend.close()
    start_local = statistics.median(starts["local"])
    start_ray = statistics.median(starts["ray"])
    start_base = statistics.median(starts["base"]) if starts["base"] else None
    overhead = remote - local
    steady_local = statistics.median(steady["local"])
    steady_ray = statistics.median(steady["ray"])
    steady_overhead = steady_ray - steady_local
    row = {
        "bare_ray_call_ms": round(bare * 1e3, 3),
        "agent_call_local_ms": round(local * 1e3, 3),
        "agent_call_ray_ms": round(remote * 1e3, 3),
        "ray_overhead_ms": round(overhead * 1e3, 3),
        "overhead_over_bare": round(overhead / bare, 2),
        "steady_calls": steady_calls,
        "steady_call_local_ms": round(steady_local * 1e3, 3),
        "steady_call_ray_ms": round(steady_ray * 1e3, 3),
        "steady_overhead_ms": round(steady_overhead * 1e3, 3),
        "bare_plus_overhead_over_bare": round((bare + steady_overhead) / bare, 3),
        "host_start_and_stop_local_s": round(local_start, 3),
        "host_start_and_stop_ray_s": round(remote_start, 3),
        "agents": agents,
        "calls_per_agent": agent_calls,
        "throughput_local_calls_s": round(local_rate),
        "throughput_ray_calls_s": round(ray_rate),
        "host_start_per_agent_local_s": round(start_local, 4),
        "host_start_per_agent_ray_s": round(start_ray, 4),
        "host_start_per_agent_ray_base_s": None if start_base is None else round(start_base, 4),
        "host_start_ray_over_local": round(start_ray / start_local, 2),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }
    print(json.dumps(row))
    print(
        f"bare Ray actor call {row['bare_ray_call_ms']} ms; one ral call through an agent: "
        f"local {row['agent_call_local_ms']} ms, Ray-hosted {row['agent_call_ray_ms']} ms; "
        f"Ray's overhead {row['ray_overhead_ms']} ms = {row['overhead_over_bare']}x the bare call"
    )
    print(
        f"within one run of {steady_calls} calls (median of {rounds}): local "
        f"{row['steady_call_local_ms']} ms, Ray-hosted {row['steady_call_ray_ms']} ms a call; "
        f"(bare + overhead) / bare = {row['bare_plus_overhead_over_bare']}x (goal: 1.2x)"
    )
    print(
        f"a trunk's host started and stopped: local {row['host_start_and_stop_local_s']} s, "
        f"Ray {row['host_start_and_stop_ray_s']} s"
    )
    print(
        f"throughput, {agents} agents x {agent_calls} calls: local {round(local_rate)} calls/s, "
        f"Ray {round(ray_rate)} calls/s"
    )
    base = "" if start_base is None else f", the base tree's Ray backend {start_base:.3f} s"
    print(
        f"host start per agent (median of {rounds} x {spawns} children): local "
        f"{start_local:.3f} s, Ray {start_ray:.3f} s "
        f"({row['host_start_ray_over_local']}x local){base}"
    )


def steady_only(address: str | None, rounds: int, calls: int) -> None:
    """``--steady-only``: the bare Ray call and :func:`steady_per_call`, local and Ray-hosted
    interleaved, one JSON line (for before/after runs of two trees taken in turns)."""
    backend = RayBackend(address)
    backend._connect()
    steady: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        bare = bare_call(2000)
        spawn_run(backend, 1)  # warm: a launcher on the node the trunk uses
        for _ in range(rounds):
            steady["local"].append(steady_per_call(None, calls))
            steady["ray"].append(steady_per_call(backend, calls))
    finally:
        backend.close()
    local, ray_ = statistics.median(steady["local"]), statistics.median(steady["ray"])
    import exarch_actors.actors as actors_package

    print(
        json.dumps(
            {
                "code": actors_package.__file__,
                "bare_ray_call_ms": round(bare * 1e3, 3),
                "steady_call_local_ms": round(local * 1e3, 3),
                "steady_call_ray_ms": round(ray_ * 1e3, 3),
                "steady_local_all_ms": [round(x * 1e3, 3) for x in steady["local"]],
                "steady_ray_all_ms": [round(x * 1e3, 3) for x in steady["ray"]],
                "bare_plus_overhead_over_bare": round((bare + ray_ - local) / bare, 3),
                "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            }
        )
    )


def require_address() -> str:
    """The address of the Ray instance this process is connected to (for ``--base``)."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


if __name__ == "__main__":
    main()
