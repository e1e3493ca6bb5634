"""Control kills at random moments, each followed by ``resume`` and ``check``: the sweep behind
issue 34's "40 control kills at random moments all resume to completion".

``python -m tests.support.kill_sweep --seed 11 --kills 40 [--root DIR]`` runs, in turn, the
scripted examples whose rounds stand alone after a kill (fanout, chain, regression, crashing)
and a 20-child fan-in against the loopback model server (``tests/support/fleet_model.py``,
``resumable``: it reads its conversation and collects again after an interrupted collection,
as a model does; a scripted fan-in plays its rounds by position and cannot, docs/drills.md,
"Resuming a scripted run"), in both agent backends. Each run is SIGKILLed at a uniform moment
inside its own run time; a kill that lands before ``run.json`` or after ``result.json`` is not
counted. A run counts as resumed when ``resume`` and ``check`` exit 0 and ``result.json`` says
``replied``; a failed one's session is kept under ``--root`` and its story printed.

Not a test (minutes of wall time, and its kill moments are random by design): a tool to repeat
the sweep after a change to resume, settlement or the journals.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.fleet_model import FleetModel, serving

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _cli() -> list[str]:
    return [sys.executable, "-c", "from exarch_actors.cli.main import main; main()"]


def _cases(url: str) -> list[tuple[str, list[str], float, float]]:
    """(name, run arguments, earliest and latest kill moment in seconds); the windows cover
    each run's measured length on a 2-core box (0.96-1.76 s)."""
    net = ["--provider", "openai", "--base-url", url, "--model", "m", "--api-key", "k"]
    return [
        ("fanout", [str(EXAMPLES / "fanout.toml")], 0.3, 1.0),
        ("chain", [str(EXAMPLES / "chain.toml")], 0.3, 1.1),
        ("fanin-net", [*net, "fan out"], 0.3, 1.8),
        ("regression", [str(EXAMPLES / "regression.toml")], 0.3, 1.0),
        ("crashing", [str(EXAMPLES / "crashing.toml")], 0.3, 1.3),
        ("fanin-net-process", [*net, "--agents", "process", "fan out"], 0.3, 1.8),
    ]


def sweep(seed: int, kills: int, root: Path) -> int:
    """Run the sweep; the number of kills whose resume did not end ``replied`` (or whose
    ``check`` failed)."""
    rng = random.Random(seed)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    model = FleetModel("openai", 1000, 1000, children=20, calls=3, resumable=True)
    counted = failed = skipped = 0
    with serving(model) as url:
        cases = _cases(url)
        i = 0
        while counted < kills:
            i += 1
            name, args, lo, hi = cases[i % len(cases)]
            session = root / f"{i:03d}-{name}"
            at = rng.uniform(lo, hi)
            proc = subprocess.Popen(
                [*_cli(), "run", *args, "--session-dir", str(session)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(at)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if not (session / "run.json").exists() or (session / "result.json").exists():
                skipped += 1
                shutil.rmtree(session, ignore_errors=True)
                continue
            counted += 1
            resumed = subprocess.run(
                [*_cli(), "resume", str(session)], capture_output=True, text=True, timeout=300
            )
            checked = subprocess.run(
                [*_cli(), "check", str(session)], capture_output=True, text=True, timeout=120
            )
            result_path = session / "result.json"
            result = json.loads(result_path.read_text()) if result_path.exists() else {}
            ok = (resumed.returncode, checked.returncode, result.get("outcome")) == (
                0,
                0,
                "replied",
            )
            line = f"{session.name} killed at {at:.2f} s: {result.get('outcome')}"
            if ok:
                print(f"ok   {line}, reply {str(result.get('reply'))[:40]}", flush=True)
                shutil.rmtree(session, ignore_errors=True)
                continue
            failed += 1
            print(
                f"FAIL {line} (resume exit {resumed.returncode}, check exit "
                f"{checked.returncode})\n{resumed.stdout[-1200:]}{resumed.stderr[-800:]}",
                flush=True,
            )
    print(f"{counted} kills counted, {failed} did not resume to a reply, {skipped} not counted")
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--kills", type=int, default=40)
    ap.add_argument("--root", type=Path, default=Path(".exarch/kill-sweep"))
    a = ap.parse_args()
    sys.exit(1 if sweep(a.seed, a.kills, a.root) else 0)


if __name__ == "__main__":
    main()
