"""A real two-node Ray cluster on this machine, inside a network namespace with only loopback.

One cluster per session (its start takes about 11 s on the 2-core dev box: head 6.5 s, second
node 4.3 s; it was started once per module before): a holder process (``sleep``)
keeps a fresh namespace made by ``unshare -n`` with ``lo`` up, and every command of a test --
``ray start`` for both nodes, the ``exarch-actors`` driver -- enters it with ``nsenter``, so
every Ray process binds 127.0.0.1 and nothing else. A process's namespace is also how the tests
find what a run left behind, and how the cluster is stopped at the end of the session: every
process in it is killed and reaped. Not ``ray stop``: it finds Ray's processes by name on the
whole machine, so it would stop every other Ray cluster here too (another test run's, a
benchmark's), whatever their namespace.

Each test still gets its own run: its own session directory (``tmp_path``), its own driver
(reaped by the suite's leak check, which sees the cluster's holder only because it was running
before the test began; the nodes' processes are not this process's children), and the
``cluster`` fixture waits after it until nothing of this project is left on any node, so the
next test starts from an idle two-node cluster. A test that loses a node (``test_ray_node_loss``)
leaves the cluster short: the next test's fixture adds a node back first.

Skips (with the reason) when Ray is not installed or the namespace cannot be made here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
_MAIN = "from exarch_actors.cli.main import main; main()"
PORT = 6379
"""The head's port: the namespace is fresh, so the default is free."""

START_TIMEOUT = 180.0
"""Seconds ``ray start`` may take on a loaded machine (a hang guard, not a latency claim)."""


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


@dataclass
class Cluster:
    """The holder of the namespace (``netns-holder``, a ``sleep``) and the nodes started in
    it."""

    holder: subprocess.Popen[bytes]
    temp_dir: str
    netns: str
    added: int = 0
    """How many worker nodes were started (each one's index names its session copies)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{PORT}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RAY_USAGE_STATS_ENABLED": "0",
            "HOME": self.temp_dir,  # Ray keeps state in ~/.ray (an auth token): not the user's
        }

    def _cmd(self, args: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-n", "--", *args]

    def node_sessions(self, node: int) -> Path:
        """Where node ``node`` (0: the head) keeps its hosts' copies of session directories
        (``$EXARCH_NODE_SESSIONS``): a directory of its own per node, none of them the
        driver's, so the driver's session directory is complete only if the hosts ship it."""
        return Path(self.temp_dir) / f"node{node}-sessions"

    def run(
        self,
        args: list[str],
        *,
        timeout: float = START_TIMEOUT,
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``args`` inside the namespace."""
        return subprocess.run(
            self._cmd(args), capture_output=True, text=True, timeout=timeout, cwd=cwd,
            env={**self._env(), **(env or {})},
        )  # fmt: skip

    def start_exarch(self, *args: str) -> subprocess.Popen[str]:
        """``exarch-actors ARGS`` inside the namespace, running (the caller waits for it)."""
        return subprocess.Popen(
            self._cmd([sys.executable, "-c", _MAIN, *args]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env=self._env(),
        )  # fmt: skip

    @contextlib.contextmanager
    def ray_run(
        self, scenario: Path, session: Path, *extra: str
    ) -> Iterator[subprocess.Popen[str]]:
        """``exarch-actors run SCENARIO --backend ray`` on this cluster into ``session``,
        running while the block runs; killed and reaped after it if it has not ended."""
        run = self.start_exarch(
            "run", str(scenario), "--backend", "ray", "--ray-address", self.address,
            "--session-dir", str(session), *extra,
        )  # fmt: skip
        try:
            yield run
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()

    def exarch(
        self, *args: str, timeout: float = START_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            [sys.executable, "-c", _MAIN, *args],
            timeout=timeout,
        )

    def add_node(self, index: int | None = None) -> None:
        """Start another worker node (``index``, by default the next one, names its session
        copies' directory)."""
        self.added += 1
        index = self.added if index is None else index
        node = self.run(
            [
                _ray_bin(),
                "start",
                f"--address={self.address}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
            ],
            env={"EXARCH_NODE_SESSIONS": str(self.node_sessions(index))},
        )
        assert node.returncode == 0, node.stdout + node.stderr

    def nodes(self) -> list[str]:
        """The ids of the cluster's alive nodes (asked from inside the namespace)."""
        script = (
            f"import ray, json; ray.init(address='{self.address}', logging_level='ERROR');"
            "print('NODES ' + json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))"
        )
        p = self.run([sys.executable, "-c", script])
        assert p.returncode == 0, p.stderr
        # Ray may print its own lines to stdout too ("(raylet) A worker died ..."): ours is marked
        line = next(x for x in reversed(p.stdout.splitlines()) if x.startswith("NODES "))
        ids: list[str] = json.loads(line.removeprefix("NODES "))
        return ids

    def head(self) -> str:
        """The id of the head node (the one with Ray's ``node:__internal_head__`` resource)."""
        script = (
            f"import ray; ray.init(address='{self.address}', logging_level='ERROR');"
            "print('HEAD ' + ' '.join(n['NodeID'] for n in ray.nodes() if n['Alive'] and "
            "any(k.startswith('node:__internal_head__') for k in n['Resources'])))"
        )
        p = self.run([sys.executable, "-c", script])
        assert p.returncode == 0, p.stderr
        line = next(x for x in reversed(p.stdout.splitlines()) if x.startswith("HEAD "))
        (head,) = line.removeprefix("HEAD ").split()
        return head

    def raylets(self) -> int:
        """How many nodes have a raylet running: a node whose raylet was killed is lost."""
        count = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                if proc.name() == "raylet" and proc.status() != psutil.STATUS_ZOMBIE:
                    count += 1
        return count

    def restore_two_nodes(self) -> None:
        """Add a node back if a test lost one, and wait until Ray counts exactly two alive
        nodes (a lost node stays "alive" in Ray's table until its heartbeats time out)."""
        if self.raylets() >= 2:
            return
        self.add_node()
        wait_for(lambda: len(self.nodes()) == 2, START_TIMEOUT, "two alive nodes again")

    def processes(self) -> list[psutil.Process]:
        """Every process in the namespace but its holder."""
        found = []
        for proc in psutil.process_iter():
            if proc.pid != self.holder.pid and _netns(proc.pid) == self.netns:
                found.append(proc)
        return found

    def ours(self) -> list[str]:
        """Every process of this project on any node: agent hosts, shells, workers, the fork
        servers and their resource trackers, and the launchers (``ray::NodeLauncher``)."""
        marks = ("forkserver", "resource_tracker", "NodeLauncher")
        left = []
        for proc in self.processes():
            try:
                line = " ".join(proc.cmdline())
                if any(m in line for m in marks) and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.pid} {line[:80]}")
            except psutil.Error:
                continue
        return left

    def agent_processes(self) -> list[str]:
        """Processes an agent host leaves on a node if it leaks: its fork server, shell host
        and workers (forked from the fork server, they keep its command line)."""
        left = []
        for proc in self.processes():
            try:
                line = " ".join(proc.cmdline())
                if "forkserver" in line and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.pid} {line[:80]}")
            except psutil.Error:
                continue
        return left


