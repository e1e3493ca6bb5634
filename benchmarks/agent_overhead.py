"""Runtime overhead per ral call through the whole agent stack, side by side with the bare
ShellActor round trip (benchmarks/shell_roundtrip.py's ``shell`` figure), in one run.

The stack figure is one headless trunk on the scripted provider (zero latency) making N ral
calls, one per provider round-trip (``repeat``). It is the median interval between consecutive
provider requests, so it covers everything one tool call costs the runtime: rendering the
transcript, admission, two fsync'd event-log appends (assistant, tool result), the quota inbox
check for steering, the digest, the Io bus event, the disk/compaction checks at the ready
boundary — plus the shell round trip itself (pykka mailbox, run frame, evaluation, checkpoint).

    python benchmarks/agent_overhead.py [--calls N] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import AssistantMessage, TranscriptItem
from exarch_actors.runtime.providers.base import RAL_TOOL, OnEvent, Provider, ToolSpec
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.session_dir import SessionDir

WARMUP = 20


class Stamped(Provider):
    """The scripted provider, stamping the time of every request."""

    def __init__(self, inner: Provider, stamps: list[float]) -> None:
        self.inner, self.stamps = inner, stamps
        self.name, self.model, self.window_tokens = inner.name, inner.model, inner.window_tokens

    def complete(
        self,
        transcript: Sequence[TranscriptItem],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] = (RAL_TOOL,),
        cancel: CancelScope,
        on_event: OnEvent | None = None,
    ) -> AssistantMessage:
        self.stamps.append(time.perf_counter())
        return self.inner.complete(
            transcript, system=system, tools=tools, cancel=cancel, on_event=on_event
        )


def stack(calls: int, script: str) -> list[float]:
    """Per-call intervals of one agent making ``calls`` ral calls through the whole stack."""
    toml = f"""
[fleet]
prompt = "go"

[[agents.trunk]]
ral = [{script!r}]
repeat = {calls + WARMUP}

[[agents.trunk]]
ral = ["reply done"]
repeat = 2
"""
    playback = ScenarioPlayback(parse_scenario(toml))
    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        fleet = Fleet(
            SessionDir.at(d),
            lambda name: Stamped(playback.provider(name), stamps),
            FleetConfig(),
        )
        try:
            trunk = fleet.start_trunk("go")
            if not fleet.wait_empty(300):
                raise RuntimeError("the benchmark run did not finish")
            assert trunk.stats.ral_calls == calls + WARMUP + 2, trunk.stats
        finally:
            fleet.close()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return gaps[WARMUP : WARMUP + calls]


def shell(calls: int, script: str) -> list[float]:
    """The bare ShellActor round trip (shell_roundtrip.py's figure)."""
    with tempfile.TemporaryDirectory() as d:
        ref = ShellActor.start(name="bench", session=SessionDir.at(d))
        proxy: Any = ref.proxy()
        out = []
        try:
            for i in range(calls + WARMUP):
                t = time.perf_counter()
                proxy.run(script).get()
                if i >= WARMUP:
                    out.append(time.perf_counter() - t)
        finally:
            ref.stop()
    return out


def _p(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200, help="ral calls per measurement")
    ap.add_argument("--quick", action="store_true", help="a smoke run (50 calls)")
    args = ap.parse_args()
    calls = 50 if args.quick else args.calls
    ensure_fork_server()
    print(f"{calls} ral calls each, after {WARMUP} warm-up calls; medians, p90 in brackets")
    print(f"{'script':<12} {'shell actor':>18} {'whole stack':>18} {'ratio':>6} {'agent part':>12}")
    for script in ("1", "let x = 1"):
        sh, st = shell(calls, script), stack(calls, script)
        sm, tm = statistics.median(sh), statistics.median(st)
        print(
            f"{script!r:<12} {sm * 1e6:8.0f} us [{_p(sh, 0.9) * 1e6:5.0f}]"
            f" {tm * 1e6:8.0f} us [{_p(st, 0.9) * 1e6:5.0f}] {tm / sm:5.1f}x"
            f" {(tm - sm) * 1e6:9.0f} us"
        )


if __name__ == "__main__":
    main()
