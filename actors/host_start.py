"""A shell host started ahead of the shell actor that will own it.

An agent process starts its shell host first thing, on a thread, and builds its agent
meanwhile: the fork-server round trip and the host's own start then overlap the agent's
construction instead of following it (measured, docs/benchmarks.md: the shell's start was a
third of a process agent's spawn). A pooled agent process (``actors/host_pool.py``) starts its
shell the same way before any spawn takes it.
"""

from __future__ import annotations

import logging
import threading

from exarch_actors.actors.process import ChildProcess
from exarch_actors.actors.shell_host import host_main

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
"""Seconds :meth:`HostStart.take` waits for the start (a shell actor waits as long for a boot)."""


class HostStart:
    """A shell host being started on a thread of its own (see the module docstring).

    The shell actor's first boot restores into it (:meth:`take`); a host that failed to start is
    replaced by a fresh one there, and one never taken is killed by :meth:`discard`, so none is
    left behind. The host restores nothing until the actor sends ``restore``."""

    def __init__(self, name: str, memory_bytes: int | None) -> None:
        self._name = name
        self._memory_bytes = memory_bytes
        self._host: ChildProcess | None = None
        self._taken = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._start, name="shell-start", daemon=True).start()

    def _start(self) -> None:
        try:
            self._host = ChildProcess(
                host_main, name=f"ral-shell-{self._name}", memory_bytes=self._memory_bytes
            )
        except Exception:  # the first boot starts one itself and reports its failure
            log.exception("starting %s's shell host ahead failed", self._name)
        finally:
            self._done.set()

    def take(self, memory_bytes: int | None) -> ChildProcess | None:
        """The started host, once (None if it failed, was taken, or has another memory
        limit than the one wanted)."""
        self._done.wait(START_TIMEOUT)
        with self._lock:
            if self._taken or self._host is None or memory_bytes != self._memory_bytes:
                return None
            self._taken = True
            return self._host

    def discard(self) -> None:
        """Kill and reap the host if no actor took it. Idempotent."""
        self._done.wait(START_TIMEOUT)
        with self._lock:
            host, self._taken = (None if self._taken else self._host), True
        if host is not None:
            host.kill()
            host.reap(grace=0.0)
