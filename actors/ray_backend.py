"""The Ray backend: agent hosts forked on cluster nodes, the control plane in this process.

``--backend ray`` (``FleetConfig.backend``). The agent host is the very same
:class:`actors.agent_process_host.AgentProcess` as the local process backend; only who starts it
differs. On each node it uses, the backend keeps one launcher (``actors/ray_launcher.py``: a
long-lived Ray actor placed by hard node affinity, made on first use, with a preloaded fork
server). :meth:`RayBackend.launch` opens a one-shot TCP listener on the driver's node address and
asks the launcher of the node its placement chose (``spread`` or ``pack``) to fork a host there:
the host connects back, both ends prove they hold the launch's random key
(``multiprocessing``'s HMAC challenge, both ways: ``actors/launch_listener.py``), and from then
on the channel is the agent-channel protocol (``runtime/fleet/agent_channel.py``) over that
socket instead of a pipe -- control frames, verdicts, ``Publish`` batches and site calls
unchanged. The host's shell is forked from the same fork server; ``Born`` names the Ray node id.
The registry, bus, journal and spawn site stay in the driver.

Placement ``spread`` puts each new host on the alive node that holds the fewest of this run's
live hosts, ``pack`` on the one that holds the most (ties: Ray's order of nodes), by Ray's node
affinity, hard. Ray's ``DEFAULT`` strategy did not pack agent actors (they reserve no CPU):
examples/chain.toml's four agents landed on both nodes in 3 runs of 3. Measured on Ray 2.60 with
a two-node cluster: Ray's own ``SPREAD``, with hosts created one at a time as spawns arrive, put
all three hosts of examples/fanout.toml on one node in some runs; soft affinity sent 5 of 12
actors to the other node; hard affinity placed 12 of 12 where asked. A node that vanishes
between the choice and the start fails that start (its launcher dies, or cannot be made),
which the supervisor counts like any failed restart. A node where a host died of a signal, or a
start failed, is passed over for ``SUSPECT_SECS`` while another node is alive: a restart after
a node is lost goes elsewhere even while Ray still lists the lost node as alive.

Invariants:
- The listener, bound to the driver's node address only, takes exactly one host and only
  within ``BORN_TIMEOUT``, and gives up as soon as the host has ended without connecting; a
  peer that fails the key challenge is logged, closed and passed over, never served, and the
  listener goes on waiting for the real host (``actors/launch_listener.py``).
- A launcher found dead (its Ray worker killed) is replaced by a new one on the same node, once
  per launch; the hosts it had forked died with it (their channels' end of file is a crash).
- No orphans: launchers are ordinary actors of the driver's Ray job (Ray kills them when the job
  ends or the driver dies, and their hosts die with their fork servers); :meth:`close` stops
  each launcher's hosts and fork server, then kills it.
- Ray is optional (``pip install -e '.[ray]'``): it is imported only when a backend is made,
  and its absence is :class:`RayNotInstalled`, never an ``ImportError``.

An agent with a resource request (``runtime/fleet/placement.py``: ``num_cpus``, custom
resources) is handed to Ray's scheduler: a placement group of one bundle, asked of the node the
placement chose among those that could hold it, held by Ray where the resources are free; its
host is forked on that node and the group removed when the host ends. :meth:`RayBackend.
watch_nodes` is the fleet's node watch (``actors/ray_nodes.py``): a node that left is dropped
from the books, one that joined is placed on from the next start (placement reads Ray's alive
nodes every time).

The session directory is the driver's: each host writes a copy on its node
(:func:`actors.ray_launcher.node_session`, seeded with the driver's copy of its agent's files)
and ships every durable write to the driver (``runtime/state/record_mirror.py``), so no node
needs to see the driver's path. A host that dies for good leaves its agent settled ``down``
with ``release-unconfirmed`` (``actors/agent_executor.py``). :meth:`RayBackend.kill_worker`
and :meth:`RayBackend.remove_node` are the drill's Ray faults. See docs/scale-out.md.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

from exarch_actors.actors.agent_process import BORN_TIMEOUT
from exarch_actors.actors.agent_process_host import HostBoot
from exarch_actors.actors.launch_listener import accept_host, open_listener
from exarch_actors.actors.ray_launcher import SHELL_GRACE, NodeLauncher
from exarch_actors.actors.ray_nodes import NodeChange, NodeWatch
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.fleet.placement import PlacementPolicy, ResourceRequest
from exarch_actors.runtime.state.record_mirror import agent_files
from exarch_actors.runtime.state.run_processes import RunProcess

Placement = Literal["spread", "pack"]

SUSPECT_SECS = 30.0
"""Seconds a node is passed over after a host died there of a signal (Ray declares a lost node
dead only after its health checks fail, so ``ray.nodes()`` may list it as alive meanwhile)."""


CONNECT_PROBE = 5.0
"""Seconds a first TCP connection to ``--ray-address`` may take before it is unreachable."""

FAULT_TIMEOUT = 30.0
"""Seconds a drill's fault task may take to be placed on its node and run there."""

