"""Fleet throughput: 10, 50 and 200 agents each making 50 ral calls, on this machine.

An interactive trunk (it parks for its human, so it never quiesces mid-benchmark) forks N
returning children through the spawn site (``Fleet.spawn``, the ``agent`` verb's path:
registry, journal admission, one shell process each). Every child plays the scripted pattern
``worker-*``: 50 round-trips of one ral call each (``let v = add 1 2``, so each call changes a
binding and checkpoints), then ``reply``. The trunk answers each child result with one text-only
round-trip, as a real parent turn would.

The children's first provider request waits at a starting gate until all N are alive, so the
memory figure is N live agents at once and the clock starts when they all may run. Reported per
fleet size: wall time from opening the gate to the last child settled, ral calls per second
(children's calls, replies excluded), and memory: psutil RSS summed over the control process
and every descendant process (the shells), at the gate (all N alive) and at the peak (a sampler
thread, every 100 ms). Per agent = (gate - baseline) / N. RSS counts pages shared with the fork
server once per process, so it over-states what one more agent costs; USS (unique pages) at the
gate is printed beside it.

    python benchmarks/fleet_throughput.py [--quick] [--sizes 10,50,200] [--calls 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.actors.agent import Agent
from exarch_actors.actors.agent_site import SpawnRequest
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import AssistantMessage, TranscriptItem
from exarch_actors.runtime.providers.base import RAL_TOOL, OnEvent, Provider, ToolSpec
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir

MiB = 1024 * 1024


def scenario(n: int, calls: int) -> str:
    return f"""
[fleet]
prompt = "benchmark"

[[agents.trunk]]
text = "noted"
repeat = {n + 10}

[[agents."worker-*"]]
ral = ["let v = add 1 2"]
repeat = {calls}

[[agents."worker-*"]]
ral = ["reply $v"]
"""


class Sampler:
    """Peak RSS of this process plus all its descendants, sampled on a daemon thread."""

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.peak = 0
        self.peak_procs = 0
        self.peak_uss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    @staticmethod
    def sample(uss: bool = False) -> tuple[int, int, int]:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        rss = total_uss = 0
        for p in procs:
            try:
                if uss:
                    info = p.memory_full_info()
                    rss += info.rss
                    total_uss += info.uss
                else:
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
        return rss, len(procs), total_uss

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            rss, n, _ = self.sample()
            if rss > self.peak:
                self.peak, self.peak_procs = rss, n

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Gated(Provider):
    """The scripted provider behind a starting gate: the first request waits for ``gate``.

    The trunk's own gate is open; the children it forks (``for_agent``, the spawn site's
    path) wait at ``child_gate``."""

    def __init__(
        self, inner: Provider, gate: threading.Event, child_gate: threading.Event | None = None
    ) -> None:
        self.inner, self.gate, self.waited = inner, gate, False
        self.child_gate = child_gate or gate
        self.name, self.model, self.window_tokens = inner.name, inner.model, inner.window_tokens

    def for_agent(self, agent_name: str) -> Provider:
        return Gated(self.inner.for_agent(agent_name), self.child_gate)

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
            while not self.gate.wait(0.05):
                cancel.check()
        return self.inner.complete(
            transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
        )


def wait_all_gated(fleet: Fleet, n: int) -> None:
    """Until every child is live and waiting at the gate (its first request in flight)."""
    deadline = time.monotonic() + 120
    while True:
        kids = [a for a in list(fleet.agents.values()) if a.parent is not None]
        if len(kids) == n and all(a.stats.steps >= 1 for a in kids):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("children did not reach the gate in 2 minutes")
        time.sleep(0.01)


def run(n: int, calls: int) -> dict[str, float]:
    playback = ScenarioPlayback(parse_scenario(scenario(n, calls)))
    gate = threading.Event()

    opened = threading.Event()
    opened.set()

    def provider_for(name: str) -> Provider:
        return Gated(playback.provider(name), opened, gate)

    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(SessionDir.at(d), provider_for, FleetConfig())
        try:
            trunk = fleet.start_trunk(None, interactive=True)
            assert isinstance(trunk, Agent)
            base_rss, _, base_uss = Sampler.sample(uss=True)
            sampler = Sampler().start()
            for i in range(n):
                request = SpawnRequest(
                    trunk.name, f"worker-{i:03d}", "make calls", None, trunk.provider.current()
                )
                child = fleet.spawn(request)
                assert child["status"] == "started"
            wait_all_gated(fleet, n)
            gate_rss, gate_procs, gate_uss = Sampler.sample(uss=True)
            t0 = time.perf_counter()
            gate.set()
            deadline = time.monotonic() + 600
            while fleet.registry.live_descendants(trunk.name):
                if time.monotonic() > deadline:
                    raise RuntimeError("the fleet did not settle in 10 minutes")
                time.sleep(0.01)
            wall = time.perf_counter() - t0
            sampler.stop()
            agents = [a for a in fleet.agents.values() if a.parent is not None]
            done = sum(1 for a in agents if a.outcome is not None and a.outcome.value == "replied")
            ral = sum(a.stats.ral_calls for a in agents)
        finally:
            gate.set()
            fleet.close()
    if done != n:
        raise RuntimeError(f"only {done} of {n} children replied")
    work = ral - n  # the reply calls are not the workload
    return {
        "n": n,
        "wall": wall,
        "calls": work,
        "cps": work / wall,
        "base_mib": base_rss / MiB,
        "gate_mib": gate_rss / MiB,
        "peak_mib": max(sampler.peak, gate_rss) / MiB,
        "procs": gate_procs,
        "per_agent_rss_mib": (gate_rss - base_rss) / n / MiB,
        "per_agent_uss_mib": (gate_uss - base_uss) / n / MiB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 5 and 20 agents x 10 calls")
    ap.add_argument("--sizes", default="10,50,200", help="fleet sizes, comma-separated")
    ap.add_argument("--calls", type=int, default=50, help="ral calls per agent")
    args = ap.parse_args()
    sizes = [5, 20] if args.quick else [int(s) for s in args.sizes.split(",")]
    calls = 10 if args.quick else args.calls
    ensure_fork_server()
    print(f"{os.cpu_count()} cores; each agent makes {calls} ral calls (one per round-trip)")
    print(
        f"{'agents':>6} {'wall s':>7} {'calls':>6} {'calls/s':>8} {'base MiB':>9} "
        f"{'all-live MiB':>12} {'peak MiB':>9} {'procs':>5} {'RSS/agent':>10} {'USS/agent':>10}"
    )
    for n in sizes:
        r = run(n, calls)
        print(
            f"{r['n']:>6} {r['wall']:>7.2f} {r['calls']:>6.0f} {r['cps']:>8.0f} "
            f"{r['base_mib']:>9.1f} {r['gate_mib']:>12.1f} {r['peak_mib']:>9.1f} "
            f"{r['procs']:>5.0f} {r['per_agent_rss_mib']:>8.1f} M {r['per_agent_uss_mib']:>8.1f} M",
            flush=True,
        )


if __name__ == "__main__":
    main()
