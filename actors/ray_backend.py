"""The Ray backend: each agent host a Ray actor on a cluster, the control plane in this process.

``--backend ray`` (``FleetConfig.backend``). The agent host is the very same
:class:`actors.agent_process_host.AgentProcess` as the local process backend; only who starts it
differs. :meth:`RayBackend.launch` opens a one-shot TCP listener on the driver's node address,
creates a Ray actor on the node its placement chose (``spread`` or ``pack``) and
asks it to :meth:`_RayHost.serve` the agent: the actor connects back, both ends prove they hold
the launch's random key (``multiprocessing``'s HMAC challenge, both ways), and from then on the
channel is the agent-channel protocol (``runtime/fleet/agent_channel.py``) over that socket instead
of
a pipe -- control frames, verdicts, ``Publish`` batches and site calls unchanged.

On its node the actor starts a fork server of its own (its shell host and the shell's workers
are its children there: ``actors/process.py`` preloads the runtime once per actor) and reports
the Ray node id in ``Born``. The registry, bus, journal and spawn site stay in the driver.

Placement ``spread`` puts each new host on the alive node that holds the fewest of this run's
live hosts, ``pack`` on the one that holds the most (ties: Ray's order of nodes), by Ray's node
affinity, hard. Ray's ``DEFAULT`` strategy did not pack agent actors (they reserve no CPU):
examples/chain.toml's four agents landed on both nodes in 3 runs of 3. Measured on Ray 2.60 with
a two-node cluster: Ray's own ``SPREAD``, with hosts created one at a time as spawns arrive, put
all three hosts of examples/fanout.toml on one node in some runs; soft affinity sent 5 of 12
actors to the other node; hard affinity placed 12 of 12 where asked. A node that vanishes
between the choice and the start fails that start at once (the actor's ``serve`` ends before it
connects), which the supervisor counts like any failed restart. A node where a host's actor
died, or a start failed, is passed over for ``SUSPECT_SECS`` while another node is alive: a
restart after a node is lost goes elsewhere even while Ray still lists the lost node as alive.

Invariants:
- The listener accepts exactly one connection and only within ``BORN_TIMEOUT``, and gives up
  as soon as the actor has ended without connecting; a peer that fails the key challenge is
  refused (:class:`RayHostFailed`), never served.
- A host's end is the actor's end: :meth:`RayHostProcess.kill` is ``ray.kill`` (its shell sees
  end of file, its fork server sees its alive pipe close, and both exit with it), and a host
  whose ``serve`` returned is killed too, so no Ray worker outlives its agent.
- Ray is optional (``pip install -e '.[ray]'``): it is imported only when a backend is made,
  and its absence is :class:`RayNotInstalled`, never an ``ImportError``.

The session directory is the driver's: each host writes a copy on its node
(:func:`node_session`, seeded with the driver's copy of its agent's files by :func:`on_node`'s
caller) and ships every durable write to the driver (``runtime/state/record_mirror.py``), so
no node needs to see the driver's path. A host that dies for good leaves its agent settled
``down`` with ``release-unconfirmed`` (``actors/agent_executor.py``). :meth:`RayBackend.kill_worker`
and :meth:`RayBackend.remove_node` are the drill's Ray faults. See docs/scale-out.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any, Literal

from actors.agent_process import BORN_TIMEOUT
from actors.agent_process_host import AgentProcess, HostBoot
from actors.process import ensure_fork_server
from runtime.constants import SCRATCH_ENV
from runtime.errors import ExarchError
from runtime.state import durability
from runtime.state.record_mirror import agent_files, seed
from runtime.state.session_dir import SessionDir

Placement = Literal["spread", "pack"]

ACCEPT_POLL = 0.05
"""Seconds between looks at whether a host's actor ended before it connected back."""

SUSPECT_SECS = 30.0
"""Seconds a node is passed over after a host's actor died there (Ray declares a lost node
dead only after its health checks fail, so ``ray.nodes()`` may list it as alive meanwhile)."""

NODE_SESSIONS_ENV = "EXARCH_NODE_SESSIONS"
"""Where a node keeps its hosts' copies of session directories (see :func:`node_session`)."""

FAULT_TIMEOUT = 30.0
"""Seconds a drill's fault task may take to be placed on its node and run there."""

INSTALL_HINT = "--backend ray needs Ray: pip install -e '.[ray]' (ray>=2.40)"


class RayNotInstalled(ExarchError):
    """``--backend ray`` was asked for, but Ray cannot be imported here."""


class RayFaultRefused(ExarchError):
    """A drill's Ray fault could not be applied (no such process or node, the head node)."""


class RayHostFailed(ExarchError):
    """A Ray-hosted agent never connected back, or failed the launch key's challenge."""


