"""Cancel-cascade latency with real shell processes, beside the no-shell registry figures.

A real :class:`actors.fleet.Fleet` builds a tree of N agents (the same fuel-bounded shape as
``benchmarks/cancel_cascade.py``), each node spawned by its parent's ``agent`` verb through the
real desk and every shell busy in ral ``sleep 30``. Then ``fleet.registry.cancel("trunk")``.

Three clocks start at that call:

- **tokens** — the last node's cooperative token reports cancelled (``CancelScope.on_cancel``):
  the registry cascade alone, the figure ``cancel_cascade.py`` measures without shells;
- **evals** — no shell has a run in flight any more (every ral call came back from its host;
  polled every 1 ms by a watcher thread);
- **stopped** — the last agent's ``done`` is set: its ral call came back cancelled from the
  host, its drive returned, its spawn site settled it (terminal journal record, shell host shut
  down and reaped). This is "every node reports stopped";
- **no process** — psutil finds no shell host of the run alive any more.

The no-shell figure (``cancel_cascade.one_run``) is measured in the same process, so the ratio
stays meaningful on a loaded machine.

    PYTHONPATH=. python benchmarks/cancel_cascade_shells.py [--sizes 10 100] [--repeat 3]
    PYTHONPATH=. python benchmarks/cancel_cascade_shells.py --quick     # smoke: 10 agents, once
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from exarch_actors.actors.fleet import Fleet
from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.runtime.constants import TRUNK_NAME
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cancel_cascade import one_run, tree_shape

BUSY = "sleep 30"


def scenario(n: int) -> str:
    """A scenario in which every node spawns its children, then sleeps 30 s in ral."""
    children: dict[str, list[str]] = {}
    for name, parent in tree_shape(n):
        children.setdefault(name, [])
        if parent is not None:
            children[parent].append(name)
    lines = ["[fleet]", 'prompt = "build the tree"']
    for name, kids in children.items():
        script = "; ".join([*(f"agent {k} 'work'" for k in kids), BUSY])
        lines += [f"[[agents.{name}]]", f'ral = ["{script}"]']
    return "\n".join(lines) + "\n"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if _alive(p.pid)}


def one_shell_run(n: int, root: Path) -> tuple[float, float, float, float, float]:
    """(build seconds, tokens, evals, stopped, no process) for one tree of ``n`` busy shells."""
    parsed = parse_scenario(scenario(n), source=f"tree-{n}.toml")
    playback = ScenarioPlayback(parsed)
    fleet = Fleet(
        SessionDir.at(root),
        lambda name: make_provider("scripted", scenario=playback, agent_name=name),
    )
    before = _descendants()
    try:
        t_build = time.perf_counter()
        fleet.start_trunk(parsed.prompt)
        names = [name for name, _ in tree_shape(n)]
        deadline = time.monotonic() + 120
        while not all(m in fleet.agents and fleet.agents[m].eval_root.busy for m in names):
            if time.monotonic() > deadline:
                raise RuntimeError("the tree never became busy")
            time.sleep(0.01)
        build = time.perf_counter() - t_build
        pids = _descendants() - before
        agents = [fleet.agents[m] for m in names]
        stamps: list[float] = []
        lock = threading.Lock()

        def stamp() -> None:
            with lock:
                stamps.append(time.perf_counter())

        for agent in agents:
            agent.token.on_cancel(stamp)

        returned: list[float] = []

        def watch_evals() -> None:  # 1 ms polls: cheap beside 2 cores' worth of unwinding
            busy = {a.eval_root for a in agents}
            while busy:
                busy = {r for r in busy if r.busy}
                if not busy:
                    returned.append(time.perf_counter())
                    return
                time.sleep(0.001)

        watcher = threading.Thread(target=watch_evals, daemon=True)
        t0 = time.perf_counter()
        reached = fleet.registry.cancel(TRUNK_NAME, "bench")
        watcher.start()
        for agent in agents:
            if not agent.done.wait(30):
                raise RuntimeError(f"{agent.name} did not stop")
        stopped = time.perf_counter() - t0
        while any(_alive(p) for p in pids):
            if time.perf_counter() - t0 > 30:
                raise RuntimeError("processes survived the cascade")
            time.sleep(0.001)
        gone = time.perf_counter() - t0
        watcher.join()
        # every token was cancelled; ``reached`` names the nodes this cancel's hops found (one
        # whose parent's end cancelled it first was reached through that end)
        assert reached and len(stamps) == n and returned
        assert all(a.outcome is not None and a.outcome.value == "cancelled" for a in agents)
        return build, max(stamps) - t0, returned[0] - t0, stopped, gone
    finally:
        fleet.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke: 10 agents, one run")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.repeat = [10], 1
    ensure_fork_server()
    print(f"every shell busy in ral `{BUSY}`; median of {args.repeat} runs; ms from cancel()")
    print(
        f"{'agents':>7}{'no-shell tokens':>17}{'tokens':>10}{'evals':>10}{'stopped':>10}"
        f"{'no process':>12}{'stopped/no-shell':>18}{'build':>9}"
    )
    with tempfile.TemporaryDirectory() as d:
        for n in args.sizes:
            floor = statistics.median(one_run(n)[0] for _ in range(max(args.repeat, 3)))
            runs = [one_shell_run(n, Path(d) / f"s{n}-{i}") for i in range(args.repeat)]
            build, tokens, evals, stopped, gone = (
                statistics.median(r[k] for r in runs) for k in range(5)
            )
            print(
                f"{n:>7}{floor * 1e3:>14.3f} ms{tokens * 1e3:>7.2f} ms{evals * 1e3:>7.1f} ms"
                f"{stopped * 1e3:>7.1f} ms{gone * 1e3:>9.1f} ms{stopped / floor:>17.0f}x"
                f"{build:>7.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
