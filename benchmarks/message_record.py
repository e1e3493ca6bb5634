"""What recording an agent ``message`` adds to its sender's call: the ``MessageSent`` record
(issue 34) written straight to ``transcript.jsonl`` by :meth:`actors.bus.BusHandle.record_sent`
and acknowledged under the durability policy before the ``message`` verb returns.

Median microseconds per record over ``--n`` records, each policy in turn, ``--repeat`` rounds
interleaved (the box is shared: a burst of load falls on both alike). ``process``: a
``write(2)``; ``machine``: the write and a group-commit fsync (one sender: nothing to share).

    PYTHONPATH=. python benchmarks/message_record.py [--n 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from exarch_actors.actors.bus import start_bus
from exarch_actors.runtime.events import MessageSent
from exarch_actors.runtime.state.durability import Durability, bound_to

TEXT = "a message of about the length a model writes to a sibling agent: " + "x" * 120


def per_record_us(policy: Durability, n: int) -> float:
    with tempfile.TemporaryDirectory() as d, bound_to(d, policy):
        bus = start_bus(Path(d) / "transcript.jsonl")
        try:
            times = []
            for i in range(n):
                event = MessageSent("a", sender="trunk", id=f"{i:032x}", text=TEXT)
                t = time.perf_counter()
                bus.record_sent(event)
                times.append(time.perf_counter() - t)
        finally:
            bus.stop()
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    got: dict[Durability, list[float]] = {p: [] for p in Durability}
    for _ in range(args.repeat):
        for policy in Durability:
            got[policy].append(per_record_us(policy, args.n))
    for policy, us in got.items():
        runs = ", ".join(f"{u:.1f}" for u in us)
        print(f"{policy.value}: {min(us):.1f} us per MessageSent (runs: {runs})")


if __name__ == "__main__":
    main()
