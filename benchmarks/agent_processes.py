"""Agents as processes (``--agents process``) beside agents as threads, in one run.

Every figure comes from a real fleet (``actors/fleet.py``) on the scripted provider; each
configuration runs in a fresh interpreter pinned to its cores before the fork server starts (so
every agent, shell and worker process inherits the pinning):

- throughput: N returning children, each making CALLS ral calls then replying; wall time from
  a starting gate (every child up and waiting at its first request) to the last settlement,
  ral calls per second, pinned to 1 core and to 2;
- control-process CPU per ral call (user + system of the control process alone; an agent
  process's own CPU is not in it), and the site round trips an agent process asked per ral call;
- with ``--split``, the CPU per ral call of the agent processes and of their shells, read from
  ``/proc`` every 50 ms by a separate sampler process (so the control figure stays its own);
- spawn latency: one ``Fleet.spawn`` of a busy agent (register, the agent process and its
  shell ready, the journal's admission), median and p90 over the held agents (spawned back to
  back), and the median of 20 more spawned 0.5 s apart (``spaced``: what a model delegating
  now and then sees; the process backend's warm pool is full then, while back-to-back spawns
  take the processes it forks as each spawn takes one);
- the cancel cascade: N children busy in ``sleep``, all cancelled at once, until every one is
  settled; its reach (median and last), from the first cancel to the instant each sleeper's
  evaluation was stopped (its shell host SIGKILLed by the terminal cancel: ``EvalRoot.killed_at``,
  reported in the agent's ``EndReport``), and the last cancelled ``sleep`` recorded in its
  agent's event log (to the millisecond: ``recorded``, an upper bound); the control process's CPU
  (user + system) per agent over that span; also the fan-out alone (the N ``registry.cancel``
  calls going out, wall and the cancelling thread's CPU) and the control CPU over the cascade
  by kind of thread; and when every sleeper's shell host was gone (an agent process SIGKILLs
  its shell at its end, and the kernel reclaims it in the idle class behind the ends in flight);
- PSS per agent (agent process + its shell, psutil's full memory info) with N agents live,
  read on the first 10.

    PYTHONPATH=. python benchmarks/agent_processes.py [--quick] [--agents 50] [--calls 50]
        [--hold 100] [--modes thread,process] [--split]
        [--lifecycle]     # spawn and cascade only, on 2 cores (no throughput runs)
        [--subtree]       # the cascade as one cancel of the held agents' parent's children
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.actors.agent_process import ProcessAgent, evaluating
from exarch_actors.actors.agent_site import SpawnRequest
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.process_identity import exited
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.constants import MAX_STEPS
from exarch_actors.runtime.messages import AssistantMessage, TranscriptItem
from exarch_actors.runtime.providers.base import RAL_TOOL, OnEvent, Provider, ToolSpec
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir


class GateFile(Provider):
    """The scripted provider behind a starting gate, a file: an agent's first request waits
    until ``path`` exists, so the throughput clock starts once every agent is up. A file, not
    an event, so that it crosses into an agent process (pickled with the provider)."""

    def __init__(self, inner: Provider, path: str) -> None:
        self.inner, self.path, self.waited = inner, path, False
        self.name, self.model, self.window_tokens = inner.name, inner.model, inner.window_tokens

    def for_agent(self, agent_name: str) -> Provider:
        return GateFile(self.inner.for_agent(agent_name), self.path)

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        if not self.waited:
            self.waited = True
            while not os.path.exists(self.path):
                cancel.check()
                time.sleep(GATE_POLL)
        return self.inner.complete(
            transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
        )


GATE_POLL = 0.02
"""Seconds between an agent's looks at the gate: at 2 ms, 200 agents waiting on one core
(``--agents 200``, pinned) woke 100,000 times a second, which starved the agents still booting
(at nice 5, :data:`actors.priority.AGENT_NICE`, like the waiting ones) for minutes; at 20 ms the
start is at most 20 ms late on a wall of 1-13 s."""


PSS_SAMPLE = 10
"""Held agents whose PSS is read: ``/proc/PID/smaps`` takes seconds per process on a loaded
box, and the cascade must start while every sleeper still sleeps."""


def scenario(calls: int) -> str:
    return f"""
