"""A node's launcher: one long-lived Ray actor per node that forks agent hosts on request.

The Ray backend (``actors/ray_backend.py``) keeps one :class:`NodeLauncher` per node it uses,
placed there by hard node affinity and made on first use. The launcher starts this machine's
fork server once (``actors/process.py``: the runtime preloaded) and forks each agent host from it
(:func:`actors.agent_process_host.agent_host_connect_main`), which connects back to the driver
exactly as a host in an actor of its own did, and starts its shell from the same fork server.
Measured on the 2-core dev box (Ray 2.60, two nodes): a new Ray actor per agent, with a fork
server of its own, cost 0.76 s per agent started and stopped; a fork from the launcher's warm
fork server is what a local agent process costs (``benchmarks/ray_call.py``,
docs/benchmarks.md).

The actor is an ``async`` one: :meth:`NodeLauncher.run` awaits its host's end for the host's
whole life (one pending call per live host, up to Ray's 1,000 concurrent calls of an async
actor), so the driver's handle on a host is that call's object ref, as it was the ``serve``
call's of a host actor.

Invariants:
- No orphans. The launcher is an ordinary (not detached) actor of the driver's Ray job, so Ray
  kills it when the job ends or the driver dies; its fork server exits at end of file of its
  ``alive`` pipe, and every host, shell and worker forked there dies with the fork server
  (``PR_SET_PDEATHSIG``). :meth:`NodeLauncher.close` does the same in order, waiting for each.
- A host is named by the driver's id for it, never by a pid alone: a pid is signalled only while
  the launcher holds the host's unreaped process (a host), or while ``psutil`` shows it a child
  of this fork server (a shell), so a reused pid is never hit.
- A shell whose host ended is given :data:`SHELL_GRACE` to see its end of file and exit, then
  killed (as the local backend's ``_reap_shell`` does on the driver's machine).
- A lost node takes its hosts at once. The launcher watches its raylet (its parent) through a
  pidfd, readable the moment the raylet exits; it then kills every host, shell and worker
  forked here and exits itself. Left to Ray, a worker leaves with its raylet only once its own
  liveness check (``kill(pid, 0)`` about once a second) fails, and that check takes a killed
  raylet not yet reaped -- a zombie -- for alive: here init reaps orphans every 1.2-1.5 s, and
  the hosts outlived their node by 2.2 s at load 13 (on a machine whose init never reaps, for
  as long as the run lasts), finishing calls on a node the run had lost.
- Nothing of a run is left on the node: :meth:`NodeLauncher.close` removes this node's copy of
  every session directory the driver names (its hosts' files and scratch), after the hosts that
  wrote them are dead; :meth:`NodeLauncher.sweep` does it for ``check`` after a driver that
  died before closing its launchers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psutil

from exarch_actors.actors.agent_process_host import HostBoot, agent_host_connect_main
from exarch_actors.actors.process import ensure_fork_server, fork_server_address, start_process
from exarch_actors.runtime.constants import SCRATCH_ENV
from exarch_actors.runtime.state.private import private_dirs
from exarch_actors.runtime.state.record_mirror import node_copy_name, seed
from exarch_actors.runtime.state.run_processes import RunProcess, still_running
from exarch_actors.runtime.state.session_dir import SessionDir

SHELL_GRACE = 5.0
"""Seconds a shell whose host ended may take to exit before it is killed."""

NODE_SESSIONS_ENV = "EXARCH_NODE_SESSIONS"
"""Where a node keeps its hosts' copies of session directories (see :func:`node_session`)."""


def node_session(driver: SessionDir) -> SessionDir:
    """This node's copy of the driver's session directory: under ``$EXARCH_NODE_SESSIONS``
    (default ``<temp dir>/exarch-node``), named by the driver's directory and a digest of its
    full path, so two runs never share one even when their directories share a name."""
    return SessionDir.at(node_sessions_base() / node_copy_name(driver.root))


