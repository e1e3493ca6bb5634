"""Cancel-cascade latency over registry trees of 10, 100 and 1,000 entries (no shells).

Each tree is built under the real spawn-fuel rule (depth <= 3 below the trunk), every entry
registered with its own CancelScope token. The clock starts when ``cancel(trunk)`` is sent
through the Registry actor's proxy and stops at the last token's on-cancel callback, i.e.
when every node reports cancelled. The ask's reply time (the actor serving the queued control
call) is shown beside it, and the cascade's CPU time: the cascade runs on the cancelling thread
as the control call is put, so that thread's CPU time across the put is the cascade's own work,
which a loaded box does not inflate the way it does the wall clock (compare before and after
on it when other processes share the cores). Shell processes are not part of this benchmark:
the eval roots here are plain CancelScopes, so it measures the registry cascade alone.

    PYTHONPATH=. python benchmarks/cancel_cascade.py [--sizes 10 100 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time
from collections import deque

from exarch_actors.actors.registry import start_registry
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.constants import SPAWN_FUEL, TRUNK_NAME


def tree_shape(n: int) -> list[tuple[str, str | None]]:
    """``n`` (name, parent) pairs, breadth-first, no deeper than the fuel allows."""
    fanout = max(2, math.ceil(n ** (1 / SPAWN_FUEL)) + 1)
    shape: list[tuple[str, str | None]] = [(TRUNK_NAME, None)]
    frontier: deque[tuple[str, int]] = deque([(TRUNK_NAME, 0)])
    while len(shape) < n and frontier:
        parent, depth = frontier.popleft()
        if depth >= SPAWN_FUEL:
            continue
        for _ in range(fanout):
            if len(shape) >= n:
                break
            name = f"n{len(shape)}"
            shape.append((name, parent))
            frontier.append((name, depth + 1))
    assert len(shape) == n, "fanout too small for the fuel-bounded depth"
    return shape


def one_run(n: int) -> tuple[float, float, float]:
    handle = start_registry(lease_timer=False)
    try:
        stamps: list[float] = []
        lock = threading.Lock()
        done = threading.Event()
        tokens: list[CancelScope] = []

        def stamp() -> None:
            with lock:
                stamps.append(time.perf_counter())
                if len(stamps) == n:
                    done.set()

        for name, parent in tree_shape(n):
            token, root = CancelScope(), CancelScope()
            token.on_cancel(stamp)
            tokens.append(token)
            handle.core.register(
                name, parent, returns=parent is not None, token=token, eval_root=root
            )
        proxy = handle.proxy
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        reply = proxy.cancel(TRUNK_NAME, "bench")
        cpu = time.thread_time() - cpu0
        assert done.wait(30), "some token never reported cancelled"
        reached = len(reply.get(timeout=30))
        t_reply = time.perf_counter()
        assert reached == n and all(t.cancelled for t in tokens)
        return max(stamps) - t0, t_reply - t0, cpu
    finally:
        handle.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"registry entries, no shells; median of {args.repeat} runs")
    print(
        f"{'entries':>8}{'all tokens cancelled':>24}{'ask replied':>14}{'per node':>12}"
        f"{'cascade CPU':>14}"
    )
    for n in args.sizes:
        runs = [one_run(n) for _ in range(args.repeat)]
        tokens = statistics.median(r[0] for r in runs)
        replied = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        print(
            f"{n:>8}{tokens * 1e3:>21.3f} ms{replied * 1e3:>11.3f} ms{tokens / n * 1e6:>9.2f} µs"
            f"{cpu * 1e3:>11.3f} ms"
        )


if __name__ == "__main__":
    main()
