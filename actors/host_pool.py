"""A small warm pool of agent processes, forked ahead of the spawns that take them.

A process agent's spawn used to wait for two fork-server round trips in series -- its agent
process, then (from there) its shell -- and for both processes to start up. A pooled agent
process is forked from the one fork server before anyone asks for it, starts its shell host at
once (``actors/host_start.py``) and then waits for its ``HostBoot``: a spawn
that finds one sends the boot over the pipe and is left with building the agent and restoring
its shell (docs/benchmarks.md has the figures). An empty pool is no error: the spawn forks its
own process as before.

The pool refills only once no spawn has started or ended for :data:`REFILL_QUIET` (:meth:`HostPool.
spawning`): a refill is a whole agent process and shell starting up, and on the loaded 2-core
box one started beside each of a run of back-to-back spawns made them slower than no pool at
all (median 105-190 ms against 76-80 ms, load average 120-160). So spawns spaced out in time
-- a model deciding to delegate, turns apart -- find a warm process, and a burst takes the
warm ones and then starts its own, as without a pool.

Invariants:
- A pooled process is an ordinary agent process before its boot: forked by the one fork server,
  ``PR_SET_PDEATHSIG``, so it dies with the control process however that ends (its shell too).
- Before its boot the only thing on its pipe is the pickled ``HostBoot`` (the channel's frames
  start after it); an end of file instead makes it discard its shell and exit.
- :meth:`HostPool.close` returns once the refill thread has stopped and every idle process (and
  the shell each started) has exited: the pool never outlives its fleet.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Iterator
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from actors.agent_process_host import agent_process_main
from actors.process import fork_server_address, process_context, start_process

log = logging.getLogger(__name__)

POOL_SIZE = 2
"""Idle agent processes kept ready: enough for a spawn every few tens of milliseconds (the
refill takes about as long as a cold start), and each costs an agent process and a shell
(~14 MiB PSS together) while it waits."""

REFILL_QUIET = 0.25
"""Seconds without a spawn starting or ending before the pool starts a process to refill. A
model that delegates takes longer than this between two turns; a burst of spawns (one ral call
starting several agents) leaves gaps of a few milliseconds -- but under a load average of ~90
the control process itself may stall 50 ms between two, which let refills in at 0.05 s."""

EXIT_GRACE = 5.0
"""Seconds an idle process told to exit (its pipe closed) gets before it is killed."""


class HostPool:
    """Idle agent processes, each with its shell host started, ready for a ``HostBoot``."""

    def __init__(self, memory_bytes: int | None, size: int = POOL_SIZE) -> None:
        """``memory_bytes``: the shell memory limit the fleet's agents use (a boot that wants
        another one starts a fresh shell: ``HostStart.take``)."""
        self._memory_bytes = memory_bytes
        self._size = size
        self._idle: deque[tuple[Connection, BaseProcess]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._spawning = 0
        self._spawned = threading.Event()
        """Set when a spawn starts or ends: the refill waits for a quiet spell after it."""
        self._address = fork_server_address()
        self._thread = threading.Thread(target=self._fill, name="host-pool", daemon=True)
        self._thread.start()

    def idle_pids(self) -> list[int]:
        """The pids of the idle processes it holds now."""
        with self._lock:
            return [proc.pid for _, proc in self._idle if proc.pid is not None]

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Around a spawn (until its agent is born): the pool does not refill meanwhile."""
        with self._lock:
            self._spawning += 1
        self._spawned.set()
        try:
            yield
        finally:
            with self._lock:
                self._spawning -= 1
            self._spawned.set()  # quiet counts from a spawn's end too
            self._wake.set()

    def take(self) -> tuple[Connection, BaseProcess] | None:
        """An idle process (its pipe's control end and its handle), or None if none is
        ready."""
        with self._lock:
            return self._idle.popleft() if self._idle else None

    def boot(self, payload: bytes) -> tuple[Connection, BaseProcess] | None:
        """Hand ``payload`` (a pickled ``HostBoot``) to an idle process; None if there is
        none or the one taken had died (the caller starts one of its own)."""
        item = self.take()
        if item is None:
            return None
        conn, proc = item
        try:
            conn.send_bytes(payload)
        except (OSError, ValueError):  # it died while it waited
            _discard(conn, proc)
            return None
        return item

    @staticmethod
    def pickled(boot: object) -> bytes:
        """``boot`` as :meth:`boot` sends it (pickling errors surface here, before a process
        is taken)."""
        return bytes(reduction.ForkingPickler.dumps(boot))

    def _fill(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                short = len(self._idle) < self._size and not self._spawning
            if not short:
                self._wake.wait()
                self._wake.clear()
                continue
            if self._spawned.wait(REFILL_QUIET):  # not quiet yet
                self._spawned.clear()
                continue
            try:
                item = self._start()
            except Exception:  # the fork server is gone (the control process is ending)
                log.exception("starting a pooled agent process failed")
                return
            with self._lock:
                if not self._closed:
                    self._idle.append(item)
                    continue
            _discard(*item)
            return

    def _start(self) -> tuple[Connection, BaseProcess]:
        here, there = process_context().Pipe(duplex=True)
        try:
            proc = start_process(
                agent_process_main,
                (there, self._address, None, self._memory_bytes),
                name="agent-pooled",
            )
        except BaseException:
            here.close()
            raise
        finally:
            there.close()
        return here, proc

    def close(self) -> None:
        """Stop refilling and end every idle process (see the module docstring). Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        self._wake.set()
        self._thread.join()
        for conn, proc in idle:
            _discard(conn, proc)


def _discard(conn: Connection, proc: BaseProcess) -> None:
    """Close an idle process's pipe (it discards its shell and exits); kill it past the
    grace."""
    with contextlib.suppress(OSError):
        conn.close()
    proc.join(EXIT_GRACE)
    if proc.exitcode is None:
        proc.kill()
        proc.join(EXIT_GRACE)
