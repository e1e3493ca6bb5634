"""Our per-call path side by side with its peers, in one run.

- **stack**: one ral call through the whole stack (a headless trunk on the scripted provider:
  provider, admission, event log, bus, shell actor, host, checkpoint), the mean per call over
  ``--calls`` calls (two per scripted reply) from ``transcript.jsonl``'s ``Io`` timestamps,
  for a trivial call (``1``) and a binding-changing one (``let x = add 1 2``), under each
  ``--durability`` policy;
- **shell**: the same two calls through the ShellActor alone (mean of timed round trips);
- **pipe floor**: a bare msgpack echo over the same kind of pipe to a process from the same fork
  server (benchmarks/shell_roundtrip.py's floor);
- **jupyter**: an IPython kernel (jupyter_client + ipykernel): the execute round trip of
  ``x = i``, and restart-to-ready (after which every variable is lost) against our
  panic-to-ready (SIGKILL of the shell host to the next call's result, every committed binding
  kept);
- **pykka**: a plain pykka actor's ``ask`` round trip.

The peers come from the optional extra ``pip install -e '.[bench]'``; a missing one is named
and skipped. The issue's goal: whole stack per binding-changing call <= 1/10 of the Jupyter
execute round trip (figures in docs/benchmarks.md).

    python benchmarks/peers.py [--calls N] [--quick] [--only stack|shell|floor|jupyter|pykka]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exarch_actors.actors.fleet import FleetConfig
from exarch_actors.actors.process import ChildProcess, ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir

if "durability" in FleetConfig.__dataclass_fields__:
    from exarch_actors.runtime.state import durability as _durability

    POLICIES: list[Any] = list(_durability.Durability)
else:  # code older than the knob (a before/after figure): the stack runs as that code does
    POLICIES = [None]

FSYNCS: dict[str, tuple[int, int]] = {}
"""Per stack run: (records appended, fsyncs of them), from its bound directory."""

TRIVIAL = "1"
BINDING = "let x = add 1 2"
WARMUP = 20


# --------------------------------------------------------------------------- ours


def run_call(shell: Any, script: str) -> Any:
    """The call path the fleet uses (on the caller's thread when the actor is idle); through
    the mailbox on code older than it (a before/after figure)."""
    try:
        from exarch_actors.actors.shell import run_call as call
    except ImportError:
        return shell.run(script)
    return call(shell, script)


def stack(calls: int, script: str, policy: Any) -> float:
    """Mean seconds per ral call through the whole stack, from the transcript's Io stamps.

    Two calls per scripted reply: a turn is capped at MAX_STEPS (250) provider round trips,
    fewer than the calls measured."""
    from exarch_actors.actors.fleet import Fleet

    toml = f"""
[fleet]
prompt = "go"

[[agents.trunk]]
ral = [{script!r}, {script!r}]
repeat = {(calls + WARMUP + 1) // 2}

[[agents.trunk]]
ral = ["reply done"]
"""
    playback = ScenarioPlayback(parse_scenario(toml))
    with tempfile.TemporaryDirectory() as d:
        config = FleetConfig() if policy is None else FleetConfig(durability=policy)
        files = None if policy is None else _durability.bind(d, policy)  # the fleet shares it
        fleet = Fleet(SessionDir.at(d), playback.provider, config)
        try:
            fleet.start_trunk("go")
            if not fleet.wait_empty(600):
                raise RuntimeError("the benchmark run did not finish")
        finally:
            fleet.close()
            if files is not None:
                _durability.unbind(files)
                FSYNCS[f"{script!r} [{policy.value}]"] = (files.records, files.fsyncs)
        stamps = [
            _epoch(r["at"])
            for r in read_jsonl(Path(d) / "transcript.jsonl").records
            if r.get("kind") == "Io" and r.get("script") == script
        ]
    window = stamps[WARMUP - 1 : WARMUP + calls]
    assert len(window) == calls + 1, len(stamps)
    return (window[-1] - window[0]) / calls


def fanout(agents: int, calls: int) -> tuple[int, int, float]:
    """A fan-out of ``agents`` children making ``calls`` ral calls each under ``machine``:
    (records appended, fsyncs of them, seconds): group commit across concurrent agents."""
    from exarch_actors.actors.fleet import Fleet
    from exarch_actors.runtime.drills.nemesis import synthetic_scenario

    playback = ScenarioPlayback(parse_scenario(synthetic_scenario(agents, calls, call_ms=0)))
    with tempfile.TemporaryDirectory() as d:
        files = _durability.bind(d, _durability.Durability.MACHINE)
        fleet = Fleet(SessionDir.at(d), playback.provider, FleetConfig(durability=files.policy))
        t = time.perf_counter()
        try:
            fleet.start_trunk("go")
            if not fleet.wait_empty(600):
                raise RuntimeError("the fan-out did not finish")
        finally:
            fleet.close()
            took = time.perf_counter() - t
            _durability.unbind(files)
    return files.records, files.fsyncs, took


def _epoch(at: str) -> float:
    return dt.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def shell(calls: int, script: str, policy: Any) -> float:
    """Mean seconds per ShellActor round trip (the checkpoint under ``policy``)."""
    with tempfile.TemporaryDirectory() as d:
        files = None if policy is None else _durability.bind(d, policy)
        ref = ShellActor.start(name="bench", session=SessionDir.at(d))
        proxy: Any = ref.proxy()
        try:
            for _ in range(WARMUP):
                run_call(proxy, script).get()
            t = time.perf_counter()
            for _ in range(calls):
                run_call(proxy, script).get()
            return (time.perf_counter() - t) / calls
        finally:
            ref.stop()
            if files is not None:
                _durability.unbind(files)


def panic_to_ready(rounds: int, bindings: int = 100) -> float:
    """Median seconds from a SIGKILL of the shell host mid-call to the next call's result,
    every committed binding kept (benchmarks/panic_to_ready.py)."""
    with tempfile.TemporaryDirectory() as d:
        ref = ShellActor.start(name="bench", session=SessionDir.at(d))
        proxy: Any = ref.proxy()
        try:
            proxy.run("; ".join(f"let v{i} = 'value {i}'" for i in range(bindings))).get()
            root = proxy.eval_root.get()
            times = []
            for _ in range(rounds):
                pid = proxy.host_pid().get()
                future = proxy.run("sleep 10")
                while not root.busy:
                    time.sleep(0.0005)
                t = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                assert future.get().rolled_back
                assert proxy.run(f"echo $v{bindings - 1}").get().error is None  # kept
                times.append(time.perf_counter() - t)
        finally:
            ref.stop()
    return statistics.median(times)


def echo_main(data: Connection, ctl: Connection, memory_bytes: int | None = None) -> None:
    while True:
        try:
            body = data.recv_bytes()
        except EOFError:
            return
        data.send_bytes(msgpack.packb(msgpack.unpackb(body)))


def floor(calls: int) -> float:
    """Mean seconds of a bare msgpack echo over the shell's kind of pipe."""
    from peers import echo_main as target  # the child unpickles its target by module name

    child = ChildProcess(target, name="echo")
    msg = msgpack.packb(["run", {"id": 1, "source": "1", "epoch": 1}])
    conn = child.data.conn
    try:
        for _ in range(WARMUP):
            conn.send_bytes(msg)
            conn.recv_bytes()
        t = time.perf_counter()
        for _ in range(calls):
            conn.send_bytes(msg)
            msgpack.unpackb(conn.recv_bytes())
        return (time.perf_counter() - t) / calls
    finally:
        child.reap(grace=0.1)


# --------------------------------------------------------------------------- peers


def jupyter(calls: int, restarts: int) -> tuple[float, float]:
    """(mean execute round trip of ``x = i``, median restart-to-ready) of an IPython kernel."""
    from jupyter_client import KernelManager

    sockets = tempfile.TemporaryDirectory()  # IPC sockets: no TCP port, nothing left behind
    km = KernelManager(kernel_name="python3", transport="ipc", ip=f"{sockets.name}/kernel")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        for i in range(WARMUP):
            kc.execute(f"x = {i}", reply=True, timeout=60)
        t = time.perf_counter()
        for i in range(calls):
            reply = kc.execute(f"x = {i}", reply=True, timeout=60)
            assert reply["content"]["status"] == "ok"
        execute = (time.perf_counter() - t) / calls
        times = []
        for _ in range(restarts):
            t = time.perf_counter()
            km.restart_kernel(now=True)
            kc.wait_for_ready(timeout=60)
            times.append(time.perf_counter() - t)
            lost = kc.execute("x", reply=True, timeout=60)
            assert lost["content"]["status"] == "error"  # every variable is gone
            kc.execute("x = 1", reply=True, timeout=60)
        return execute, statistics.median(times)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        sockets.cleanup()


def pykka_ask(calls: int) -> float:
    import pykka

    class Echo(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> Any:
            return message

    ref = Echo.start()
    try:
        for _ in range(WARMUP):
            ref.ask(1)
        t = time.perf_counter()
        for i in range(calls):
            ref.ask(i)
        return (time.perf_counter() - t) / calls
    finally:
        ref.stop()


def _missing(module: str) -> str | None:
    try:
        __import__(module)
    except ImportError:
        return module
    return None


# --------------------------------------------------------------------------- report


def _ms(s: float) -> str:
    return f"{s * 1e3:8.3f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per mean (default 300)")
    ap.add_argument("--restarts", type=int, default=5, help="kernel restarts / shell panics")
    ap.add_argument("--quick", action="store_true", help="a smoke run (30 calls, 2 restarts)")
    ap.add_argument("--only", nargs="*", default=[], help="stack shell floor jupyter pykka")
    args = ap.parse_args()
    calls, restarts = (30, 2) if args.quick else (args.calls, args.restarts)

    def want(part: str) -> bool:
        return not args.only or part in args.only

    ensure_fork_server()
    rows: dict[str, float] = {}
    for policy in POLICIES:
        tag = f"[{policy.value}]" if policy is not None else ""
        if want("stack"):
            rows[f"stack {TRIVIAL!r} {tag}"] = stack(calls, TRIVIAL, policy)
            rows[f"stack {BINDING!r} {tag}"] = stack(calls, BINDING, policy)
        if want("shell"):
            rows[f"shell actor {TRIVIAL!r} {tag}"] = shell(calls, TRIVIAL, policy)
            rows[f"shell actor {BINDING!r} {tag}"] = shell(calls, BINDING, policy)
    fan: tuple[int, int, float] | None = None
    if want("stack") and POLICIES != [None]:
        fan = fanout(8, max(5, calls // 10))
    if want("floor"):
        rows["pipe floor (msgpack echo)"] = floor(calls)
    if want("shell"):
        rows["our panic-to-ready (bindings kept)"] = panic_to_ready(restarts)
    skipped = []
    if want("jupyter"):
        gone = _missing("jupyter_client") or _missing("ipykernel")
        if gone is None:
            execute, restart = jupyter(calls, restarts)
            rows["jupyter execute 'x = i'"] = execute
            rows["jupyter restart-to-ready (variables lost)"] = restart
        else:
            skipped.append(f"jupyter: {gone} is not installed (pip install -e '.[bench]')")
    if want("pykka"):
        rows["pykka ask (plain actor)"] = pykka_ask(calls)
    print(f"per call, mean of {calls} calls (restart / panic: median of {restarts})")
    for name, value in rows.items():
        print(f"  {name:<46} {_ms(value)}")
    for name, (records, fsyncs) in FSYNCS.items():
        print(f"  stack {name}: {records} records appended, {fsyncs} fsyncs")
    if fan is not None:
        print(
            f"  fan-out of 8 agents [machine]: {fan[0]} records appended, {fan[1]} fsyncs "
            f"({fan[1] / fan[0]:.2f} per record) in {fan[2]:.2f} s"
        )
    for line in skipped:
        print(f"  skipped {line}")
    jup = rows.get("jupyter execute 'x = i'")
    if jup:
        for name, value in rows.items():
            if name.startswith("stack") and "add" in name:
                print(f"  {name} / jupyter execute = {value / jup:.2f}  (goal <= 0.10)")
    floor_s = rows.get("pipe floor (msgpack echo)")
    if floor_s:
        for name, value in rows.items():
            if name.startswith("shell actor") and TRIVIAL in name.split("'")[1:2]:
                print(f"  {name} / pipe floor = {value / floor_s:.1f}x  (goal <= 2.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
