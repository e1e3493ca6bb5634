"""A thousand agents at once: how a fleet of process agents grows (issue 33).

One trunk forks N children in one ral call (``for i in (range N) { agent ... }``), each child
busy in ``sleep 600``, then waits for them (``agent-wait``); once every child is born the whole
tree below the trunk is cancelled. Every figure comes from a real fleet (``actors/fleet.py``,
``--agents process``, the scripted provider), one configuration per fresh interpreter:

- spawn ms per agent: from the first child's ``Born`` to the last's, over N - 1 (the cost of
  one more child while the others live: flat if the spawn does not slow as the tree grows);
- peak live: the most children alive together (``Born`` seen, no ``Died`` yet), and the
  seconds from the first child's ``Born`` until all N were;
- PSS per agent: its agent process plus its shell host (``/proc/PID/smaps_rollup``), summed
  over every child once all are born and idle in their ``sleep``, over N;
- spawn ms per agent over the first and the last tenth of the births (flat: the same);
- cascade ms: one ``cancel_descendants`` of the trunk until every child is settled, and until
  every child's agent process and shell host has exited as well;
- control CPU per spawn: the control process's user + system CPU from the trunk's first
  request to the last ``Born``, over N;
- with ``--detail``, a second table per child: the agent process's and the fork server's CPU,
  minor faults of an agent process and of a shell host, the PSS of each (:data:`DETAIL`).

    PYTHONPATH=. python benchmarks/thousand_agents.py [--quick] [--detail] [--sizes 10,100,300,1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.process import ensure_fork_server, start_process
from exarch_actors.actors.process_identity import exited
from exarch_actors.runtime.events import Born, Died
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir

SIZES = (10, 100, 300, 1000)
QUICK_SIZES = (10, 50)


def scenario(n: int) -> str:
    return f"""
[fleet]
prompt = "benchmark"

[[agents.trunk]]
ral = ['for i in (range {n}) {{ agent "c-$i" "hold" }}']

[[agents.trunk]]
ral = ["agent-wait"]

