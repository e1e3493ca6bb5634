"""Agent hosts (one OS process per agent, ``actors/agent_host.py``) side by side with today's
in-process path, all in one run:

- spawn latency: a new agent host and its shell host to ``Born`` (median, p90) vs starting a
  ShellActor in this process (today's cost of an agent's shell; also what the control process
  would spend per spawn if it started each shell host itself and passed its fds);
- a ping round trip over the agent channel vs a bare msgpack echo over the same kind of pipe;
- a trivial ral call through the agent host vs through an in-process ShellActor;
- PSS per agent (agent host + its shell host) over N live hosts, vs a lone shell host's PSS;
- CPU scaling: N agent hosts each running a CPU-bound ral loop, every host and shell pinned to
  one core vs to two (``os.sched_setaffinity``): the speed-up shows the design uses every core.

    PYTHONPATH=. python benchmarks/agent_host.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import msgpack
import psutil

from exarch_actors.actors.agent_host import AgentHost
from exarch_actors.actors.process import ChildProcess, ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.state.session_dir import SessionDir

LOOP = "for i in (range {n}) {{ for j in (range 500) {{ let k = $j }} }}"
"""A CPU-bound ral loop of ``n`` x 500 iterations (the first run in a fresh shell is slower, so
each host runs a short one before the clock starts)."""


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


def _fmt(name: str, xs: list[float], unit: float = 1e3, label: str = "ms") -> str:
    return (
        f"{name:<44} median {statistics.median(xs) * unit:8.2f} {label}  "
        f"p90 {_pct(xs, 0.9) * unit:8.2f} {label}  (n={len(xs)})"
    )


def spawn_latency(d: str, n: int) -> tuple[list[float], list[float]]:
    hosts, shells = [], []
    for i in range(n + 1):
        t = time.perf_counter()
        h = AgentHost(f"spawn{i}", SessionDir.at(d))
        h.wait_born()
        dt = time.perf_counter() - t
        h.shutdown()
        t = time.perf_counter()
        ref = ShellActor.start(name=f"inproc{i}", session=SessionDir.at(d))
        ref.proxy().host_pid().get()
        ds = time.perf_counter() - t
        ref.stop()
        if i:  # the first of each warms caches
            hosts.append(dt)
            shells.append(ds)
    return hosts, shells


def ping_vs_echo(d: str, n: int) -> tuple[list[float], list[float]]:
    # the child unpickles its target by module name; shell_roundtrip's floor is the same echo
    from shell_roundtrip import echo_main as target

    child = ChildProcess(target, name="echo")
    msg = msgpack.packb(["ping", 1, None, {"seq": 1}])
    echo = []
    try:
        for i in range(n + 50):
            t = time.perf_counter()
            child.data.conn.send_bytes(msg)
            msgpack.unpackb(child.data.conn.recv_bytes())
            if i >= 50:
                echo.append(time.perf_counter() - t)
    finally:
        child.reap(grace=0.1)
    h = AgentHost("ping", SessionDir.at(d))
    h.wait_born()
    pings = []
    try:
        for i in range(n + 50):
            t = time.perf_counter()
            h.ping(i)
            if i >= 50:
                pings.append(time.perf_counter() - t)
    finally:
        h.shutdown()
    return pings, echo


def ral_calls(d: str, n: int) -> tuple[list[float], list[float]]:
    h = AgentHost("calls", SessionDir.at(d))
    h.wait_born()
    via_host = []
    try:
        for i in range(n + 20):
            t = time.perf_counter()
            h.run("let x = 1")
            if i >= 20:
                via_host.append(time.perf_counter() - t)
    finally:
        h.shutdown()
    ref = ShellActor.start(name="calls-inproc", session=SessionDir.at(d))
    proxy = ref.proxy()
    inproc = []
    try:
        for i in range(n + 20):
            t = time.perf_counter()
            proxy.run("let x = 1").get()
            if i >= 20:
                inproc.append(time.perf_counter() - t)
    finally:
        ref.stop()
    return via_host, inproc


def _pss(pid: int | None) -> int:
    try:
        return int(psutil.Process(pid or 0).memory_full_info().pss)
    except psutil.Error:
        return 0


def memory(d: str, n: int) -> tuple[list[float], list[float], float]:
    hosts = [AgentHost(f"mem{i}", SessionDir.at(d)) for i in range(n)]
    try:
        borns = [h.wait_born(60) for h in hosts]
        for h in hosts:
            h.run("let x = 1")
        host_pss = [_pss(b.pid) / 2**20 for b in borns]
        shell_pss = [_pss(b.shell_pid) / 2**20 for b in borns]
    finally:
        for h in hosts:
            h.shutdown()
    ref = ShellActor.start(name="mem-inproc", session=SessionDir.at(d))
    try:
        lone = _pss(ref.proxy().host_pid().get()) / 2**20
    finally:
        ref.stop()
    return host_pss, shell_pss, lone


def _pin(pids: list[int], cores: set[int]) -> None:
    for pid in pids:
        try:
            os.sched_setaffinity(pid, cores)
        except OSError:
            pass


def cpu_scaling(d: str, n: int, loop: int, cores: set[int]) -> float:
    """Wall seconds for ``n`` hosts to each finish one CPU-bound ral loop, pinned to ``cores``."""
    hosts = [AgentHost(f"cpu{len(cores)}-{i}", SessionDir.at(d)) for i in range(n)]
    try:
        borns = [h.wait_born(60) for h in hosts]
        _pin([p for b in borns for p in (b.pid, b.shell_pid or 0)], cores)
        for h in hosts:
            h.run(LOOP.format(n=10))
        script = LOOP.format(n=loop)
        errors: list[str] = []

        def one(h: AgentHost) -> Callable[[], None]:
            def go() -> None:
                r = h.run(script, timeout=600)
                if r.error:
                    errors.append(r.error)

            return go

        threads = [threading.Thread(target=one(h)) for h in hosts]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t
        if errors:
            raise RuntimeError(f"the loop failed: {errors[0]}")
        return wall
    finally:
        for h in hosts:
            h.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (small counts)")
    args = ap.parse_args()
    q = args.quick
    ensure_fork_server()
    with tempfile.TemporaryDirectory() as d:
        hosts, shells = spawn_latency(d, 5 if q else 30)
        print(_fmt("spawn: agent host + shell to Born", hosts))
        print(_fmt("spawn: in-process ShellActor to ready", shells))
        print(
            f"  ratio host/in-process: {statistics.median(hosts) / statistics.median(shells):.2f}x"
        )

        pings, echo = ping_vs_echo(d, 200 if q else 3000)
        print(_fmt("round trip: ping over the agent channel", pings, 1e6, "us"))
        print(_fmt("round trip: bare msgpack echo, same pipe", echo, 1e6, "us"))
        print(f"  ratio ping/echo: {statistics.median(pings) / statistics.median(echo):.2f}x")

        via, inproc = ral_calls(d, 50 if q else 1000)
        print(_fmt("ral call through the agent host", via, 1e6, "us"))
        print(_fmt("ral call through an in-process ShellActor", inproc, 1e6, "us"))
        print(f"  ratio host/in-process: {statistics.median(via) / statistics.median(inproc):.2f}x")

        n_mem = 4 if q else 20
        host_pss, shell_pss, lone = memory(d, n_mem)
        per_agent = [a + b for a, b in zip(host_pss, shell_pss, strict=True)]
        print(
            f"PSS over {n_mem} live agents: agent host median "
            f"{statistics.median(host_pss):.1f} MiB, its shell "
            f"{statistics.median(shell_pss):.1f} MiB, together median "
            f"{statistics.median(per_agent):.1f} MiB, max {max(per_agent):.1f} MiB "
            f"(a lone in-process agent's shell host: {lone:.1f} MiB)"
        )

        cpus = sorted(os.sched_getaffinity(0))
        n_cpu, loop = (2, 40) if q else (4, 2_000)
        if len(cpus) < 2:
            print("cpu scaling: skipped (this process may use only one core)")
            return
        # alternated and the best of two each, so a burst of load elsewhere hits both sides
        ones, twos = [], []
        for _ in range(2):
            ones.append(cpu_scaling(d, n_cpu, loop, {cpus[0]}))
            twos.append(cpu_scaling(d, n_cpu, loop, {cpus[0], cpus[1]}))
        one, two = min(ones), min(twos)
        print(
            f"cpu scaling: {n_cpu} hosts x a {loop * 500:,}-iteration ral loop (best of 2): "
            f"1 core {one:.2f} s, "
            f"2 cores {two:.2f} s, speed-up {one / two:.2f}x"
        )


if __name__ == "__main__":
    main()
