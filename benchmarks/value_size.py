"""Value size: what bounding shared structure costs an encode and a render, and what it saves.

Every ``encode_value`` of a container first scans it for a part reached twice
(``runtime.ral.values.refuse_oversized``); only a value that shares is counted exactly, and one
over 256 Mi items written out is refused. A rendering measures the value once it passes 64 Ki
items. This prints, per input, the median time of the scan alone, of the whole encode (scan
included) and of a render, and the scan's share of the encode, all in the same run; then the
time to refuse ``fold { |a, x| [$a, $a] } [1] (range 60)`` (2**61 items written out), which
used to pack until the shell's memory limit (~45 s).

    PYTHONPATH=. python benchmarks/value_size.py [--repeat 5]
    PYTHONPATH=. python benchmarks/value_size.py --quick      # smoke: small inputs, 1 repeat
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.runtime.ral.codec import encode_value
from exarch_actors.runtime.ral.errors import ValueTooLarge
from exarch_actors.runtime.ral.values import Variant, refuse_oversized, render


def inputs(scale: int) -> dict[str, Any]:
    doubled: list[Any] = [1]
    for _ in range(16):
        doubled = [doubled, doubled]
    return {
        f"{scale * 100} k ints": list(range(scale * 100_000)),
        f"{scale} k small maps": [{"a": i, "b": "x", "c": [i]} for i in range(scale * 1000)],
        f"{scale} k variants": [Variant("ok", [i]) for i in range(scale * 1000)],
        "2**16 shared leaves": doubled,
    }


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def refusal_ms() -> float:
    v: list[Any] = [1]
    for _ in range(60):
        v = [v, v]
    t0 = time.perf_counter()
    try:
        encode_value(v)
    except ValueTooLarge:
        return (time.perf_counter() - t0) * 1e3
    raise SystemExit("a value of 2**61 items written out was not refused")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smoke: small inputs, 1 repeat")
    args = ap.parse_args()
    repeat = 1 if args.quick else args.repeat
    values = inputs(1 if args.quick else 100)
    print(f"median of {repeat}")
    print(f"{'input':<22}{'scan ms':>10}{'encode ms':>11}{'scan share':>12}{'render ms':>11}")
    for name, v in values.items():
        scan = median_ms(partial(refuse_oversized, v), repeat)
        enc = median_ms(partial(encode_value, v), repeat)
        ren = median_ms(partial(render, v), repeat)
        print(f"{name:<22}{scan:>10.1f}{enc:>11.1f}{scan / enc:>11.0%}{ren:>11.1f}", flush=True)
    print(f"refusing 2**61 items written out (61 distinct lists): {refusal_ms():.2f} ms")


if __name__ == "__main__":
    main()
