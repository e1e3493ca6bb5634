"""Digest cost: what digesting a huge tool result costs against a small one, per input kind.

``runtime/fleet/digest.py`` promises that nothing is copied whole: an ASCII ``str`` is measured in
O(1), a non-ASCII one in 1 Mi-char encoded chunks, ``bytes`` are cut raw. This prints the
median time of ``digest_tool_result`` for a 50 MB and a 50 KB stdout of each kind, measured in
the same run, and their ratio (1000x the input; linear work would show ~1000x, the O(1) kinds
stay near 1x). The test suite only checks that a 50 MB result fits the caps.

    PYTHONPATH=. python benchmarks/digest_cost.py [--repeat 5]
    PYTHONPATH=. python benchmarks/digest_cost.py --quick      # smoke: 1 repeat
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.runtime.fleet.digest import digest_tool_result

BIG = 50 << 20
SMALL = 50 << 10


def inputs(size: int) -> dict[str, str | bytes]:
    return {"ASCII str": "x" * size, "non-ASCII str": "é" * (size // 2), "bytes": b"y" * size}


def median_ms(stdout: str | bytes, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        digest_tool_result("unit", stdout=stdout)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smoke: 1 repeat")
    args = ap.parse_args()
    repeat = 1 if args.quick else args.repeat
    small, big = inputs(SMALL), inputs(BIG)
    print(f"median of {repeat}; stdout of 50 KB vs 50 MB (UTF-8 bytes)")
    print(f"{'input':<15}{'50 KB ms':>10}{'50 MB ms':>10}{'50 MB / 50 KB':>15}")
    for kind in small:
        lo, hi = median_ms(small[kind], repeat), median_ms(big[kind], repeat)
        print(f"{kind:<15}{lo:>10.3f}{hi:>10.3f}{hi / lo:>14.1f}x", flush=True)


if __name__ == "__main__":
    main()
