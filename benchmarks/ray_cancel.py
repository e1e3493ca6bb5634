"""Cancel of a busy agent's running eval: this machine's process backend beside the Ray backend.

A trunk starts one child, ``w``, whose ral call is ``sleep 600``; once that eval runs (its
host says so: ``ProcessAgent.live().running_eval``), the registry cancels ``w`` and the clock
stops when ``w``'s process has reported its end (``Ended``: the eval came back cancelled, the
shell stopped, the turn settled). That end-to-end figure bounds the eval's own stop from above;
the bound docs/language.md gives (100 ms, cancel to a stopped eval) is for the eval alone. On
Ray the cancel is a control frame over the host's TCP channel, as on this machine over a pipe:
``ray.cancel`` would not reach a ral eval.

    PYTHONPATH=. python benchmarks/ray_cancel.py [--rounds 5] [--ray-address HOST:PORT]
    (no address: a local Ray instance; run it in `unshare -n` with lo up to keep it on loopback)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.ray_backend import RayBackend
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir

SCENARIO = """
[fleet]
prompt = "start a sleeper"

[[agents.trunk]]
ral = ["agent w 'sleep'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = 3

[[agents.w]]
ral = ["sleep 600"]
"""

START_TIMEOUT = 120.0


def _until(cond: Any, what: str, timeout: float = START_TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.002)
    return value


def _busy(fleet: Fleet) -> ProcessAgent | None:
    w = fleet.hosted.get("w")
    if not isinstance(w, ProcessAgent):
        return None
    live = w.live()
    return w if live is not None and live.running_eval else None


def cancel_seconds(backend: Any) -> float:
    """Cancel of ``w``'s running ``sleep 600`` to ``w``'s reported end."""
    playback = ScenarioPlayback(parse_scenario(SCENARIO))
    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(
            SessionDir(Path(d)),
            lambda name: make_provider("scripted", scenario=playback, agent_name=name),
            FleetConfig(agents="process", backend=backend),
        )
        try:
            fleet.start_trunk("start a sleeper")
            w = _until(lambda: _busy(fleet), "w's eval running")
            t = time.perf_counter()
            fleet.registry.cancel("w", "benchmark")
            _until(lambda: w.done.is_set(), "w's end")
            seconds = time.perf_counter() - t
            assert w.outcome is not None and w.outcome.value == "cancelled", w.outcome
        finally:
            fleet.close()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ray-address", default=None)
    args = ap.parse_args()
    ray = RayBackend(args.ray_address)
    ray.connect()
    rows: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for _ in range(args.rounds):  # interleaved: the load moves both alike
            rows["local"].append(cancel_seconds(None))
            rows["ray"].append(cancel_seconds(ray))
    finally:
        ray.close()
    print(f"cancel of a running eval to the agent's end, {args.rounds} rounds each")
    for name, xs in rows.items():
        print(
            f"{name:<6} median {statistics.median(xs) * 1e3:7.1f} ms  "
            f"min {min(xs) * 1e3:7.1f}  max {max(xs) * 1e3:7.1f}"
        )
    ratio = statistics.median(rows["ray"]) / statistics.median(rows["local"])
    print(f"ray / local: {ratio:.2f}x")


if __name__ == "__main__":
    main()