INSTALL_HINT = "--backend ray needs Ray: pip install -e '.[ray]' (ray>=2.40)"


class RayNotInstalled(ExarchError):
    """``--backend ray`` was asked for, but Ray cannot be imported here."""


class RayFaultRefused(ExarchError):
    """A drill's Ray fault could not be applied (no such process or node, the head node)."""


class RayUnreachable(ExarchError):
    """``--ray-address`` names no reachable cluster (nothing takes a TCP connection there)."""


class RayHostFailed(ExarchError):
    """A Ray-hosted agent never connected back (its host ended first, or took too long)."""


class PlacementInfeasible(RayHostFailed):
    """Ray's scheduler placed an agent's resource request on no node within
    ``BORN_TIMEOUT`` (no node has it, or none had it free)."""


class _LauncherGone(ExarchError):
    """The launcher asked to fork a host was dead (or could not be made) before it connected."""


def require_ray() -> Any:
    """The ``ray`` module, or :class:`RayNotInstalled` saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalled(INSTALL_HINT) from e
    return ray


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
    """The control side's handle on one agent host a node's launcher forked (a
    ``HostProcess``)."""

    launcher: Any
    host_id: str
    done: Any
    """The launcher's ``run`` call's object ref: ready when the host has ended, however."""
    node: str = ""
    """The node it was placed on (``""``: left to Ray, when Ray listed no node alive)."""
    pid: int | None = 0
    exitcode: int | None = None
    on_end: Any = None
    shell_pid: int | None = None
    """Its shell, once ``Born``: the launcher reaps it with the host."""
    group: Any = None
    """The placement group holding its resource request on its node, if it made one (removed
    when the host ends)."""

    def born(self, pid: int, shell_pid: int | None) -> None:
        """The host reported ``Born``: its launcher is told which shell is the host's."""
        self.pid = pid
        self.shell_pid = shell_pid
        if shell_pid:
            with contextlib.suppress(Exception):
                self.launcher.adopt_shell.remote(self.host_id, shell_pid)

    def join(self, timeout: float | None = None) -> None:
        ray = require_ray()
        ready, _ = ray.wait([self.done], timeout=timeout)
        if not ready:
            return
        try:
            self.exitcode = int(ray.get(self.done))
        except ray.exceptions.RayActorError:
            self.exitcode = -9  # its launcher died, and the host with the launcher's fork server
        except Exception:
            self.exitcode = 1  # the launcher could not start it
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.launcher.kill.remote(self.host_id, self.shell_pid)
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end(self)


