"""How long a cancelled ral call takes to come back, and so what the cancellation grace must be.

Two measurements on real ShellActors (real host processes, real pipes):

- **honest shells** — N shells at once, each busy in a CPU-bound ral loop (the worst case for
  a poll point: every core is saturated), are interrupted together; per shell, the time from
  ``interrupt`` to the call's result. Their worst case must sit far below
  :data:`shell_module.CANCEL_GRACE`, or a healthy shell would be killed and rolled back.
- **a spinning shell** — one shell in ``fault spin`` (C code holding the GIL: the host cannot
  honour a cancel at all) is interrupted; the time to the rolled-back result is the grace plus
  the kill plus booting a fresh host from the snapshot.

    PYTHONPATH=. python benchmarks/cancel_grace.py [--shells 100] [--repeat 3] [--spins 5]
    PYTHONPATH=. python benchmarks/cancel_grace.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from typing import Any

import exarch_actors.actors.shell as shell_module
from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.state.session_dir import SessionDir

LOOP = "for i in (range 100000) { for j in (range 1000) { let n = add 1 1 } }"
"""CPU-bound, and every native call in it short (a ``range 10000000`` would itself be one long
native call: measured under load, building it takes over a second with no poll point)."""


def _start(n: int, root: str) -> list[Any]:
    return [
        ShellActor.start(name=f"s{i}", session=SessionDir.at(root), faults=True) for i in range(n)
    ]


def _wait_busy(proxies: list[Any], roots: list[Any]) -> None:
    deadline = time.monotonic() + 60
    while not all(r.busy for r in roots):
        if time.monotonic() > deadline:
            raise SystemExit("shells did not all start their run")
        time.sleep(0.01)
    time.sleep(0.2)  # every loop well inside its range


def honest(n: int, root: str) -> list[float]:
    """Seconds from ``interrupt`` to the result, per shell, for ``n`` shells interrupted at
    once while each spins in a CPU-bound ral loop."""
    refs = _start(n, root)
    try:
        proxies = [r.proxy() for r in refs]
        roots = [p.eval_root.get() for p in proxies]
        futures = [p.run(LOOP) for p in proxies]
        _wait_busy(proxies, roots)
        out: list[float] = []
        killed: list[Any] = []
        lock = threading.Lock()

        def collect(f: Any) -> None:  # each result's own arrival time
            result = f.get(timeout=120)
            with lock:
                out.append(time.perf_counter() - t0)
                if result.rolled_back:
                    killed.append(result)

        t0 = time.perf_counter()
        for r in roots:
            r.interrupt("bench")
        waiters = [threading.Thread(target=collect, args=(f,)) for f in futures]
        for w in waiters:
            w.start()
        for w in waiters:
            w.join()
        if killed:
            print(f"  !! {len(killed)} healthy shell(s) outlived the grace: killed, rolled back")
        return out
    finally:
        for r in refs:
            r.stop()


def spinning(root: str) -> float:
    """Seconds from ``interrupt`` to the rolled-back result of a shell in ``fault spin``."""
    ref = ShellActor.start(name="spin", session=SessionDir.at(root), faults=True)
    try:
        shell = ref.proxy()
        root_ = shell.eval_root.get()
        shell.run("let kept = 1").get()
        future = shell.run("fault spin")
        while not root_.busy:
            time.sleep(0.005)
        time.sleep(0.3)
        t0 = time.perf_counter()
        root_.interrupt("bench")
        result = future.get(timeout=60)
        elapsed = time.perf_counter() - t0
        assert result.rolled_back, result
        return elapsed
    finally:
        ref.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shells", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spins", type=int, default=5)
    ap.add_argument("--grace", type=float, help="override CANCEL_GRACE (seconds) to measure")
    ap.add_argument("--quick", action="store_true", help="10 shells once, 1 spin")
    args = ap.parse_args()
    if args.quick:
        args.shells, args.repeat, args.spins = 10, 1, 1
    if args.grace is not None:
        shell_module.CANCEL_GRACE = args.grace
    grace = shell_module.CANCEL_GRACE
    ensure_fork_server()
    with tempfile.TemporaryDirectory() as root:
        all_times: list[float] = []
        for _ in range(args.repeat):
            all_times += honest(args.shells, root)
        all_times.sort()
        p99 = all_times[min(len(all_times) - 1, int(len(all_times) * 0.99))]
        print(
            f"honest: {args.shells} shells x {args.repeat}, interrupt -> result: "
            f"median {statistics.median(all_times) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, worst {all_times[-1] * 1000:.1f} ms "
            f"(grace {grace * 1000:.0f} ms: worst is {all_times[-1] / grace:.0%} of it)"
        )
        spins = [spinning(root) for _ in range(args.spins)]
        print(
            f"spinning: {args.spins} runs, interrupt -> rolled-back result: "
            f"median {statistics.median(spins) * 1000:.0f} ms, worst {max(spins) * 1000:.0f} ms "
            f"(grace {grace * 1000:.0f} ms + kill + a fresh host)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
