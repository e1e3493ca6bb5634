"""A pids cgroup per agent: a process cap the kernel enforces, and a net no process escapes.

Every shell host and worker of an agent joins one leaf of the agent's pids cgroup before it
runs any ral (:func:`join`); whatever it starts stays in that leaf, however it detaches
(``setsid``, a double fork: cgroup membership is inherited and never left without a write to
``cgroup.procs`` that a confined program cannot make). So:

- **a fork bomb stops at the agent's cap** (``pids.max`` of the agent's group, ``--shell-procs``):
  one more ``fork``/``clone`` is ``EAGAIN`` ("Resource temporarily unavailable") in the program
  that made it; other agents and the machine keep their pids. The host reports the refusals
  of a call (``pids.events``, read through a descriptor opened before Landlock, which governs
  opens only) as a notice naming the limit.
- **nothing outlives its host**, not even when the host is SIGKILLed by someone else and takes
  no action (what ``actors/descendants.py`` cannot cover): the side that saw the host die kills
  what is left in its leaf (:func:`sweep`), the fleet's end sweeps the session's whole group,
  and ``resume`` / ``check`` find a dead run's members by the group's name
  (:func:`session_members`).

The layout and the reads are ``runtime/shell/pid_cgroup.py``'s.

Where no pids hierarchy is writable (an ordinary user without a delegated cgroup v2 subtree)
:func:`join` returns None and the run goes on without a cap (docs/security.md says so; the
agent's first turn shows which applies). Measured on the 2-core dev box (root, cgroup v1,
load ~2.3, 200 forked children): a join (two ``mkdir``, two writes, two opens) costs 1.05 ms
of a host's start (a process agent's spawn is ~45 ms); a sweep of an empty leaf 0.56 ms, paid
only after a host died, not at an agent's ordinary end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from exarch_actors.runtime.shell.confinement import Sandbox
from exarch_actors.runtime.shell.pid_cgroup import hierarchy, members, session_group

SWEEP_ROUNDS = 50
"""Kill-and-reread rounds of a sweep: a member forking while it is killed is caught by the next
read (a SIGKILLed process forks no more), so a few rounds empty any group; 50 bounds a group
whose members cannot be killed (another user's, never ours)."""


class Joined:
    """The leaf this process joined: where its refused forks are read.

    Kernels count a refusal in different places (6.x's v1 pids controller: the forking task's
    own group, the leaf; v2: the group whose limit was hit, the agent's), so both counters are
    read and the larger growth is the call's."""

    def __init__(self, leaf: Path, limit: int) -> None:
        self.leaf = leaf
        self.limit = limit
        self._events = [
            os.open(d / "pids.events", os.O_RDONLY | os.O_CLOEXEC) for d in (leaf, leaf.parent)
        ]
        self._seen = self._counts()

    def _counts(self) -> list[int]:
        return [_max_events(fd) for fd in self._events]

    def take_refusals(self) -> int:
        """Forks the agent's cap refused since the last call of this."""
        now = self._counts()
        new = max(a - b for a, b in zip(now, self._seen, strict=True))
        self._seen = now
        return max(new, 0)


def _max_events(fd: int) -> int:
    """The ``max`` line of a ``pids.events`` file (read through a descriptor opened before
    Landlock, which checks opens, not reads)."""
    try:
        text = os.pread(fd, 256, 0).decode()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "max":
            return int(value)
    return 0


def join(group: str, limit: int) -> Joined | None:
    """In a shell host or worker, before any ral runs: move this process into a leaf of
    ``group`` whose parent caps its processes at ``limit``. None where no pids cgroup is
    writable (or the kernel refused): the process runs without a cap."""
    base = hierarchy()
    if base is None:
        return None
    agent = base / group
    leaf = agent / str(os.getpid())
    try:
        agent.mkdir(parents=True, exist_ok=True)
        (agent / "pids.max").write_text(str(limit))
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        return Joined(leaf, limit)
    except OSError:
        return None


def join_for(sandbox: Sandbox | None) -> Joined | None:
    """:func:`join` the agent's group if its sandbox carries a cap (None otherwise)."""
    if sandbox is None or sandbox.processes is None or sandbox.group is None:
        return None
    return join(sandbox.group, sandbox.processes)


def refusal_line(refused: int, limit: int) -> str:
    """What a call's stderr gains when the agent's cap refused forks during it."""
    forks = "fork was" if refused == 1 else "forks were"
    return (
        f"\n[exarch] {refused} {forks} refused: this agent may run at most {limit} processes "
        "at once (--shell-procs)\n"
    )


def sweep(path: Path) -> list[int]:
    """SIGKILL every process in ``path`` and the groups below it, until none is left, then
    remove the (now empty) groups; returns the pids killed. Nothing happens for a path that is
    not there."""
    if not path.is_dir():
        return []
    killed: list[int] = []
    me = os.getpid()
    for _ in range(SWEEP_ROUNDS):
        left = [p for p in members(path) if p != me]
        if not left:
            break
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.001)  # a killed process leaves its group when it exits, not when signalled
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
    return killed


def sweep_leaf(sandbox: Sandbox | None, pid: int) -> list[int]:
    """After a host or worker ``pid`` of the agent whose sandbox this is died: kill what it
    left in its leaf (a host SIGKILLed by someone else ran no cleanup of its own)."""
    base = hierarchy()
    if base is None or sandbox is None or sandbox.group is None:
        return []
    return sweep(base / sandbox.group / str(pid))


def sweep_session(marker: str) -> list[int]:
    """At a run's end, or before ``resume`` rebuilds it: kill every process still in the
    session's groups and remove them."""
    base = hierarchy()
    if base is None:
        return []
    return sweep(base / session_group(marker))


__all__ = ["Joined", "join", "join_for", "refusal_line", "sweep", "sweep_leaf", "sweep_session"]
