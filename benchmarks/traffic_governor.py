"""The traffic governor against a rate-limited loopback server: how much of the limit a fleet
uses, and how many of its requests are refused, at 10, 100 and 300 agents.

    PYTHONPATH=. python benchmarks/traffic_governor.py            # 10 / 100 / 300 agents
    PYTHONPATH=. python benchmarks/traffic_governor.py --quick    # smoke: 5 agents, learned

Each size runs twice, side by side: limits learned from the server's headers (no flag) and
limits set (``--rpm``). The server (``tests/support/fleet_model.py``) allows ``rate`` requests
a second with a burst of 10 and answers 429 past it; ``rate`` grows with the fleet so each run
takes seconds, not minutes. Figures:

- ``used``: answered requests a second between the first and the last, over ``rate`` (1.0 is
  the whole limit; the burst lets it pass 1.0 a little);
- ``429``: the share of requests refused;
- ``wall/ideal``: the run's wall time over answered requests / ``rate`` (spawning and the
  trunk's own turns are inside the wall, so 1.0 is out of reach).

Before the governor, each agent retried on its own: 40 children at 20 requests a second lost
37 to 429s (290 of 505 requests refused), 100 at 50/s lost 73 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fleet_model import FleetModel, serving  # noqa: E402


def one(children: int, rate: float, flags: list[str], agents: str) -> dict[str, float | int]:
    model = FleetModel(dialect="openai", rate=rate, burst=10, children=children, calls=5)
    with serving(model) as url, tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        p = subprocess.run(
            [
                sys.executable,
                "-c",
                "from exarch_actors.cli.main import main; main()",
                "run",
                "--provider",
                "openai",
                "--base-url",
                url,
                "--model",
                "m",
                "--api-key",
                "k",
                "--agents",
                agents,
                "--session-dir",
                str(Path(tmp) / "s"),
                "--json",
                *flags,
                "fan out",
            ],
            capture_output=True,
            text=True,
            cwd=tmp,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            timeout=900,
        )
        wall = time.monotonic() - started
    out = json.loads(p.stdout) if p.stdout.strip() else {}
    replied = (out.get("fleetYield") or {}).get("byReason", {}).get("replied", 0)
    span = (model.times[-1] - model.times[0]) if len(model.times) > 1 else 0.0
    used = (len(model.times) - 1) / span / rate if span else 0.0
    return {
        "replied": replied,
        "requests": model.total,
        "refused": model.refused,
        "share": model.refused_share,
        "used": used,
        "wall_ideal": wall / (model.ok / rate),
        "rc": p.returncode,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke: 5 agents, learned limits only")
    ap.add_argument("--sizes", type=int, nargs="*", default=[10, 100, 300])
    args = ap.parse_args()
    sizes = [5] if args.quick else args.sizes
    modes: list[tuple[str, list[str]]] = [("learned", [])]
    print("agents  rate/s  limits   replied  requests  429      used   wall/ideal")
    for n in sizes:
        rate = max(10.0, n / 4)
        agents = "process" if n <= 100 else "thread"
        if not args.quick:
            modes = [("learned", []), ("--rpm", ["--rpm", str(rate * 60)])]
        for label, flags in modes:
            r = one(n, rate, flags, agents)
            print(
                f"{n:>6}  {rate:>6.0f}  {label:<7}  {r['replied']:>4}/{n:<4} {r['requests']:>8}"
                f"  {r['share']:>6.1%}  {r['used']:>5.2f}  {r['wall_ideal']:>9.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
