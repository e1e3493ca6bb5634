"""What the kernel confinement of a shell costs: a shell's start (host start + first restore,
where the Landlock ruleset and the seccomp filter are entered), a trivial ral call (``1``, the
per-call path, which confinement does not touch) and one external program (``/bin/true``),
each unconfined (full-access) vs confined (workspace-write).

    PYTHONPATH=. python benchmarks/confinement.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from exarch_actors.actors.landlock import abi
from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.shell.confinement import Sandbox, SandboxMode
from exarch_actors.runtime.state.session_dir import SessionDir


def _shell(root: Path, mode: SandboxMode, i: int) -> Any:
    ws, scratch = root / f"ws{i}", root / f"scratch{i}"
    ws.mkdir()
    scratch.mkdir()
    sandbox = Sandbox(mode, (str(ws),), False, str(scratch))
    ctx = DynamicContext(str(ws), {"PATH": "/usr/bin:/bin"}, Grants.ALL, sandbox)
    return ShellActor.start(name="trunk", session=SessionDir(root / f"s{i}"), context=ctx)


def measure(mode: SandboxMode, starts: int, calls: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"start": [], "call": [], "exec": []}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for i in range(starts):
            t = time.perf_counter()
            ref = _shell(root, mode, i)
            shell = ref.proxy()
            shell.run("1").get()  # the host starts and enters its sandbox at the first restore
            out["start"].append(time.perf_counter() - t)
            if i == 0:
                for _ in range(calls):
                    t = time.perf_counter()
                    shell.run("1").get()
                    out["call"].append(time.perf_counter() - t)
                for _ in range(calls):
                    t = time.perf_counter()
                    assert shell.run("/bin/true").get().error is None
                    out["exec"].append(time.perf_counter() - t)
            ref.stop(block=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    starts, calls = (2, 20) if args.quick else (11, 300)
    ensure_fork_server()
    modes = [SandboxMode.FULL_ACCESS]
    if abi() >= 1:
        modes.append(SandboxMode.WORKSPACE_WRITE)
    else:
        print("no Landlock on this kernel: only full-access is measured")
    print(f"{'mode':<16} {'start med/worst ms':>20} {'call med us':>12} {'exec med ms':>12}")
    for mode in modes:
        f = measure(mode, starts, calls)
        start = f"{statistics.median(f['start']) * 1e3:.1f} / {max(f['start']) * 1e3:.1f}"
        call = statistics.median(f["call"]) * 1e6
        ex = statistics.median(f["exec"]) * 1e3
        print(f"{mode.value:<16} {start:>20} {call:>12.0f} {ex:>12.2f}")


if __name__ == "__main__":
    main()