[fleet]
prompt = "benchmark"

[[agents.trunk]]
text = "noted"
repeat = 1000

[[agents."worker-*"]]
ral = ["let v = add 1 2"]
repeat = {calls}

[[agents."worker-*"]]
ral = ["reply $v"]

[[agents."sleeper-*"]]
ral = ["sleep 600"]

[[agents."sleeper-*"]]
ral = ["reply 0"]
"""


def _wait(cond: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {limit:g} s")
        time.sleep(0.002)


def _wait_all(events: Sequence[threading.Event], limit: float, what: str) -> None:
    """Block until every one of ``events`` is set, without polling: the measured fleet has the
    cores to itself. A 2 ms poll of the spawn tree (the throughput's end) took 3-6 % of a core
    from 200 agents, and even a cheap 2 ms poll woke the control process 500 times a second
    in the cascade's window."""
    deadline = time.monotonic() + limit
    for event in events:
        if not event.wait(max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"{what}: not within {limit:g} s")


def _pss(pid: int | None) -> int:
    if not pid:
        return 0
    try:
        return int(psutil.Process(pid).memory_full_info().pss)
    except psutil.Error:
        return 0


SPACED = 20
SPACE = 0.5
"""Spawns measured one at a time, this many seconds apart (``spaced``: about a model's turn);
no more than the agents held busy, so a ``--quick`` smoke run (four configurations, each held
at 5) sleeps 10 s in all instead of 40 s of the suite's benchmark smoke test."""


SAMPLER = """
import json, os, select, sys
pids = [int(p) for p in sys.argv[1:]]
def cpu(pid):  # schedstat's first field: ns on a CPU, every thread (stat's ticks are 10 ms)
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
print("ready", flush=True)
sys.stdin.readline()
first = {p: cpu(p) for p in pids}
last = dict(first)
while True:
    for p in pids:
        v = cpu(p)
        if v is not None:
            last[p] = v
    if select.select([sys.stdin], [], [], 0.05)[0]:
        break
print(json.dumps({p: (last[p] or 0) - (first[p] or 0) for p in pids}))
"""
"""The ``--split`` sampler, a separate process: the last CPU reading of each agent process and
shell before it ends (sampling in the control process would charge its reads to the control
figure)."""


class _Split:
    """The ``--split`` sampler: started with the pids, started at the gate, read at the end."""

    def __init__(self, pids: list[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SAMPLER, *map(str, pids)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def read(self) -> dict[int, float]:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        return {int(k): float(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def one(
    mode: str, n: int, calls: int, hold: int, split: bool = False, subtree: bool = False
) -> dict[str, Any]:
    """One configuration in this interpreter (already pinned by the caller)."""
    ensure_fork_server()
    playback = ScenarioPlayback(parse_scenario(scenario(calls)))
    me = psutil.Process()
    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(SessionDir.at(d), playback.provider, FleetConfig(agents=mode))  # type: ignore[arg-type]
        try:
            fleet.start_trunk(None, interactive=True)
            gate = os.path.join(d, "gate")
            from benchmarks.agent_processes import GateFile  # importable by an agent process

            parent = GateFile(playback.provider("trunk"), gate)
            for i in range(n):
                fleet.spawn(SpawnRequest("trunk", f"worker-{i:03d}", "go", None, parent))
            workers = [fleet.hosted[f"worker-{i:03d}"] for i in range(n)]
            hosts = [a for a in workers if isinstance(a, ProcessAgent)]
            agent_pids = [a.pid for a in hosts]
            shell_pids = [p for a in hosts if (p := a.shell_pid())]
            sampler = _Split(agent_pids + shell_pids) if split and hosts else None
            if sampler is not None:
                sampler.go()
            cpu0 = sum(me.cpu_times()[:2])
            t0 = time.perf_counter()
            Path(gate).touch()
            _wait_all([a.done for a in workers], 900, "throughput")
            wall = time.perf_counter() - t0
            cpu = sum(me.cpu_times()[:2]) - cpu0
            done = sum(a.stats.ral_calls for a in workers)
            if done != n * (calls + 1):  # each worker's calls and its reply
                raise RuntimeError(
                    f"the workers made {done} ral calls, not {n * (calls + 1)}: a turn is capped "
                    f"at {MAX_STEPS} provider round-trips, so --calls must stay below that"
                )
            work = max(n * calls, 1)
            split_ms: dict[str, float] = {}
            if sampler is not None:
                used = sampler.read()
                split_ms = {
                    "agent_ms": sum(used.get(p, 0.0) for p in agent_pids) / work * 1e3,
                    "shell_ms": sum(used.get(p, 0.0) for p in shell_pids) / work * 1e3,
                }
            round_trips = sum(sum(a.site_calls.values()) for a in hosts)
            plain = playback.provider("trunk")  # what a spawn costs without the gate's import
            spaced: list[float] = []
            for i in range(min(SPACED, hold)):  # --quick (hold 5): 2.5 s of spacing, not 10 s
                time.sleep(SPACE)
                t = time.perf_counter()
                fleet.spawn(SpawnRequest("trunk", f"sleeper-s{i:02d}", "go", None, plain))
                spaced.append(time.perf_counter() - t)
            if subtree:  # the held agents are then the trunk's only children
                spaced_names = [f"sleeper-s{i:02d}" for i in range(len(spaced))]
                for name in spaced_names:
                    fleet.registry.cancel(name, "benchmark")
                _wait_all([fleet.hosted[x].done for x in spaced_names], 300, "s")
            spawns: list[float] = []
            for i in range(hold):
                t = time.perf_counter()
                fleet.spawn(SpawnRequest("trunk", f"sleeper-{i:03d}", "go", None, plain))
                spawns.append(time.perf_counter() - t)
            names = [f"sleeper-{i:03d}" for i in range(hold)]
            _wait(lambda: all(_sleeping(fleet, x) for x in names), 300, "sleepers busy")
            pss = 0
            sampled = names[:PSS_SAMPLE]
            for name in sampled:
                agent = fleet.hosted[name]
                pss += _pss(_shell_pid(agent))
                if isinstance(agent, ProcessAgent):
                    pss += _pss(agent.pid)
            shells = [_shell_pid(fleet.hosted[x]) for x in names]
            cascade_cpu0 = sum(me.cpu_times()[:2])
            threads0 = _thread_cpu()
            t = time.perf_counter()
            wall0 = time.time()
            own0 = time.thread_time()
            if subtree:  # one cascade from their parent, the trunk (which goes on)
                fleet.registry.cancel_descendants("trunk", "benchmark")
            else:
                for name in names:
                    fleet.registry.cancel(name, "benchmark")
            fanout = time.perf_counter() - t
            fanout_cpu = time.thread_time() - own0
            # every one ended and settled by its spawn site (``done`` is set after the settle)
            _wait_all([fleet.hosted[x].done for x in names], 300, "cascade")
            cascade = time.perf_counter() - t
            cascade_cpu = sum(me.cpu_times()[:2]) - cascade_cpu0
            threads = _thread_cpu()
            # then every shell host gone: an agent process SIGKILLs its shell at its end and the
            # kernel reclaims it in the idle class, behind the ends still in flight
            _wait(_all_gone(shells), 300, "shells gone")
            gone = time.perf_counter() - t
            reach = sorted(_eval_stopped_at(fleet.hosted[x]) - wall0 for x in names)
            recorded = max(_stopped_at(fleet, x) for x in names) - wall0
            by_kind: dict[str, float] = {}
            for tid, (kind, ns) in threads.items():
                spent = ns - threads0.get(tid, (kind, 0))[1]
                by_kind[kind] = by_kind.get(kind, 0.0) + spent / 1e6
        finally:
            fleet.close()
    return {
        "mode": mode,
        "wall": wall,
        "cps": work / wall,
        "cpu_per_call_ms": cpu / work * 1e3,
        "round_trips_per_call": round_trips / work,
        **split_ms,
        "spawn_median_ms": statistics.median(spawns) * 1e3,
        "spawn_p90_ms": sorted(spawns)[int(len(spawns) * 0.9)] * 1e3,
        "spawn_spaced_ms": statistics.median(spaced) * 1e3,
        "cascade_ms": cascade * 1e3,
        "cascade_ctl_ms_per_agent": cascade_cpu / max(hold, 1) * 1e3,
        "cascade_fanout_ms": fanout * 1e3,
        "cascade_shells_gone_ms": gone * 1e3,
        "cascade_reach_median_ms": statistics.median(reach) * 1e3,
        "cascade_reach_max_ms": reach[-1] * 1e3,
        "cascade_recorded_max_ms": recorded * 1e3,
        "cascade_fanout_cpu_ms": fanout_cpu * 1e3,
        "cascade_ctl_threads_ms": {k: round(v, 1) for k, v in sorted(by_kind.items()) if v >= 1},
        "pss_per_agent_mib": pss / max(len(sampled), 1) / 2**20,
    }


def _thread_cpu() -> dict[int, tuple[str, int]]:
    """This process's threads: tid -> (name without its digits, ns on a CPU), from
    ``/proc/self/task``, so the cascade's control CPU can be split by kind of thread."""
    named = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = named.get(int(task.name)) or (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        out[int(task.name)] = ("".join(c for c in comm if not c.isdigit()).rstrip("-_"), ns)
    return out


def _stopped_at(fleet: Fleet, name: str) -> float:
    """When ``name``'s cancelled ``sleep`` was recorded (its last tool result's ``at``, to the
    millisecond, ``time.time`` scale): an upper bound on when the cascade reached its shell's
    running eval (the host answered the cancel before the agent recorded the answer)."""
    at = ""
    for line in fleet.session.events(name).read_text().splitlines():
        if line.startswith('{"kind": "tool_result"'):
            at = json.loads(line)["at"]
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def _eval_stopped_at(agent: Any) -> float:
    """When the cascade stopped ``agent``'s running evaluation (``time.time`` scale): the
    SIGKILL of its busy shell host by the terminal cancel (``EvalRoot.killed_at``)."""
    at = agent.eval_stopped_at if isinstance(agent, ProcessAgent) else agent.eval_root.killed_at
    if at is None:
        raise RuntimeError(f"{agent.name}: the cascade stopped no evaluation of it")
    return float(at)


def _shell_pid(agent: Any) -> int | None:
    """Its shell host's pid without a round trip to a shell busy in a run (a thread agent's
    ``shell_pid()`` waits for the shell actor)."""
    return agent.shell_pid() if isinstance(agent, ProcessAgent) else agent.last_shell_pid


def _all_gone(pids: list[int | None]) -> Any:
    """A condition: every one of ``pids`` has exited (a zombie has: its memory is reclaimed).
    Each check reads only until the first that still runs: a poll of them all, every 2 ms,
    took a core's share from the processes it waited for."""
    left = [p for p in pids if p]

    def gone() -> bool:
        while left:
            if not exited(left[-1]):
                return False
            left.pop()
        return True

    return gone


def _sleeping(fleet: Fleet, name: str) -> bool:
    """Whether ``name``'s shell is running its ``sleep``: its call is in its event log, and
    its shell evaluating (:func:`actors.agent_process.evaluating`). The log alone was not
    enough: the call is recorded before the run reaches the shell, and a cancel in between
    stops no evaluation (a ``--quick`` smoke run on a loaded box cancelled one so)."""
    return evaluating(fleet.hosted[name], fleet.session.events(name))


def _run(
    mode: str, n: int, calls: int, hold: int, cores: str, split: bool, subtree: bool = False
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        mode,
        "--agents",
        str(n),
        "--calls",
        str(calls),
        "--hold",
        str(hold),
        "--cores",
        cores,
        *(["--split"] if split else []),
        *(["--subtree"] if subtree else []),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 5 agents x 5 calls")
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--hold", type=int, default=100, help="agents held busy (cascade, PSS)")
    ap.add_argument("--modes", default="thread,process", help="backends to run, in order")
    ap.add_argument(
        "--split", action="store_true", help="also the agent processes' and shells' CPU per call"
    )
    ap.add_argument(
        "--subtree",
        action="store_true",
        help="cancel the held agents as one cascade from their parent, not one cancel each",
    )
    ap.add_argument(
        "--lifecycle", action="store_true", help="spawn and cascade only (2 cores, 1 agent)"
    )
    ap.add_argument("--one", choices=["thread", "process"], help=argparse.SUPPRESS)
    ap.add_argument("--cores", default="0,1", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
        r = one(args.one, args.agents, args.calls, args.hold, args.split, args.subtree)
        print(json.dumps(r))
        return
    n, calls, hold = (5, 5, 5) if args.quick else (args.agents, args.calls, args.hold)
    both = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    if args.lifecycle:
        print(f"load average {os.getloadavg()[0]:.1f}; {hold} agents held busy")
        print(
            f"{'mode':<8} {'spawn med ms':>12} {'p90':>7} {'spaced ms':>9} {'cascade ms':>10} "
            f"{'ctl ms/agent':>12} {'fan-out ms':>10} {'reach med/max ms':>16} "
            f"{'recorded':>8} {'shells gone ms':>14}"
        )
        for mode in ("thread", "process"):
            r = _run(mode, 1, 1, hold, both, False, args.subtree)
            print(
                f"{mode:<8} {r['spawn_median_ms']:>12.1f} {r['spawn_p90_ms']:>7.1f} "
                f"{r['spawn_spaced_ms']:>9.1f} {r['cascade_ms']:>10.0f} "
                f"{r['cascade_ctl_ms_per_agent']:>12.2f} {r['cascade_fanout_ms']:>10.0f} "
                f"{r['cascade_reach_median_ms']:>8.0f}/{r['cascade_reach_max_ms']:<7.0f} "
                f"{r['cascade_recorded_max_ms']:>8.0f} {r['cascade_shells_gone_ms']:>14.0f}",
                flush=True,
            )
        return
    print(f"{n} agents x {calls} ral calls; {hold} agents held busy for the cascade and PSS")
    print(
        f"{'mode':<8} {'cores':>5} {'wall s':>7} {'calls/s':>8} {'ctl ms/call':>11} "
        f"{'spawn med ms':>12} {'p90':>7} {'spaced':>7} {'cascade ms':>10} {'PSS/agent MiB':>13}"
    )
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        for cores in ("0", both):
            r = _run(mode, n, calls, hold, cores, args.split, args.subtree)
            rows[(mode, cores)] = r
            extra = (
                f" round trips/call {r['round_trips_per_call']:.3f}" if mode == "process" else ""
            )
            if "agent_ms" in r:
                extra += f"; agent {r['agent_ms']:.3f} + shell {r['shell_ms']:.3f} ms/call"
            print(
                f"{mode:<8} {cores:>5} {r['wall']:>7.2f} {r['cps']:>8.0f} "
                f"{r['cpu_per_call_ms']:>11.3f} {r['spawn_median_ms']:>12.1f} "
                f"{r['spawn_p90_ms']:>7.1f} {r['spawn_spaced_ms']:>7.1f} {r['cascade_ms']:>10.0f} "
                f"{r['pss_per_agent_mib']:>13.1f}{extra}",
                flush=True,
            )
    for mode in modes:
        speedup = rows[(mode, "0")]["wall"] / rows[(mode, both)]["wall"]
        print(f"{mode}: 2 cores vs 1 core speed-up {speedup:.2f}x")
    if {"thread", "process"} <= set(modes):
        ratio = rows[("process", both)]["cps"] / rows[("thread", both)]["cps"]
        print(f"process vs thread throughput on {both}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
