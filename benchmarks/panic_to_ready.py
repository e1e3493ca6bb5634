"""Panic to ready: from a SIGKILL of the shell host to the next call's result.

Each round: bind one more name, SIGKILL the host from outside, then time until ``run`` returns
the rolled-back result of the interrupted call and the next call answers with every binding.

    PYTHONPATH=. python benchmarks/panic_to_ready.py [N] [BINDINGS]
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time

from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.state.session_dir import SessionDir


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    bindings = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    ensure_fork_server()
    with tempfile.TemporaryDirectory() as d:
        ref = ShellActor.start(name="bench", session=SessionDir.at(d))
        proxy = ref.proxy()
        try:
            proxy.run("; ".join(f"let v{i} = 'value {i}'" for i in range(bindings))).get()
            root = proxy.eval_root.get()
            times = []
            for _ in range(n):
                host_pid = proxy.host_pid().get()
                future = proxy.run("sleep 10")
                while not root.busy:  # the run is on the host
                    time.sleep(0.0005)
                t = time.perf_counter()
                os.kill(host_pid, signal.SIGKILL)
                result = future.get()
                assert result.rolled_back
                assert proxy.run(f"echo $v{bindings - 1}").get().error is None
                times.append(time.perf_counter() - t)
        finally:
            ref.stop()
    print(
        f"panic to ready over {n} SIGKILLs ({bindings} bindings restored): "
        f"median {statistics.median(times) * 1e3:.1f} ms, worst {max(times) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