class RayBackend:
    """Starts agent hosts on Ray nodes through each node's launcher (a ``HostBackend``).
    Connects to Ray on first use: ``address`` ``HOST:PORT`` or ``auto``, or None for a local
    Ray instance of its own, which :meth:`close` stops."""

    def __init__(
        self,
        address: str | None = None,
        placement: Placement = "spread",
        requests: PlacementPolicy | None = None,
    ) -> None:
        self.address = address
        self.placement = placement
        self.requests = requests or PlacementPolicy()
        """Each agent's resource request (``runtime/fleet/placement.py``)."""
        self._ray = require_ray()
        self._lock = threading.Lock()
        self._launcher_class: Any = None
        self._host = "127.0.0.1"
        self._launchers: dict[str, Any] = {}
        """This run's launcher on each node it used, by node id."""
        self._ids = itertools.count(1)
        self._asked = 0
        self._placed: dict[str, int] = {}
        """Live hosts this backend placed, by node id."""
        self._suspect: dict[str, float] = {}
        """Nodes where a host died of a signal or a start failed: when (monotonic seconds)."""
        self._removed: set[str] = set()
        """Nodes :meth:`remove_node` took out: never placed on, never removed again."""
        self._sessions: set[str] = set()
        """The driver's session directories this backend started hosts for (their node copies
        are removed at :meth:`close`)."""
        self._used: set[str] = set()
        """Every node a host was started on (a node whose launcher died still holds copies)."""

    def connect(self) -> None:
        """Join the cluster now (``ray.init``), on the calling thread: the CLI's main thread,
        before any UI or worker thread exists (a first ``ray.init`` from the chat's control
        thread never returned here). Later calls are no-ops. An ``address`` ``HOST:PORT``
        that takes no TCP connection is :class:`RayUnreachable` at once: ``ray.init`` itself
        retried such an address for over 5 minutes here before giving up."""
        if self.address not in (None, "auto") and not self._ray.is_initialized():
            host, _, port = str(self.address).rpartition(":")
            try:
                socket.create_connection((host or "127.0.0.1", int(port)), CONNECT_PROBE).close()
            except (OSError, ValueError) as e:
                raise RayUnreachable(
                    f"no Ray cluster answers at {self.address} ({type(e).__name__}: {e})"
                ) from None
        self._connect()

    def _connect(self) -> Any:
        with self._lock:
            if self._launcher_class is None:
                ray = self._ray
                if not ray.is_initialized():
                    ray.init(
                        address=self.address,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level=logging.WARNING,
                    )
                self._host = ray.util.get_node_ip_address()
                self._launcher_class = ray.remote(NodeLauncher)
            return self._launcher_class

    def launcher(self, node: str) -> Any:
        """This run's launcher on ``node`` (made, placed there by hard affinity, if need be)."""
        launcher_class = self._connect()
        with self._lock:
            launcher = self._launchers.get(node)
            if launcher is None:
                strategy: Any = "SPREAD"
                if node:
                    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                    strategy = NodeAffinitySchedulingStrategy(node, soft=False)
                launcher = launcher_class.options(num_cpus=0, scheduling_strategy=strategy).remote()
                self._launchers[node] = launcher
            return launcher

    def alive_nodes(self) -> dict[str, str]:
        """The cluster's alive nodes: id -> address."""
        self._connect()
        return {
            str(n["NodeID"]): str(n.get("NodeManagerAddress", ""))
            for n in self._ray.nodes()
            if n.get("Alive")
        }

    def watch_nodes(self, on_change: Callable[[NodeChange], None]) -> NodeWatch:
        """A watch of the cluster's nodes (``actors/ray_nodes.py``) that also keeps this
        backend's books: a node that left holds none of its hosts and no launcher any more.
        ``on_change`` hears each change after that; the caller closes the watch."""

        def changed(change: NodeChange) -> None:
            if change.change == "left":
                with self._lock:
                    self._placed.pop(change.node, None)
                    self._suspect.pop(change.node, None)
                    launcher = self._launchers.pop(change.node, None)
                if launcher is not None:
                    with contextlib.suppress(Exception):
                        self._ray.kill(launcher, no_restart=True)
            on_change(change)

        return NodeWatch(self.alive_nodes, changed)

    def launchers(self) -> dict[str, Any]:
        """The live launchers by node id (what ``check`` may ask for leftovers)."""
        with self._lock:
            return dict(self._launchers)

    @property
    def where(self) -> str:
        """What :meth:`running` looked at last (a ``ProcessTable``'s report line)."""
        return f"{self._asked} Ray node(s)"

    def running(self, procs: Sequence[RunProcess]) -> list[RunProcess]:
        """Those of ``procs`` (a session's processes) that still run on any alive node of the
        cluster, each node's launcher looking on its own (a ``ProcessTable``, for ``check``)."""
        self._connect()
        nodes = [str(n["NodeID"]) for n in self._ray.nodes() if n.get("Alive")]
        asked = [self.launcher(node).running.remote(list(procs)) for node in nodes]
        found: set[int] = set()
        for indexes in self._ray.get(asked, timeout=BORN_TIMEOUT):
            found.update(indexes)
        self._asked = len(nodes)
        return [p for i, p in enumerate(procs) if i in found]

    def _forget(self, node: str, launcher: Any) -> None:
        with self._lock:
            if self._launchers.get(node) is launcher:
                del self._launchers[node]
        with contextlib.suppress(Exception):
            self._ray.kill(launcher, no_restart=True)

    def launch(self, boot: HostBoot) -> tuple[Connection, RayHostProcess]:
        self._connect()
        request = self.requests.for_agent(boot.spec.name)
        node = self._place(request)
        group = None
        try:
            if not request.empty:
                node, group = self._reserve(node, request, boot.spec.name)
            try:
                return self._launch_on(node, boot, group)
            except _LauncherGone:  # its Ray worker was killed: a new launcher, once
                return self._launch_on(node, boot, group)
        except BaseException as e:
            self._unplace(node)
            self._release(group)
            if isinstance(e, _LauncherGone):
                self._suspect[node] = time.monotonic()
                raise RayHostFailed(f"agent {boot.spec.name}: {e}") from e
            raise

    def _reserve(self, node: str, request: ResourceRequest, name: str) -> tuple[str, Any]:
        """Hand ``request`` to Ray's scheduler: a placement group of one bundle, asked of
        ``node`` (placement's choice) and put by Ray where the resources are free, preferring
        it. Returns the node it holds them on, and the group."""
        from ray.util.placement_group import placement_group, placement_group_table

        group = placement_group(
            [request.bundle()], strategy="STRICT_PACK", _soft_target_node_id=node or None
        )
        if not group.wait(timeout_seconds=int(BORN_TIMEOUT)):
            self._release(group)
            raise PlacementInfeasible(
                f"agent {name}: no node of the cluster held {request.describe()} "
                f"within {BORN_TIMEOUT:g} s (none has it, or none had it free)"
            )
        held = str(placement_group_table(group)["bundles_to_node_id"][0])
        if held != node:  # Ray chose another: count it there
            self._unplace(node)
            with self._lock:
                self._placed[held] = self._placed.get(held, 0) + 1
        return held, group

    def _release(self, group: Any) -> None:
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(group)

    def _launch_on(
        self, node: str, boot: HostBoot, group: Any = None
    ) -> tuple[Connection, RayHostProcess]:
        launcher = self.launcher(node)
        key = secrets.token_bytes(32)
        host_id = f"{boot.spec.name}#{next(self._ids)}"
        name = boot.spec.name
        with self._lock:
            self._sessions.add(str(boot.session.root))
            self._used.add(node)
        with open_listener(self._host) as server:
            files = agent_files(boot.session, name)  # the driver's copy: a restart
            done = launcher.run.remote(host_id, server.getsockname()[:2], key, boot, files)
            handle = RayHostProcess(launcher, host_id, done, node, on_end=self._ended, group=group)
            deadline = time.monotonic() + BORN_TIMEOUT
            conn = accept_host(server, key, name, lambda: self._watch(handle, name, deadline))
        handle.on_end = self._ended
        return conn, handle

    def _watch(self, handle: RayHostProcess, name: str, deadline: float) -> None:
        """Give up a launch whose host ended, or has not connected within ``BORN_TIMEOUT``."""
        ended, _ = self._ray.wait([handle.done], timeout=0)
        if ended:
            try:
                self._ray.get(handle.done)
            except self._ray.exceptions.RayActorError as e:
                self._forget(handle.node, handle.launcher)
                raise _LauncherGone(f"the launcher on node {handle.node} is gone") from e
            except Exception:
                pass
        if ended or time.monotonic() > deadline:
            cause = "ended" if ended else "stalled"
            self._suspect[handle.node] = time.monotonic()
            handle.kill()
            raise RayHostFailed(f"agent {name}: its host {cause} before it connected")

    def _place(self, request: ResourceRequest | None = None) -> str:
        """The node for a new host: among the alive nodes that could hold ``request`` at all,
        the one ``spread`` or ``pack`` prefers. None listed that could (Ray's node table may
        lag behind its scheduler): ``""``, and Ray's scheduler alone decides
        (:meth:`_reserve`)."""
        nodes = [
            n for n in self._ray.nodes() if n.get("Alive") and str(n["NodeID"]) not in self._removed
        ]
        if request is not None and not request.empty:
            nodes = [n for n in nodes if request.fits(n.get("Resources", {}))]
        alive = [str(n["NodeID"]) for n in nodes]
        if not alive:
            return ""
        with self._lock:
            now = time.monotonic()
            trusted = [
                n for n in alive if now - self._suspect.get(n, -SUSPECT_SECS) >= SUSPECT_SECS
            ]
            choose = max if self.placement == "pack" else min
            node = choose(trusted or alive, key=lambda n: self._placed.get(n, 0))
            self._placed[node] = self._placed.get(node, 0) + 1
        return node

    def _unplace(self, node: str) -> None:
        with self._lock:
            if self._placed.get(node):
                self._placed[node] -= 1

    def _ended(self, handle: RayHostProcess) -> None:
        if handle.exitcode == -9:  # killed, or its launcher died: the node may be going
            self._suspect[handle.node] = time.monotonic()
        self._unplace(handle.node)
        group, handle.group = handle.group, None
        self._release(group)

    # -- faults, for the drill (runtime/drills/nemesis.py: RAY) ---------------------------------

    def kill_worker(self, node: str, pid: int) -> None:
        """SIGKILL process ``pid`` on ``node`` (an agent's host, or a Ray worker), from a task
        placed there: the kill lands on that node, whichever machine it is.
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

    def left_on_nodes(self, session_root: str, remove: bool) -> list[str]:
        """This run's copies of the session directory at ``session_root`` found on any alive
        node (``node ID: path``), removed there unless ``remove`` is false (``check``)."""
        self._connect()
        nodes = [str(n["NodeID"]) for n in self._ray.nodes() if n.get("Alive")]
        asked = [self.launcher(node).sweep.remote([session_root], remove) for node in nodes]
        found = self._ray.get(asked, timeout=BORN_TIMEOUT)
        return [f"node {node}: {path}" for node, paths in zip(nodes, found) for path in paths]

    def close(self) -> None:
        """Stop every launcher (its hosts, its fork server) and remove its node's copies of
        this run's session directories, then disconnect from Ray (stopping the local instance
        this backend started, if any). A node used by a launcher that died meanwhile gets a
        new one for the removal, if the node is still alive."""
        with self._lock:
            sessions = sorted(self._sessions)
            now = time.monotonic()
            lost = {n for n, at in self._suspect.items() if now - at < SUSPECT_SECS}
            orphaned = self._used - set(self._launchers) - self._removed - lost - {""}
        if sessions and orphaned:
            with contextlib.suppress(Exception):
                alive = {str(n["NodeID"]) for n in self._ray.nodes() if n.get("Alive")}
                for node in orphaned & alive:
                    self.launcher(node)
        with self._lock:
            launchers, self._launchers = list(self._launchers.values()), {}
        ray = self._ray
        if launchers:
            closing = [launcher.close.remote(sessions) for launcher in launchers]
            with contextlib.suppress(Exception):
                ray.wait(closing, num_returns=len(closing), timeout=2 * SHELL_GRACE)
            for launcher in launchers:
                with contextlib.suppress(Exception):
                    ray.kill(launcher, no_restart=True)
        with self._lock:
            if self._launcher_class is not None and ray.is_initialized():
                ray.shutdown()
            self._launcher_class = None
