"""A small warm pool of agent processes, forked ahead of the spawns that take them.

A process agent's spawn used to wait for two fork-server round trips in series -- its agent
process, then (from there) its shell -- and for both processes to start up. A pooled agent
process is forked from the one fork server before anyone asks for it, starts its shell host at
once (``actors/host_start.py``) and then waits for its ``HostBoot``: a spawn that takes one
sends the boot over the pipe and is left with building the agent and restoring its shell
(docs/benchmarks.md has the figures).

Every take starts a replacement at once, and a spawn that finds the pool empty waits for the
replacement already being forked rather than forking its own: back-to-back spawns become a
pipeline, each building its agent while the next one's process and shell start beside it (on
the second core), instead of each starting both itself. A refill costs the same work as the cold
start it replaces, so the pool only moves work earlier; it never adds any during a burst. (The
pool used to refill only after 0.25 s without a spawn, because a refill started beside each
back-to-back spawn slowed them under a load average of 120-160; since an agent process imports
nothing after its fork (``actors/fork_warm.py``) the pipeline is the faster of the two,
docs/benchmarks.md.)

Invariants:
- A pooled process is an ordinary agent process before its boot: forked by the one fork server,
  ``PR_SET_PDEATHSIG``, so it dies with the control process however that ends (its shell too).
- Before its boot the only thing on its pipe is the pickled ``HostBoot`` (the channel's frames
  start after it); an end of file instead makes it discard its shell and exit.
- At most :data:`POOL_SIZE` idle processes (about 12 MiB PSS each, agent process and shell).
- A process that died while idle is never handed out (:meth:`HostPool.boot` checks before it
  sends and takes the next); a take never waits on a pool that cannot refill (closed, or its
  last start failed): the spawn then starts its own process, as without a pool.
- :meth:`HostPool.close` returns once the refill thread has stopped and every idle process (and
  the shell each started) has exited: the pool never outlives its fleet.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from exarch_actors.actors.agent_process_host import agent_process_main
from exarch_actors.actors.process import fork_server_address, process_context, start_process

log = logging.getLogger(__name__)

POOL_SIZE = 2
"""Idle agent processes kept ready. Two: the pipeline needs one being built while one is taken,
and on 2 cores a deeper pool starts no spawn sooner (each process's start is CPU work the
cores share); each costs an agent process and a shell (12.4 MiB PSS together, measured idle)
while it waits."""

TAKE_WAIT = 5.0
"""Seconds a take waits for the refill in flight (one fork-server round trip, milliseconds)
before the spawn starts its own process instead."""

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
        self._cond = threading.Condition()
        self._closed = False
        self._broken = False
        """The last start failed (the fork server is gone): takes no longer wait."""
        self.served = 0
        """Boots handed to a pooled process (a probe for tests and benchmarks)."""
        self._thread = threading.Thread(target=self._fill, name="host-pool", daemon=True)
        self._thread.start()

    def idle_pids(self) -> list[int]:
        """The pids of the idle processes it holds now."""
        with self._cond:
            return [proc.pid for _, proc in self._idle if proc.pid is not None]

    def take(self, wait: bool = True) -> tuple[Connection, BaseProcess] | None:
        """An idle process (its pipe's control end and its handle), waiting for the one being
        forked if none is idle (``wait``); None if the pool cannot refill, or has none idle
        and ``wait`` is False. The refill thread starts its replacement at once."""
        with self._cond:
            if wait:
                self._cond.wait_for(
                    lambda: self._idle or self._closed or self._broken, timeout=TAKE_WAIT
                )
            if not self._idle:
                return None
            item = self._idle.popleft()
            self._cond.notify_all()
            return item

    def boot(self, payload: bytes, wait: bool = True) -> tuple[Connection, BaseProcess] | None:
        """Hand ``payload`` (a pickled ``HostBoot``) to an idle process; None if the pool has
        none to give (the caller starts one of its own). One that died while it waited is
        discarded and the next one taken. ``wait``: as :meth:`take`'s (a spawn of a batch
        booting side by side starts its own process rather than wait for the refill)."""
        while (item := self.take(wait)) is not None:
            conn, proc = item
            if proc.exitcode is None:  # polls its sentinel: a dead one is never handed out
                try:
                    conn.send_bytes(payload)
                except (OSError, ValueError):  # it died just now
                    pass
                else:
                    with self._cond:
                        self.served += 1
                    return item
            _discard(conn, proc)
        return None

    @staticmethod
    def pickled(boot: object) -> bytes:
        """``boot`` as :meth:`boot` sends it (pickling errors surface here, before a process
        is taken)."""
        return bytes(reduction.ForkingPickler.dumps(boot))

    def _fill(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or len(self._idle) < self._size)
                if self._closed:
                    return
            try:
                item = self._start()
            except Exception:  # the fork server is gone (the control process is ending)
                log.exception("starting a pooled agent process failed")
                with self._cond:
                    self._broken = True
                    self._cond.notify_all()
                return
            with self._cond:
                if not self._closed:
                    self._idle.append(item)
                    self._cond.notify_all()
                    continue
            _discard(*item)
            return

    def _start(self) -> tuple[Connection, BaseProcess]:
        # the address asked for each start, not kept: a fork server that died (a signal to the
        # control process's group; its children die with it) is started again by the next
        # start, at another address, and a host told the dead one's could not start its shell
        # (``ECONNREFUSED``: a restarted agent on it failed, its shell actor never booted)
        address = fork_server_address()
        here, there = process_context().Pipe(duplex=True)
        try:
            proc = start_process(
                agent_process_main,
                (there, address, None, self._memory_bytes),
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
        with self._cond:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
            self._cond.notify_all()
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
