"""The ral fuzz, long: generated programs and hostile text through the lexer, parser and
evaluator in-process, many more examples than CI runs (tests/ral/test_ral_fuzz.py).

Every example must end in a typed outcome (a value, or a ral error of kind syntax, elaboration,
runtime or cancelled) within ``--limit`` seconds (the issue's 2 s); each run is cancelled after
``--budget`` seconds, so a generated infinite computation ends like any cancelled run. Runs have
no exec grant and no file root. Prints how the runs ended, the CPU cost per example and the
slowest examples; exits 1 with the failing program on any finding.

    python benchmarks/ral_fuzz.py --examples 100000
    python benchmarks/ral_fuzz.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy

from tests.support.ral_programs import (
    GRAMMAR,
    PRELUDE,
    TEXT,
    Outcome,
    check,
    run_bounded,
)


def fuzz(
    name: str, strategy: SearchStrategy[str], n: int, budget: float, limit: float, cwd: str
) -> None:
    kinds: dict[str, int] = {}  # only the outcome kinds and the slowest few are kept
    slowest: list[tuple[float, str]] = []

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(source: str) -> None:
        o = run_bounded(source, cwd, budget)
        kinds[_kind(o)] = kinds.get(_kind(o), 0) + 1
        slowest.append((o.seconds, o.source))
        slowest.sort(key=lambda x: -x[0])
        del slowest[3:]
        check(o, limit)

    cpu, wall = time.process_time(), time.monotonic()
    one()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    shown = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    runs = sum(kinds.values())
    print(f"{name}: {runs} runs in {wall:.1f} s wall, {cpu:.1f} s CPU")
    print(f"  {1000 * cpu / max(runs, 1):.2f} ms CPU per example; ended: {shown}")
    for seconds, source in slowest:
        print(f"  slowest {seconds:.3f} s: {source.removeprefix(PRELUDE)[:160]!r}")


def _kind(o: Outcome) -> str:
    return "ok" if o.result.error is None else o.result.error.kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=50_000, help="examples of each kind")
    ap.add_argument("--budget", type=float, default=1.0, help="cancel a run after this (s)")
    ap.add_argument("--limit", type=float, default=2.0, help="fail a run longer than this (s)")
    ap.add_argument("--quick", action="store_true", help="a smoke run (300 of each)")
    args = ap.parse_args()
    n = 300 if args.quick else args.examples
    with tempfile.TemporaryDirectory(prefix="ral-fuzz-") as cwd:
        try:
            fuzz("grammar-shaped programs", GRAMMAR, n, args.budget, args.limit, cwd)
            fuzz("hostile text", TEXT, n, args.budget, args.limit, cwd)
        except Exception as e:  # the check's AssertionError, or whatever a run raised untyped
            print(f"FINDING: {type(e).__name__}: {e}")
            for sub in getattr(e, "exceptions", ()):
                print(f"  {type(sub).__name__}: {sub}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
