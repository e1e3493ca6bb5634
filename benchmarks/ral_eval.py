"""ral evaluator throughput: parse + elaborate + run generated programs of 1k, 10k and 100k
phrases, and the referenced-names harvest alone.

Prints µs per phrase for each size and the ratio largest/smallest, which must stay near 1:
elaboration and the harvest are linear in program size (the elaborator's node visits per phrase
are exactly constant). Measured wall time per phrase still rises a little with size because a
1k-phrase tree fits in the CPU caches and a 100k one does not: the harvest alone steps from
~0.09 to ~0.33 µs/phrase between 1k and 10k and then stays flat up to 300k.
Run ``python benchmarks/ral_eval.py`` (``--quick`` for 1k/10k only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exarch_actors.runtime.ral.compile import STATS, Scope, compile_program, harvest, no_gc
from exarch_actors.runtime.ral.natives import build_sigma
from exarch_actors.runtime.ral.parser import parse
from exarch_actors.runtime.ral.session import Session

_SHAPES = [
    "let a{k} = add {i} 1",
    'let s{k} = "v=$a{k} and ${{a{k}}}"',
    "let m{k} = [x: $a{k}, y: [1, 2, $a{k}]]",
    "let f{k} = {{ |p| if (lt $p $a{k}) {{ mul $p 2 }} else {{ sub $p 1 }} }}",
    "let r{k} = f{k} {i}",
    "if (gt $m{k}[x] 0) {{ let t = $m{k}[y][2] }} else {{ unit }}",
    "let l{k} = len $s{k}",
]


def program(n: int) -> str:
    """n phrases cycling through typical shapes; names repeat every 64 groups."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        k = (i // len(_SHAPES)) % 64
        out.append(_SHAPES[i % len(_SHAPES)].format(i=i, k=k))
        i += 1
    return "\n".join(out)


def measure(n: int, reps: int = 3) -> dict[str, float]:
    """Best of ``reps`` for each figure, in µs per phrase (visits: elaborator visits/phrase)."""
    src = program(n)
    sigma = frozenset(build_sigma(None, False))
    best: dict[str, float] = {}

    def keep(key: str, secs: float) -> None:
        best[key] = min(best.get(key, float("inf")), secs / n * 1e6)

    for _ in range(reps):
        v0 = STATS.visits
        t0 = time.perf_counter()
        with no_gc():
            phrases = parse(src)
            compile_program(phrases, Scope("session", set(), None), sigma)
        t1 = time.perf_counter()
        best["visits"] = (STATS.visits - v0) / n
        keep("compile", t1 - t0)
        h0 = time.perf_counter()
        harvest(phrases)
        keep("harvest", time.perf_counter() - h0)
        del phrases
        s = Session(faults=False)
        try:
            r0 = time.perf_counter()
            r = s.run(src)
            keep("run_total", time.perf_counter() - r0)
            assert r.error is None, r.error
        finally:
            s.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1k and 10k phrases only")
    args = ap.parse_args()
    sizes = [1000, 10_000] if args.quick else [1000, 10_000, 100_000]
    rows = {n: measure(n) for n in sizes}
    print(
        f"{'phrases':>8} {'visits':>7} {'parse+elab':>11} {'harvest':>9} {'session.run':>12}"
        "  (µs/phrase; session.run = parse + elaborate + harvest + run)"
    )
    for n, m in rows.items():
        print(
            f"{n:>8} {m['visits']:>7.2f} {m['compile']:>11.2f} {m['harvest']:>9.3f}"
            f" {m['run_total']:>12.2f}"
        )
    lo, hi = rows[sizes[0]], rows[sizes[-1]]
    for key in ("visits", "compile", "harvest", "run_total"):
        print(f"ratio {key} {sizes[-1]}/{sizes[0]}: {hi[key] / lo[key]:.2f}")


if __name__ == "__main__":
    main()