def _skip_reason() -> str | None:
    """Why this suite cannot run here, or None. Ray counts as installed only if ``import ray``
    finds a module with a file and the ``ray`` command is beside this interpreter: a folder
    named ``ray`` without ``__init__.py`` anywhere on ``sys.path`` imports as an empty
    namespace package (this folder was once named ``tests/ray`` and did exactly that, so the
    suite errored at ``ray start`` instead of skipping)."""
    try:
        import ray
    except ImportError:
        return "ray is not installed (pip install -e '.[ray]')"
    if getattr(ray, "__file__", None) is None:
        where = ", ".join(getattr(ray, "__path__", []))
        return f"ray is not installed (pip install -e '.[ray]'); 'import ray' found only {where}"
    if not Path(_ray_bin()).exists():
        return f"the ray command is not beside {sys.executable} (pip install -e '.[ray]')"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not available"
    if os.geteuid() != 0:
        return "unshare -n needs root (CAP_SYS_ADMIN) here"
    return None


@contextlib.contextmanager
def _two_node_cluster() -> Iterator[Cluster]:
    """Start the namespace, the head and one worker node; on exit kill and reap every process
    in the namespace, then the holder."""
    temp_dir = tempfile.mkdtemp(prefix="exr-")  # short: Ray's socket paths must fit 107 bytes
    # The holder is this process's child for the whole session, so it must not be named
    # `sleep`: tests elsewhere find the `sleep` program a ral call started among this process's
    # children (tests/shell/test_workers.py), and took the holder for it. A link's name is the
    # process's name.
    sleeper = Path(temp_dir) / "netns-holder"
    sleeper.symlink_to(shutil.which("sleep") or "/bin/sleep")
    holder = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {sleeper} 100000"]
    )
    cluster: Cluster | None = None
    try:
        netns = wait_for(
            lambda: (
                holder.poll() is not None
                or (_netns(holder.pid) != _netns(os.getpid()) and _netns(holder.pid))
            ),
            what="the namespace",
        )
        if holder.poll() is not None:
            pytest.skip(f"unshare -n failed here (exit {holder.returncode})")
        assert isinstance(netns, str)
        cluster = Cluster(holder, temp_dir, netns)
        wait_for(
            lambda: "lo:" in cluster.run(["ip", "-o", "link", "show", "up"]).stdout,
            what="loopback up in the namespace",
        )
        ray = _ray_bin()
        head = cluster.run(
            [
                ray,
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={PORT}",
                "--num-cpus=1",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir}",
            ],
            env={"EXARCH_NODE_SESSIONS": str(cluster.node_sessions(0))},
        )
        assert head.returncode == 0, head.stdout + head.stderr
        cluster.add_node()
        yield cluster
    finally:
        if cluster is not None:
            # Not `ray stop`: it stops every Ray process on the machine by name, the clusters
            # of other test runs in other namespaces included. Only this namespace's go.
            for proc in cluster.processes():
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            wait_for(lambda: not cluster.processes(), 30.0, "the cluster's processes gone")
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Cluster]:
    """The session's one cluster, started by the first test that needs it and stopped at the
    end of the session (every process in its namespace killed and reaped)."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with _two_node_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster(ray_cluster: Cluster) -> Iterator[Cluster]:
    """The session's cluster with two alive nodes for one test; after it, nothing of this
    project (launchers, fork servers, hosts, shells, workers) is left on any node."""
    ray_cluster.restore_two_nodes()
    yield ray_cluster
    wait_for(
        lambda: ray_cluster.ours() == [], START_TIMEOUT, "nothing of the test left on any node"
    )
