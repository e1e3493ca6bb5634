"""Recovery figures: run a drill and print the time from each fault to the affected agent's
next successful ral call (median and worst, per kind), plus the drill's totals.

    PYTHONPATH=. python benchmarks/recovery.py [--seed 42] [--duration 20] [--rate 3]
        [--faults all] [--agents 4] [--calls 8]

A 10-minute drill: ``--duration 600``. The figures are read from ``drill-report.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from exarch_actors.cli.drill import DrillConfig, run_drill
from exarch_actors.runtime.drills.nemesis import parse_faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--faults", default="all")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--call-ms", type=int, default=20)
    ap.add_argument("--keep", help="write the drill here instead of a temporary directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp) / "drill"
        cfg = DrillConfig(
            args.seed,
            args.rate,
            parse_faults(args.faults),
            args.duration,
            args.agents,
            args.calls,
            args.call_ms,
            root=root,
        )
        result = run_drill(cfg)
        report = result.to_json()
    rec = report["recovery"]
    print(
        f"drill seed {args.seed}, {args.duration:.0f} s at {args.rate}/s, "
        f"{args.agents} agents x {args.calls} calls, {len(report['rounds'])} rounds"
    )
    applied = sum(1 for a in report["applied"] if a["landed"])
    print(
        f"faults scheduled {len(report['schedule'])}, applied {applied}, "
        f"not applied {len(report['notApplied'])}"
    )
    print(
        f"invariants checked {report['invariants']['checked']}, "
        f"held {report['invariants']['held']}, violated {report['invariants']['violated']}"
    )
    print(
        f"recovery (fault -> next successful call): n={rec['recovered']} "
        f"median {rec['medianSecs']} s, worst {rec['worstSecs']} s"
    )
    print(
        f"{'kind':16} {'scheduled':>9} {'applied':>8} {'recovered':>9} {'median s':>9} "
        f"{'worst s':>8}"
    )
    for kind, n in report["faultsByKind"].items():
        k = rec["byKind"].get(kind, {})
        print(
            f"{kind:16} {n['scheduled']:9} {n['applied']:8} {k.get('n', 0):9} "
            f"{k.get('medianSecs', '-')!s:>9} {k.get('worstSecs', '-')!s:>8}"
        )
    if report["coverage"]["neverApplied"]:
        print("never applied: " + ", ".join(report["coverage"]["neverApplied"]))
    print(json.dumps({"recovery": rec, "invariants": report["invariants"]}))


if __name__ == "__main__":
    main()
