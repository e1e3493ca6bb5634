"""Mailbox throughput: a QuotaActor (the inbox rule as its mailbox) side by side with a plain
pykka ThreadingActor, on the same message shapes.

Two figures per actor, each the best of ``--repeat`` runs:

- ``round-trip``: sequential ``ask`` calls (one message in flight), i.e. the per-message cost
  of put + get + reply;
- ``pipelined``: bursts of 64 tells (the per-source cap, so the quota actor never refuses)
  closed by one ``ask``; the sustained rate a producer can push without refusals.

    PYTHONPATH=. python benchmarks/mailbox_throughput.py [--n 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pykka

from exarch_actors.actors.mailbox import QuotaActor
from exarch_actors.runtime.constants import INBOX_SOURCE_CAP
from exarch_actors.runtime.fleet.inbox import AgentMessage


class PlainCounter(pykka.ThreadingActor):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def on_receive(self, message: Any) -> Any:
        self.n += 1
        return self.n


class QuotaCounter(QuotaActor):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def on_receive(self, message: Any) -> Any:
        self.n += 1
        return self.n


MSG = AgentMessage("bench", "hello")


def round_trip(cls: type[pykka.ThreadingActor], n: int) -> float:
    ref = cls.start()
    try:
        t = time.perf_counter()
        for _ in range(n):
            ref.ask(MSG)
        return n / (time.perf_counter() - t)
    finally:
        ref.stop()


def pipelined(cls: type[pykka.ThreadingActor], n: int) -> float:
    ref = cls.start()
    burst = INBOX_SOURCE_CAP - 1  # the closing ask is the 64th queued message
    try:
        t = time.perf_counter()
        sent = 0
        while sent < n:
            for _ in range(burst):
                ref.tell(MSG)
            ref.ask(MSG)
            sent += burst + 1
        return sent / (time.perf_counter() - t)
    finally:
        ref.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"messages per run: {args.n}, best of {args.repeat}")
    print(f"{'mode':<12}{'plain msg/s':>14}{'quota msg/s':>14}{'quota/plain':>13}")
    for name, fn in (("round-trip", round_trip), ("pipelined", pipelined)):
        plain = max(fn(PlainCounter, args.n) for _ in range(args.repeat))
        quota = max(fn(QuotaCounter, args.n) for _ in range(args.repeat))
        print(f"{name:<12}{plain:>14,.0f}{quota:>14,.0f}{quota / plain:>13.2f}")


if __name__ == "__main__":
    main()
