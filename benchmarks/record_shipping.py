"""What shipping a host's durable records to the driver costs (``runtime/state/record_mirror.py``).

An agent host on a Ray node writes its event log locally and ships each append over its
channel (a ``RecordFrame``) to the driver, which writes it into the session directory. Measured
in one run, so the ratios hold on a loaded machine, per event-log append of a ~300-byte record
(``AgentLog.append_user``):

- ``local``              the append alone, under a bound root (what every local host does),
                         under ``process`` and under ``machine`` (an fsync per append);
- ``shipped process``    the same root bound with a sink that sends each write over a real
                         agent channel (a socket pair, the frames and codec of the Ray backend)
                         to a reader thread that writes it into a second directory; the host
                         does not wait (durability ``process``);
- ``shipped machine``    the same, but the host waits for the driver's acknowledgement, sent
                         once the record is fsync'd there (durability ``machine``);
- ``drained``            for ``shipped process``: from the first append until the driver has
                         written the last, per record (the throughput the driver keeps up with).

    PYTHONPATH=. python benchmarks/record_shipping.py [--quick] [N]
"""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from exarch_actors.actors.channel import AgentChannel
from exarch_actors.runtime.fleet.agent_channel import Envelope, RecordFrame, ReturnFrame
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import Durability, ShippedRecord
from exarch_actors.runtime.state.eventlog import AgentLog
from exarch_actors.runtime.state.record_mirror import apply_shipped
from exarch_actors.runtime.state.session_dir import SessionDir

TEXT = "x" * 240


def _pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a.detach()), Connection(b.detach())


def _per_append(log: AgentLog, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        log.append_user(TEXT)
        times.append(time.perf_counter() - t0)
    return times


def _local(root: Path, n: int, policy: Durability) -> list[float]:
    node = SessionDir.at(root / f"local-{policy}")
    files = durability.bind(node.root, policy)
    try:
        return _per_append(AgentLog(node.events("a")), n)
    finally:
        durability.unbind(files)


def _shipped(root: Path, n: int, policy: Durability) -> tuple[list[float], float]:
    node = SessionDir.at(root / f"node-{policy}")
    driver = SessionDir.at(root / f"driver-{policy}")
    written = threading.Semaphore(0)
    here, there = _pair()
    control: AgentChannel

    def apply(msg: RecordFrame) -> None:
        apply_shipped(driver, "a", ShippedRecord(msg.op, msg.path, msg.data, msg.to))  # type: ignore[arg-type]
        written.release()

    def on_notify(msg: object) -> None:
        if isinstance(msg, RecordFrame):
            apply(msg)

    def on_request(env: Envelope) -> None:
        assert isinstance(env.message, RecordFrame) and env.id is not None
        apply(env.message)
        control.reply(env.id, ReturnFrame())

    control = AgentChannel(there, peer="host", on_notify=on_notify, on_request=on_request)
    host = AgentChannel(here, peer="control")
    control.start()
    host.start()

    def sink(record: ShippedRecord) -> None:
        frame = RecordFrame("a", record.op, record.path, record.data, record.to)
        if policy is Durability.MACHINE:
            host.request(frame, 30.0)
        else:
            host.try_send(frame)

    held = durability.bind(driver.root, policy)
    files = durability.bind(node.root, policy, ship=sink)
    try:
        t0 = time.perf_counter()
        times = _per_append(AgentLog(node.events("a")), n)
        for _ in range(n):
            written.acquire(timeout=60.0)
        drained = (time.perf_counter() - t0) / n
    finally:
        durability.unbind(files)
        durability.unbind(held)
        host.close()
        control.close()
    assert driver.events("a").read_bytes() == node.events("a").read_bytes()
    return times, drained


def _us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--quick"]
    n = int(args[0]) if args else (200 if "--quick" in sys.argv else 3000)
    with tempfile.TemporaryDirectory(prefix="ship-") as tmp:
        root = Path(tmp)
        local = _local(root, n, Durability.PROCESS)
        local_machine = _local(root, n, Durability.MACHINE)
        process, drained = _shipped(root, n, Durability.PROCESS)
        machine, _ = _shipped(root, n, Durability.MACHINE)
    base, base_m = _us(local), _us(local_machine)
    print(f"{n} event-log appends of ~300 B, median per append:")
    print(f"  local process      {base:8.1f} us")
    print(f"  shipped process    {_us(process):8.1f} us  ({_us(process) / base:.2f}x local)")
    print(f"  local machine      {base_m:8.1f} us  (one fsync per append)")
    print(f"  shipped machine    {_us(machine):8.1f} us  ({_us(machine) / base_m:.2f}x local)")
    print(f"  drained (process)  {drained * 1e6:8.1f} us per record, first append to last write")


if __name__ == "__main__":
    main()