def node_sessions_base() -> Path:
    """Where this node keeps session copies: ``$EXARCH_NODE_SESSIONS``, else
    ``<temp dir>/exarch-node``."""
    return Path(os.environ.get(NODE_SESSIONS_ENV) or Path(tempfile.gettempdir()) / "exarch-node")


def on_node(boot: HostBoot, local: SessionDir) -> HostBoot:
    """``boot`` with this node's session copy, and ``$EXARCH_SCRATCH`` in the shell's context
    (and in its snapshot's) pointing at this node's scratch directory, which it makes."""
    name = boot.spec.name
    scratch = local.scratch(name)
    private_dirs(scratch)
    where = str(scratch.resolve())
    spec = boot.spec
    if spec.context is not None and SCRATCH_ENV in spec.context.env:
        spec = replace(
            spec, context=replace(spec.context, env={**spec.context.env, SCRATCH_ENV: where})
        )
    snap = spec.snapshot
    env = dict(snap.context.get("env") or {}) if snap is not None else {}
    if snap is not None and SCRATCH_ENV in env:
        context = {**snap.context, "env": {**env, SCRATCH_ENV: where}}
        spec = replace(spec, snapshot=replace(snap, context=context))
    return replace(boot, session=local, spec=spec)


def _host_on_node(
    address: tuple[str, int],
    key: bytes,
    fork_address: str,
    boot: HostBoot,
    node: str,
    files: dict[str, bytes],
) -> None:
    """Process entry point of a host the launcher forked: its node's copy of the session
    directory seeded with the driver's copy of its agent's files (a restart or a resume on
    another node), then served with every durable write shipped to the driver."""
    local = node_session(boot.session)
    seed(local, boot.spec.name, files)
    agent_host_connect_main(address, key, fork_address, on_node(boot, local), node, ship=True)


