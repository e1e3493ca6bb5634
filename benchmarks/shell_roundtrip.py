"""A trivial ral call through the ShellActor, side by side with the floor.

The floor is a bare msgpack echo over the same kind of pipe (a duplex ``Connection``) to a
process started from the same fork server. The shell's figure includes everything a tool call
pays: the run frame (on the caller's thread, :func:`actors.shell.run_call`; the same call through
the pykka mailbox is measured too), parse/elaborate/evaluate, the result frame with its
snapshot delta, and the checkpoint (for ``1``: nothing to append, see actors/shell_snapshot.py).

    PYTHONPATH=. python benchmarks/shell_roundtrip.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection

import msgpack

from exarch_actors.actors.process import ChildProcess, ensure_fork_server
from exarch_actors.actors.shell import ShellActor, run_call
from exarch_actors.runtime.state.session_dir import SessionDir


def echo_main(data: Connection, ctl: Connection, memory_bytes: int | None = None) -> None:
    while True:
        try:
            body = data.recv_bytes()
        except EOFError:
            return
        data.send_bytes(msgpack.packb(msgpack.unpackb(body)))


def floor(n: int) -> list[float]:
    # the child unpickles its target by module name; this script runs as __main__
    from shell_roundtrip import echo_main as target

    child = ChildProcess(target, name="echo")
    msg = msgpack.packb(["run", {"id": 1, "source": "1", "epoch": 1}])
    out = []
    try:
        for i in range(n + 50):
            t = time.perf_counter()
            child.data.conn.send_bytes(msg)
            msgpack.unpackb(child.data.conn.recv_bytes())
            if i >= 50:
                out.append(time.perf_counter() - t)
    finally:
        child.reap(grace=0.1)
    return out


def shell(n: int, mailbox: bool = False) -> list[float]:
    """``mailbox``: through the actor's mailbox (``proxy.run``) rather than :func:`run_call`."""
    with tempfile.TemporaryDirectory() as d:
        ref = ShellActor.start(name="bench", session=SessionDir.at(d))
        proxy = ref.proxy()
        out = []
        try:
            for i in range(n + 50):
                t = time.perf_counter()
                (proxy.run("1") if mailbox else run_call(proxy, "1")).get()
                if i >= 50:
                    out.append(time.perf_counter() - t)
        finally:
            ref.stop()
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    ensure_fork_server()
    f, s, m = floor(n), shell(n), shell(n, mailbox=True)
    fm, sm, mm = statistics.median(f), statistics.median(s), statistics.median(m)
    print(
        f"floor (msgpack echo, same pipe): median {fm * 1e6:8.1f} us  p99 "
        f"{sorted(f)[int(n * 0.99)] * 1e6:8.1f} us"
    )
    print(
        f"shell (trivial ral call):        median {sm * 1e6:8.1f} us  p99 "
        f"{sorted(s)[int(n * 0.99)] * 1e6:8.1f} us"
    )
    print(
        f"shell via its mailbox:           median {mm * 1e6:8.1f} us  p99 "
        f"{sorted(m)[int(n * 0.99)] * 1e6:8.1f} us"
    )
    print(f"ratio shell/floor: {sm / fm:.1f}x (via the mailbox {mm / fm:.1f}x) over {n} calls")


if __name__ == "__main__":
    main()