def require_ray() -> Any:
    """The ``ray`` module, or :class:`RayNotInstalled` saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalled(INSTALL_HINT) from e
    return ray


# -- host side (runs in the Ray actor's process) ----------------------------------------------


class _RayHost:
    """The Ray actor: one agent host. ``serve`` blocks for the agent's whole life, so the
    actor is threaded (``ping`` and ``node`` answer meanwhile)."""

    def node(self) -> str:
        return str(require_ray().get_runtime_context().get_node_id())

    def ping(self, x: Any) -> Any:
        return x

    def serve(
        self, address: tuple[str, int], key: bytes, boot: HostBoot, files: dict[str, bytes]
    ) -> int:
        conn = Client(address, authkey=key)
        no_delay(conn.fileno())
        ensure_fork_server()  # this node's: the shell host is forked here, warm
        local = node_session(boot.session)
        seed(local, boot.spec.name, files)
        boot = on_node(boot, local)
        host = AgentProcess(conn, boot, node=self.node())
        bound = durability.bind(local.root, boot.durability, ship=host.ship)
        try:
            host.serve()
        finally:
            durability.unbind(bound)
        return os.getpid()


def no_delay(fd: int) -> None:
    """Turn Nagle's algorithm off on the channel's TCP socket. A host sends small frames
    back to back without waiting for a reply (a ``RecordFrame``, then a ``Call``): with Nagle
    the second waits for the first one's ACK, which the peer delays (40 ms on Linux). Measured on
    the dev box (load 150): 60 ral calls of a Ray-hosted trunk, median gap between calls 45 ms
    with Nagle on, 1.0 ms with it off."""
    with socket.socket(fileno=os.dup(fd)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def node_session(driver: SessionDir) -> SessionDir:
    """This node's copy of the driver's session directory: under ``$EXARCH_NODE_SESSIONS``
    (default ``<temp dir>/exarch-node``), named by the driver's directory and a digest of its
    full path, so two runs never share one even when their directories share a name."""
    base = Path(os.environ.get(NODE_SESSIONS_ENV) or Path(tempfile.gettempdir()) / "exarch-node")
    digest = hashlib.sha256(str(driver.root.resolve()).encode()).hexdigest()[:10]
    return SessionDir.at(base / f"{driver.root.name}-{digest}")


def on_node(boot: HostBoot, local: SessionDir) -> HostBoot:
    """``boot`` with this node's session copy, and ``$EXARCH_SCRATCH`` in the shell's context
    (and in its snapshot's) pointing at this node's scratch directory, which it makes."""
    name = boot.spec.name
    scratch = local.scratch(name)
    scratch.mkdir(parents=True, exist_ok=True)
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


def _kill_pid(pid: int) -> str | None:
    """Runs as a Ray task on the target's node: SIGKILL ``pid`` there."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as e:
        return f"cannot kill pid {pid}: {e}"
    return None


def _kill_raylet() -> str | None:
    """Runs as a Ray task on the node to remove: SIGKILL its raylet (this worker's parent)."""
    import psutil

    raylet = psutil.Process(os.getppid())
    if raylet.name() != "raylet":
        return f"this worker's parent is {raylet.name()}, not the raylet"
    raylet.kill()
    return None


# -- control side -----------------------------------------------------------------------------


@dataclass
class RayHostProcess:
    """The control side's handle on one Ray-hosted agent host (a ``HostProcess``)."""

    actor: Any
    done: Any
    """The ``serve`` call's object ref: ready when the host has ended, however."""
    node: str = ""
    """The node it was placed on (``""``: left to Ray, when Ray listed no node alive)."""
    pid: int | None = 0
    exitcode: int | None = None
    on_end: Any = None

    def join(self, timeout: float | None = None) -> None:
        ray = require_ray()
        ready, _ = ray.wait([self.done], timeout=timeout)
        if not ready:
            return
        try:
            ray.get(self.done)
            self.exitcode = 0
        except ray.exceptions.RayActorError:
            self.exitcode = -9  # the actor's process died under it: a crash
        except Exception:
            self.exitcode = 1  # the host raised: it ended without reporting
        self.kill()

    def kill(self) -> None:
        ray = require_ray()
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end(self)


class RayBackend:
    """Starts agent hosts as Ray actors (a ``HostBackend``). Connects to Ray on first use:
    ``address`` ``HOST:PORT`` or ``auto``, or None for a local Ray instance of its own, which
    :meth:`close` stops."""

    def __init__(self, address: str | None = None, placement: Placement = "spread") -> None:
        self.address = address
        self.placement = placement
        self._ray = require_ray()
        self._lock = threading.Lock()
        self._actor_class: Any = None
        self._host = "127.0.0.1"
        self._placed: dict[str, int] = {}
        """Live hosts this backend placed, by node id."""
        self._suspect: dict[str, float] = {}
        """Nodes where a host's actor died or a start failed: when (monotonic seconds)."""
        self._removed: set[str] = set()
        """Nodes :meth:`remove_node` took out: never placed on, never removed again."""

    def _connect(self) -> Any:
        with self._lock:
            if self._actor_class is None:
                ray = self._ray
                if not ray.is_initialized():
                    ray.init(
                        address=self.address,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level=logging.WARNING,
                    )
                self._host = ray.util.get_node_ip_address()
                self._actor_class = ray.remote(_RayHost)
            return self._actor_class

    def launch(self, boot: HostBoot) -> tuple[Connection, RayHostProcess]:
        actor_class = self._connect()
        node, strategy = self._place()
        key = secrets.token_bytes(32)
        with socket.create_server((self._host, 0)) as server:
            server.settimeout(ACCEPT_POLL)
            actor = actor_class.options(
                num_cpus=0,
                max_concurrency=4,
                scheduling_strategy=strategy,
                name=None,
            ).remote()
            files = agent_files(boot.session, boot.spec.name)  # the driver's copy: a restart
            done = actor.serve.remote(server.getsockname()[:2], key, boot, files)
            handle = RayHostProcess(actor, done, node, on_end=self._ended)
            sock = self._accept(server, handle, boot.spec.name)
        sock.settimeout(None)
        no_delay(sock.fileno())
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
        except Exception as e:
            conn.close()
            handle.kill()
            raise RayHostFailed(f"agent {boot.spec.name}: refused a peer ({e})") from e
        return conn, handle

    def _accept(self, server: socket.socket, handle: RayHostProcess, name: str) -> socket.socket:
        deadline = time.monotonic() + BORN_TIMEOUT
        while True:
            try:
                sock, _ = server.accept()
                return sock
            except TimeoutError:
                pass
            ended, _ = self._ray.wait([handle.done], timeout=0)
            if ended or time.monotonic() > deadline:
                cause = "ended" if ended else "stalled"
                self._suspect[handle.node] = time.monotonic()
                handle.kill()
                raise RayHostFailed(f"agent {name}: its Ray actor {cause} before it connected")

    def _place(self) -> tuple[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [
            str(n["NodeID"])
            for n in self._ray.nodes()
            if n.get("Alive") and str(n["NodeID"]) not in self._removed
        ]
        if not alive:
            return "", "SPREAD"
        with self._lock:
            now = time.monotonic()
            trusted = [
                n for n in alive if now - self._suspect.get(n, -SUSPECT_SECS) >= SUSPECT_SECS
            ]
            choose = max if self.placement == "pack" else min
            node = choose(trusted or alive, key=lambda n: self._placed.get(n, 0))
            self._placed[node] = self._placed.get(node, 0) + 1
        return node, NodeAffinitySchedulingStrategy(node, soft=False)

    def _ended(self, handle: RayHostProcess) -> None:
        with self._lock:
            if handle.exitcode == -9:  # its actor's process died: the node may be going
                self._suspect[handle.node] = time.monotonic()
            if handle.node in self._placed:
                self._placed[handle.node] -= 1

    # -- faults, for the drill (runtime/drills/nemesis.py: RAY) ---------------------------------

    def kill_worker(self, node: str, pid: int) -> None:
        """SIGKILL process ``pid`` on ``node`` (the Ray worker an agent's actor runs in), from a
        task placed there: the kill lands on that node, whichever machine it is.
        :class:`RayFaultRefused` when the task could not do it (no such process there)."""
        self._on_node(node, _kill_pid, pid)

    def remove_node(self, node: str) -> None:
        """Take ``node`` out of the cluster mid-run: a task placed there SIGKILLs its raylet,
        and every Ray worker on it dies with it. The head (the cluster's control store) is
        refused (:class:`RayFaultRefused`), as is a node that is not alive."""
        if not self.removable(node):
            raise RayFaultRefused(f"node {node} is the head, not alive, or not in the cluster")
        with self._lock:
            self._removed.add(node)
        self._on_node(node, _kill_raylet, wait=False)

    def removable(self, node: str) -> bool:
        """Whether :meth:`remove_node` may take ``node``: alive, and not the head."""
        self._connect()
        if node in self._removed:
            return False
        for n in self._ray.nodes():
            if str(n["NodeID"]) == node:
                head = any(k.startswith("node:__internal_head__") for k in n.get("Resources", {}))
                return bool(n.get("Alive")) and not head
        return False

    def _on_node(self, node: str, fn: Any, *args: Any, wait: bool = True) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        self._connect()
        task = ray.remote(num_cpus=0, max_retries=0)(fn).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        )
        ref = task.remote(*args)
        if not wait:
            ray.wait([ref], timeout=FAULT_TIMEOUT)  # it ran, or its node went with it
            return
        try:
            error = ray.get(ref, timeout=FAULT_TIMEOUT)
        except Exception as e:
            raise RayFaultRefused(f"node {node}: {type(e).__name__}: {e}") from e
        if error:
            raise RayFaultRefused(f"node {node}: {error}")

    def close(self) -> None:
        """Disconnect from Ray (stopping the local instance this backend started, if any)."""
        with self._lock:
            if self._actor_class is not None and self._ray.is_initialized():
                self._ray.shutdown()
            self._actor_class = None