[[agents."c-*"]]
ral = ["sleep 600"]
"""


def pss(pid: int | None) -> int:
    """Bytes of proportional set size (0 for a process gone)."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def faults_of(pid: int | None) -> int:
    """Minor page faults ``pid`` has taken (0 for a process gone): in a fork-server child,
    mostly copy-on-write copies of the pages it inherited and wrote."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return 0


def cpu_of(pid: int | None) -> float:
    """Seconds of CPU (user + system) ``pid`` has used (0 for a process gone)."""
    try:
        return float(sum(psutil.Process(pid).cpu_times()[:2])) if pid else 0.0
    except psutil.Error:
        return 0.0


class Lives:
    """A bus subscriber counting the children alive together (``Born`` minus ``Died``)."""

    def __init__(self, fleet: Fleet, n: int) -> None:
        self.n = n
        self.live = 0
        self.peak = 0
        self.born: list[float] = []
        self.all_born = threading.Event()
        self._sub = fleet.bus.subscribe(capacity=1_000_000, name="bench")
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for event in self._sub:
            if isinstance(event, Born) and event.parent is not None:
                self.live += 1
                self.peak = max(self.peak, self.live)
                self.born.append(time.perf_counter())
                if len(self.born) == self.n:
                    self.all_born.set()
            elif isinstance(event, Died) and event.agent != "trunk":
                self.live -= 1


def one(n: int, hold: float = 0.0) -> dict[str, Any]:
    ensure_fork_server()
    start_process(int, (), name="bench-warm").join()  # the fork server's preload is done
    playback = ScenarioPlayback(parse_scenario(scenario(n)))
    me = psutil.Process()
    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(SessionDir.at(d), playback.provider, FleetConfig(agents="process"))
        try:
            lives = Lives(fleet, n)
            cpu0 = sum(me.cpu_times()[:2])
            server = [c for c in me.children() if "forkserver" in " ".join(c.cmdline())]
            server_cpu0 = sum(cpu_of(c.pid) for c in server)  # its start and preload excluded
            t0 = time.perf_counter()
            fleet.start_trunk("go", interactive=True)
            if not lives.all_born.wait(600):
                raise RuntimeError(f"only {len(lives.born)} of {n} children born")
            t_all = time.perf_counter()
            cpu = sum(me.cpu_times()[:2]) - cpu0
            kids = [fleet.hosted[f"c-{i}"] for i in range(n)]
            procs = [a for a in kids if isinstance(a, ProcessAgent)]
            time.sleep(hold or min(1.0 + n / 200, 5.0))  # let every child reach its sleep
            pids = [a.pid for a in procs] + [p for a in procs if (p := a.shell_pid())]
            total = sum(pss(p) for p in pids)
            agent_cpu = sum(cpu_of(a.pid) for a in procs)
            server_cpu = sum(cpu_of(c.pid) for c in server) - server_cpu0
            shell_cpu = sum(cpu_of(a.shell_pid()) for a in procs)
            agent_faults = sum(faults_of(a.pid) for a in procs)
            shell_faults = sum(faults_of(a.shell_pid()) for a in procs)
            agent_pss = sum(pss(a.pid) for a in procs)
            t = time.perf_counter()
            fleet.registry.cancel_descendants("trunk", "benchmark")
            for a in kids:
                if not a.done.wait(300):
                    raise RuntimeError(f"{a.name} not settled")
            settled = time.perf_counter() - t
            while not all(exited(p) for p in pids):
                time.sleep(0.005)
            cascade = time.perf_counter() - t
            first = lives.born[0]
        finally:
            fleet.close()
    return {
        "agents": n,
        "spawn_ms_per_agent": (lives.born[-1] - first) / max(n - 1, 1) * 1e3,
        "all_born_s": lives.born[-1] - first,
        "spawn_ms_first_tenth": _pace(lives.born[: max(n // 10, 2)]),
        "spawn_ms_last_tenth": _pace(lives.born[-max(n // 10, 2) :]),
        "first_born_s": first - t0,
        "all_born_after_start_s": t_all - t0,
        "peak_live": lives.peak,
        "pss_per_agent_mib": total / n / 2**20,
        "cascade_ms": cascade * 1e3,
        "cascade_settled_ms": settled * 1e3,
        "control_cpu_ms_per_spawn": cpu / n * 1e3,
        "agent_cpu_ms": agent_cpu / n * 1e3,
        "shell_cpu_ms": shell_cpu / n * 1e3,
        "fork_server_cpu_ms": server_cpu / n * 1e3,
        "agent_faults": agent_faults / n,
        "shell_faults": shell_faults / n,
        "agent_pss_mib": agent_pss / n / 2**20,
        "shell_pss_mib": (total - agent_pss) / n / 2**20,
    }


def _pace(born: list[float]) -> float:
    """Milliseconds between consecutive births over ``born``."""
    return (born[-1] - born[0]) / max(len(born) - 1, 1) * 1e3


def _run(n: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", str(n)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


COLUMNS = (
    ("agents", "agents", "{:d}"),
    ("spawn_ms_per_agent", "spawn ms/agent", "{:.1f}"),
    ("spawn_ms_first_tenth", "first tenth", "{:.1f}"),
    ("spawn_ms_last_tenth", "last tenth", "{:.1f}"),
    ("all_born_s", "all born (s)", "{:.1f}"),
    ("peak_live", "peak live", "{:d}"),
    ("pss_per_agent_mib", "PSS/agent MiB", "{:.1f}"),
    ("cascade_settled_ms", "cascade: settled ms", "{:.0f}"),
    ("cascade_ms", "cascade: no process left ms", "{:.0f}"),
    ("control_cpu_ms_per_spawn", "control CPU ms/spawn", "{:.1f}"),
)

DETAIL = (
    ("agents", "agents", "{:d}"),
    ("agent_cpu_ms", "agent process CPU ms", "{:.1f}"),
    ("fork_server_cpu_ms", "fork server CPU ms/agent", "{:.1f}"),
    ("agent_faults", "agent process faults", "{:.0f}"),
    ("shell_faults", "shell host faults", "{:.0f}"),
    ("agent_pss_mib", "agent process PSS MiB", "{:.2f}"),
    ("shell_pss_mib", "shell host PSS MiB", "{:.2f}"),
)
"""Where an agent's cost lives, per child, printed after the growth table with ``--detail``:
CPU from its start to the PSS reading (clock ticks of 10 ms summed over the children: a
shell host's few ms mostly fall between ticks, so its CPU is left out), minor faults (mostly
copy-on-write copies of pages inherited from the fork server, which the kernel makes one 4 KiB
page at a time), and the PSS split between the agent process and its shell host."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 10 and 50 agents")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--detail", action="store_true", help="also print the per-process table")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--hold", type=float, default=0.0, help="seconds to hold the N children idle")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.hold)))
        return
    sizes = QUICK_SIZES if args.quick else tuple(int(s) for s in args.sizes.split(","))
    print("| " + " | ".join(title for _, title, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    rows = []
    for n in sizes:
        rows.append(row := _run(n))
        print("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in COLUMNS) + " |", flush=True)
    if args.detail:
        print()
        print("| " + " | ".join(title for _, title, _ in DETAIL) + " |")
        print("|" + "---|" * len(DETAIL))
        for row in rows:
            print("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in DETAIL) + " |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    main()
