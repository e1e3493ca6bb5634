"""A node's launcher learns that its raylet exited at the exit itself, not when the raylet is
reaped (``actors/ray_launcher.py``: :func:`watch_exit`): a SIGKILLed raylet stays a zombie until
init reaps it, and Ray's own worker check (``kill(pid, 0)``) counts a zombie as alive, so the
node's hosts outlived a lost node by seconds and finished calls on it.

Runs everywhere (no ``ray`` marker, no cluster): the watched process is a real ``sleep`` this
test started and never waits for, so after its SIGKILL it stays a zombie for the whole test --
the very state a killed raylet is in until init gets to it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import psutil

from exarch_actors.actors.ray_launcher import watch_exit
from tests.support.waiting import HANG_GUARD


def test_the_watch_fires_when_the_process_exits_while_it_is_still_an_unreaped_zombie() -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:

        async def watch() -> str:
            fired = asyncio.Event()
            fd = watch_exit(proc.pid, fired.set)
            assert fd is not None
            try:
                os.kill(proc.pid, signal.SIGKILL)
                await asyncio.wait_for(fired.wait(), HANG_GUARD)
                return psutil.Process(proc.pid).status()
            finally:
                asyncio.get_running_loop().remove_reader(fd)
                os.close(fd)

        status = asyncio.run(watch())
        assert status == psutil.STATUS_ZOMBIE, "fired at the exit, before any reaping"
    finally:
        proc.kill()
        proc.wait()
