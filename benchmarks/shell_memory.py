"""What a shell host's memory looks like, and so which memory limit and default fit
(``runtime/shell/limits.py`` quotes these figures).

- a fresh host: VmSize (what ``RLIMIT_AS`` would count), VmData (what ``RLIMIT_DATA``
  counts), RSS;
- committing one binding of the default largest size (256 MiB, built by doubling a string one
  ``let`` at a time): the host's peak RSS and VmPeak, with no memory limit set;
- the same under the default limit: whether it still commits.

    PYTHONPATH=. python benchmarks/shell_memory.py            # the 256 MiB binding
    PYTHONPATH=. python benchmarks/shell_memory.py --quick    # a 16 MiB one
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.shell.limits import ShellLimits, format_size
from exarch_actors.runtime.state.session_dir import SessionDir

FIELDS = ("VmPeak", "VmSize", "VmHWM", "VmRSS", "VmData")


def status(pid: int) -> dict[str, int]:
    """The host's ``/proc/PID/status`` memory figures, in MiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key = line.split(":")[0]
            if key in FIELDS:
                out[key] = int(line.split()[1]) // 1024
    return out


def grow(shell: Any, doublings: int) -> Any:
    shell.run("let a = 'x'").get()
    result = None
    for _ in range(doublings):
        result = shell.run("let a = concat $a $a").get()
        if result.error is not None:
            break
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 16 MiB binding instead of 256 MiB")
    args = ap.parse_args()
    doublings = 24 if args.quick else 28
    size = format_size(1 << doublings)
    ensure_fork_server()
    with tempfile.TemporaryDirectory() as root:
        fits = (1 << doublings) + 64  # the encoding's few header bytes over the round size
        for label, limits in (
            ("no memory limit", ShellLimits(memory_bytes=None, max_binding_bytes=fits)),
            ("default limit", ShellLimits(max_binding_bytes=fits)),
        ):
            ref = ShellActor.start(name="m", session=SessionDir.at(root), limits=limits)
            try:
                shell = ref.proxy()
                pid = shell.host_pid().get()
                fresh = status(pid)
                if label == "no memory limit":
                    print("fresh host (MiB): " + ", ".join(f"{k} {fresh[k]}" for k in FIELDS))
                result = grow(shell, doublings)
                pid = shell.host_pid().get()
                after = status(pid)
                verdict = "committed" if result.error is None else f"refused: {result.error}"
                print(
                    f"{label}: one {size} binding {verdict}; host peak RSS {after['VmHWM']} MiB, "
                    f"VmPeak {after['VmPeak']} MiB, VmData now {after['VmData']} MiB"
                )
            finally:
                ref.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