def _kill_group(pid: int) -> None:
    """SIGKILL ``pid``'s process group (a host or shell leads its own) and ``pid`` itself."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        with contextlib.suppress(OSError):
            kill(target, signal.SIGKILL)


def watch_exit(pid: int, then: Callable[[], None]) -> int | None:
    """Call ``then`` on the running event loop once process ``pid`` exits -- at its exit, not
    at its reaping: a pidfd is readable as soon as its process is a zombie. Returns the pidfd
    (the caller closes it), or None where ``pid`` cannot be watched (gone already, no pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    asyncio.get_running_loop().add_reader(fd, then)
    return fd


def raylet_of_this_worker() -> int | None:
    """The pid of this Ray worker's raylet (its parent), or None if its parent is not one."""
    try:
        parent = psutil.Process(os.getppid())
        return parent.pid if parent.name() == "raylet" else None
    except psutil.Error:
        return None


class NodeLauncher:
    """The Ray actor (``ray.remote(NodeLauncher)``): this node's fork server and the hosts
    forked from it, by the driver's host id."""

    def __init__(self) -> None:
        import ray

        self._node = str(ray.get_runtime_context().get_node_id())
        self._fork_address = ""
        self._server_pid = 0
        self._hosts: dict[str, BaseProcess] = {}
        self._shells: dict[str, int] = {}
        self._raylet_watch: int | None = None
        """The pidfd on this node's raylet, watched from the first host on (module docstring)."""

    def _fork_server(self) -> str:
        """This node's fork server, started on the first host (a launcher that only answers
        :meth:`running` never starts one)."""
        if not self._fork_address:
            ensure_fork_server()
            self._fork_address = fork_server_address()
            server: Any = forkserver._forkserver
            self._server_pid = int(server._forkserver_pid)
        return self._fork_address

    def node(self) -> str:
        """The Ray node id this launcher runs on (what each of its hosts' ``Born`` names)."""
        return self._node

    def ping(self, x: Any) -> Any:
        return x

    def pid(self) -> int:
        return os.getpid()

    async def run(
        self,
        host_id: str,
        address: tuple[str, int],
        key: bytes,
        boot: HostBoot,
        files: dict[str, bytes],
    ) -> int:
        """Fork a host for ``boot`` that connects back to ``address`` with ``key``, its node's
        session copy seeded with ``files`` (the driver's copy of its agent's); return its exit
        code once it has ended (negative: the signal that killed it)."""
        proc = start_process(
            _host_on_node,
            (address, key, self._fork_server(), boot, self._node, files),
            name=f"agent-{boot.spec.name}",
        )
        if self._raylet_watch is None:
            raylet = raylet_of_this_worker()
            if raylet is not None:
                self._raylet_watch = watch_exit(raylet, self._node_lost)
        self._hosts[host_id] = proc
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(proc.sentinel, ended.set)
        try:
            await ended.wait()
        finally:
            loop.remove_reader(proc.sentinel)
            proc.join(1.0)
            del self._hosts[host_id]
        code = proc.exitcode
        with contextlib.suppress(ValueError):
            proc.close()
        await self._reap_shell(host_id)
        return -signal.SIGKILL if code is None else code

    async def kill(self, host_id: str, shell_pid: int | None = None) -> None:
        """SIGKILL the host (if it still runs) and its shell (``shell_pid``, from its
        ``Born``); idempotent."""
        if shell_pid:
            self._shells[host_id] = shell_pid
        proc = self._hosts.get(host_id)
        if proc is not None and proc.pid is not None and proc.exitcode is None:
            _kill_group(proc.pid)
        else:
            await self._reap_shell(host_id)

    def adopt_shell(self, host_id: str, shell_pid: int) -> None:
        """Remember the host's shell, so that it is reaped when the host ends."""
        self._shells[host_id] = shell_pid

    async def _reap_shell(self, host_id: str) -> None:
        pid = self._shells.pop(host_id, None)
        if pid is None or not self._is_ours(pid):
            return
        with contextlib.suppress(psutil.Error):
            shell = psutil.Process(pid)
            for _ in range(int(SHELL_GRACE / 0.05)):
                if not shell.is_running() or shell.status() == psutil.STATUS_ZOMBIE:
                    return
                await asyncio.sleep(0.05)
            _kill_group(pid)

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a live child of this launcher's fork server."""
        if not self._server_pid:
            return False
        try:
            return psutil.Process(pid).ppid() == self._server_pid
        except psutil.Error:
            return False

    def running(self, procs: list[RunProcess]) -> list[int]:
        """The indexes of those of ``procs`` (a session's processes) that still run on this
        node: ``check``'s leftover-process rule, asked of every node."""
        return [i for i, p in enumerate(procs) if still_running(p)]

    def _node_lost(self) -> None:
        """This node's raylet exited: its hosts go now, with everything forked here, and this
        launcher with them (Ray would end it later; nothing it runs can reach the node)."""
        try:
            self.close()
        finally:
            os._exit(1)

    def sweep(self, driver_roots: list[str], remove: bool = True) -> list[str]:
        """This node's copies of the session directories at ``driver_roots`` (the driver's
        paths) that exist here, removed unless ``remove`` is false: what a run left on this
        node."""
        found = []
        for root in driver_roots:
            copy = node_session(SessionDir(Path(root))).root
            if copy.exists():
                found.append(str(copy))
                if remove:
                    shutil.rmtree(copy, ignore_errors=True)
        return found

    def close(self, driver_roots: list[str] | None = None) -> None:
        """Kill every host, shell and worker forked here, stop the fork server (the launcher
        itself is ``ray.kill``-ed by the driver), then remove this node's copies of the session
        directories at ``driver_roots``."""
        if self._server_pid:
            self._stop_forks()
        self.sweep(driver_roots or [])

    def _stop_forks(self) -> None:
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self._server_pid).children(recursive=True)
            for p in children:
                _kill_group(p.pid)
            psutil.wait_procs(children, timeout=SHELL_GRACE)
        server: Any = forkserver._forkserver
        with contextlib.suppress(OSError, ChildProcessError):
            server._stop()
