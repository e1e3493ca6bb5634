"""What the CRC32C of every session record costs, before and after, in one run.

A ral call writes four or five JSON lines (its event-log assistant and tool result, the
transcript's Io, the Commit record, a journal record per spawn). Each case below builds the
line of a typical record the way the writers do -- ``before``: the encoding alone, as written
until records carried checksums; ``after``: :func:`runtime.state.durable.jsonl_line` and
:func:`runtime.state.durable.stamped_line`, sealed -- and the reader's side: ``json.loads`` of
the line, against :func:`runtime.state.checksum.open_line` plus ``json.loads``. The cases take
turns round by round, so a burst of load on the shared machine falls on each alike; the figure
is the median per line.

    PYTHONPATH=. python benchmarks/record_checksum.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.runtime.state.checksum import open_line
from exarch_actors.runtime.state.durable import _encoder, jsonl_line, now_iso, stamped_line

PER_ROUND = 2000

_RESULT: dict[str, Any] = {
    "kind": "tool_result",
    "message": {
        "role": "tool",
        "tool_call_id": "call_0123456789abcdef",
        "content": "let x = 3\n" + "output line of a typical ral call\n" * 8,
        "is_error": False,
    },
}
_IO: dict[str, Any] = {"kind": "Io", "agent": "trunk", "call": "call_0123456789abcdef", "ms": 4}


def _before_jsonl() -> bytes:
    record = {**_IO, "at": now_iso()}
    return (_encoder.encode(record) + "\n").encode()


def _before_stamped() -> bytes:
    body = _encoder.encode(_RESULT)
    return f'{body[:-1]}, "at": "{now_iso()}"}}\n'.encode()


def _per_line(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    for _ in range(PER_ROUND):
        fn()
    return (time.perf_counter() - t0) / PER_ROUND


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args(argv)
    sealed = stamped_line(_RESULT)[0].rstrip(b"\n")
    bare = _before_stamped().rstrip(b"\n")
    cases: dict[str, Callable[[], object]] = {
        "write Io, before": _before_jsonl,
        "write Io, after (jsonl_line)": lambda: jsonl_line(_IO),
        "write tool_result, before": _before_stamped,
        "write tool_result, after (stamped_line)": lambda: stamped_line(_RESULT),
        "read tool_result, before": lambda: json.loads(bare),
        "read tool_result, after (open_line)": lambda: json.loads(open_line(sealed)[0]),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(_per_line(fn))
    print(f"{len(sealed)}-byte tool_result line, {len(jsonl_line(_IO)[1])}-byte Io line")
    for name, ts in times.items():
        print(f"{name:42s} {statistics.median(ts) * 1e6:7.2f} us")
    names = list(cases)
    for before, after in zip(names[::2], names[1::2], strict=True):
        extra = statistics.median(times[after]) - statistics.median(times[before])
        print(f"checksum adds {extra * 1e6:5.2f} us per line ({before.split(',')[0]})")


if __name__ == "__main__":
    main()
