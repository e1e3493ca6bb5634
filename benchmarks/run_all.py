"""Run every benchmark in one go, side by side, and print their reports in order.

    python benchmarks/run_all.py            # full figures (several minutes on 2 cores)
    python benchmarks/run_all.py --quick    # a smoke run of each

Each benchmark prints its own comparison (ratios against a floor measured in the same run), so
the figures stay meaningful on a loaded or slower machine. Latest figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

ORDER = [
    ("ral_eval", "parse + elaborate + run per phrase at 1k/10k/100k phrases; harvest linearity"),
    ("checkpoint_per_call", "a binding-changing call: none vs 20 MB, 10 vs 100,000 bindings"),
    ("shell_roundtrip", "trivial ral call through the ShellActor vs a bare msgpack echo"),
    ("panic_to_ready", "SIGKILL of a shell to the next call's result"),
    ("cancel_latency", "cancel() to the cancelled call returning: ral, shell, providers"),
    ("digest_cost", "digesting a 50 MB tool result vs a 50 KB one"),
    ("value_size", "encode / render with the shared-structure bound; refusing 2**61 items"),
    ("mailbox_throughput", "quota mailbox vs a plain pykka actor"),
    ("cancel_cascade", "cancel cascade over 10 / 100 / 1,000 registry entries"),
    ("cancel_cascade_shells", "cancel cascade with real shell processes at 10 / 100"),
    ("cancel_grace", "interrupt to result: busy honest shells vs a host spinning in C code"),
    ("confinement", "shell start, a trivial call and one exec: full-access vs workspace-write"),
    ("shell_memory", "a fresh host's VmSize / VmData / RSS; the peak of a 256 MiB binding"),
    ("agent_overhead", "one ral call through the whole stack vs the shell round trip"),
    ("fleet_throughput", "10 / 50 / 200 agents x 50 ral calls: calls/s, memory per agent"),
    ("recovery", "fault to the affected agent's next successful call"),
    ("agent_host", "agent hosts: spawn, channel round trip, ral call, PSS, 1 vs 2 cores"),
    ("peers", "per call vs the pipe floor, a Jupyter kernel and pykka; both durability policies"),
    ("sse_transport", "provider streaming: own stdlib transport vs httpx over loopback SSE"),
    (
        "agent_processes",
        "--agents process vs thread: 1 vs 2 cores, control CPU per call, spawn, cascade, PSS",
    ),
    ("ral_fuzz", "generated programs and hostile text: typed outcomes only, none over 2 s"),
    ("record_shipping", "a Ray host's event-log append shipped to the driver vs written locally"),
    ("record_checksum", "a session line's CRC32C: written and read, before vs after"),
    ("message_record", "an agent message's MessageSent record: us under process and machine"),
    ("traffic_governor", "a rate-limited server: share of the limit used, 429s, 10/100/300 agents"),
    (
        "thousand_agents",
        "1,000 process agents at once: spawn ms, peak live, PSS, cascade, 10/100/300/1000",
    ),
]


QUICK_ARGS: dict[str, list[str]] = {
    # the process backend only: the thread backend's path is the one every other benchmark
    # runs. (Its two configurations once took 58 s of the smoke pass: the PSS read asked each
    # busy thread agent's shell actor for its pid and waited out the 5 s answer timeout; it
    # reads the last known pid now, 33 s -> 6 s a configuration.)
    "agent_processes": ["--quick", "--modes", "process"],
    "cancel_cascade": ["--sizes", "10", "100", "--repeat", "2"],
    "checkpoint_per_call": ["50"],
    "mailbox_throughput": ["--n", "2000", "--repeat", "1"],
    "panic_to_ready": ["5", "20"],
    "shell_roundtrip": ["200"],
    "recovery": ["--duration", "5"],
    "record_checksum": ["--rounds", "5"],
    "message_record": ["--n", "200", "--repeat", "1"],
    # the smallest size only (``--quick`` is 10 and 50, 24 s of the smoke pass at load 15 on
    # 2 cores): the smoke pass shows it runs; the growth table is the full run's
    "thousand_agents": ["--sizes", "10"],
}
"""Smoke arguments for benchmarks whose own options are not ``--quick``."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of each benchmark")
    ap.add_argument("only", nargs="*", help="run only these benchmarks (names as above)")
    args = ap.parse_args()
    failed = 0
    for name, what in ORDER:
        if args.only and name not in args.only:
            continue
        script = HERE / f"{name}.py"
        if not script.exists():
            print(f"=== {name}: missing ({what})")
            continue
        print(f"=== {name}: {what}", flush=True)
        quick = QUICK_ARGS.get(name, ["--quick"]) if args.quick else []
        cmd = [sys.executable, str(script), *quick]
        t0 = time.monotonic()
        rc = subprocess.call(cmd, cwd=HERE.parent)
        print(f"--- {name}: exit {rc} in {time.monotonic() - t0:.1f} s\n", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
