"""What a binding-changing call costs as the scope grows: checkpoints that cost what changed.

Every figure is the median per-call time of ``let x = add 1 2`` through a real ShellActor
(pykka mailbox, host process, snapshot delta, durable base + binding log on disk), measured in
one run so the ratios hold on a loaded machine:

- ``none``     an empty scope;
- ``20 MB``    the same after ``let data = seq 1 3000000`` (a 20 MB encoded binding);
- ``10``       ten leased bindings restored from a snapshot;
- ``100,000``  100,000 leased bindings restored from a snapshot.

Goals (issue 14): ``20 MB / none`` <= 1.2 and ``100,000 / 10`` <= 1.5.

    PYTHONPATH=. python benchmarks/checkpoint_per_call.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.ral.codec import encode_value
from exarch_actors.runtime.shell.ledger import BindingLedger
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.snapshot import MobileSnapshot


def _scope(n: int) -> MobileSnapshot:
    bindings = {f"v{i}": encode_value(f"value {i}") for i in range(n)}
    ledger = BindingLedger()
    ledger.arm([])
    for name, blob in bindings.items():
        ledger.note_define(name, 1, len(blob))
    return MobileSnapshot("bench", 1, bindings, {}, ledger.to_state(), {})


def per_call(
    n: int, cases: dict[str, tuple[str | None, MobileSnapshot | None]]
) -> dict[str, float]:
    """Median seconds per call of each case. The shells run side by side and take turns, call
    by call, so a burst of load on the shared machine falls on every case alike."""
    with tempfile.TemporaryDirectory() as d:
        refs = {
            name: ShellActor.start(name=name, session=SessionDir.at(d), snapshot=snapshot)
            for name, (_setup, snapshot) in cases.items()
        }
        try:
            proxies = {name: ref.proxy() for name, ref in refs.items()}
            for name, (setup, _snapshot) in cases.items():
                if setup is not None:
                    assert proxies[name].run(setup).get().error is None
            times: dict[str, list[float]] = {name: [] for name in cases}
            for i in range(n + 20):
                for name, proxy in proxies.items():
                    t = time.perf_counter()
                    result = proxy.run("let x = add 1 2").get()
                    if i >= 20:
                        times[name].append(time.perf_counter() - t)
                    assert result.error is None, result.error
        finally:
            for ref in refs.values():
                ref.stop()
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    ensure_fork_server()
    got = per_call(
        n,
        {
            "none": (None, None),
            "big": ("let data = seq 1 3000000", None),
            "ten": (None, _scope(10)),
            "many": (None, _scope(100_000)),
        },
    )
    none, big, ten, many = got["none"], got["big"], got["ten"], got["many"]
    print(f"median per call of `let x = add 1 2` over {n} calls (ms)")
    print(f"  empty scope            {none * 1e3:8.3f}")
    print(f"  with a 20 MB binding   {big * 1e3:8.3f}   ratio {big / none:.2f}x (goal <= 1.2)")
    print(f"  10 bindings            {ten * 1e3:8.3f}")
    print(f"  100,000 bindings       {many * 1e3:8.3f}   ratio {many / ten:.2f}x (goal <= 1.5)")


if __name__ == "__main__":
    main()
