"""The processes a run named, and which of them still run.

A session names every process it started: the environment records of the spawn journal
(``execution-admitted``: a child's shell) and each agent's ``Commit`` records (the shell that
ran each clean call, ``SessionDir.commits``). Each carries the pid *and* its create time, so a
pid the kernel reused for some other process is never blamed (or killed). ``resume`` kills
what is left before it rebuilds; the invariant checker reports it.

A program a shell started is named nowhere, and one that detached (``setsid``, a double fork)
outlives the shell's kill unless the shell reaped it (``actors/descendants.py``). Every program
inherits ``EXARCH_SESSION`` from its shell (``runtime/constants.py``), so
:func:`marked_processes` finds those on this machine by their environment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil

from exarch_actors.runtime.constants import SESSION_ENV
from exarch_actors.runtime.shell.pid_cgroup import session_members
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import RECORD_SHAPE

PID_START_TOLERANCE = 1.0
"""Seconds between a recorded and a live create time that still count as the same process
(``pidStartedAt`` is rounded to 10 ms; psutil reports boot-relative clock ticks)."""


@dataclass(frozen=True)
class RunProcess:
    """A process the run named: who, its pid, and its recorded create time (None: unknown)."""

    owner: str
    pid: int
    started_at: float | None


def run_processes(session: SessionDir) -> list[RunProcess]:
    """Every process a session names (journal environments, Commit records), deduplicated.
    Lines that do not read are skipped here: reporting them is the checker's ``files-parse``."""
    out: dict[tuple[int, float | None], RunProcess] = {}
    for r in read_jsonl(session.journal).records:
        if r.get("kind") == "execution-admitted" and isinstance(r.get("pid"), int):
            st = r.get("pidStartedAt")
            key = (r["pid"], st if isinstance(st, int | float) else None)
            out.setdefault(key, RunProcess(f"{r.get('id')} (journal)", key[0], key[1]))
    commits = (r for p in session.record_files() for r in read_jsonl(p, RECORD_SHAPE).records)
    for r in commits:
        if r.get("kind") == "Commit" and isinstance(r.get("pid"), int):
            st = r.get("pidStartedAt")
            key = (r["pid"], st if isinstance(st, int | float) else None)
            out.setdefault(key, RunProcess(f"{r.get('agent')} (shell)", key[0], key[1]))
    return list(out.values())


def still_running(proc: RunProcess) -> bool:
    """Whether ``proc`` is still on the machine (a zombie is not; a reused pid is not)."""
    try:
        p = psutil.Process(proc.pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if proc.started_at is None:
            return False  # unverifiable: never blame a pid whose start time was not recorded
        return abs(p.create_time() - proc.started_at) <= PID_START_TOLERANCE
    except psutil.Error:
        return False


def marked_processes(session: SessionDir) -> list[RunProcess]:
    """Processes on this machine (not this one) whose environment says they belong to
    ``session`` (``EXARCH_SESSION``, which every program a shell of the run started inherits),
    zombies aside. Only environments this user may read are looked at."""
    marker = str(session.root.resolve())
    me = os.getpid()
    out: list[RunProcess] = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(SESSION_ENV) != marker or p.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(RunProcess(f"{p.name()} (marked)", p.pid, p.create_time()))
        except psutil.Error:
            continue
    return out


def grouped_processes(session: SessionDir) -> list[RunProcess]:
    """Processes still in the session's pids cgroup (``runtime/shell/pid_cgroup.py``): every
    host, worker and program of the run joined it, and none can leave it, whatever it did to
    its environment. Empty where no pids cgroup is writable."""
    out: list[RunProcess] = []
    for pid in session_members(str(session.root.resolve())):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                owner = f"{p.name()} (in the session's cgroup)"
                out.append(RunProcess(owner, pid, p.create_time()))
        except psutil.Error:
            continue
    return out


def leftover_processes(session: SessionDir) -> list[RunProcess]:
    """The processes ``session`` named, or that its environment or its cgroup marks, that
    still run."""
    named = [p for p in run_processes(session) if still_running(p)]
    seen = {p.pid for p in named}
    for p in marked_processes(session) + grouped_processes(session):
        if p.pid not in seen:
            seen.add(p.pid)
            named.append(p)
    return named


class ProcessTable(Protocol):
    """Where a run's processes are looked for: this machine (:class:`LocalProcesses`), or every
    node of a Ray cluster (``actors/ray_backend.py``: each node's launcher looks on its own)."""

    @property
    def where(self) -> str:
        """What was looked at, for the report (``"this machine"``, ``"2 Ray node(s)"``)."""
        ...

    def running(self, procs: Sequence[RunProcess]) -> list[RunProcess]:
        """Those of ``procs`` that still run there."""
        ...

    def left_on_nodes(self, session_root: str, remove: bool) -> list[str]:
        """Copies of the session directory a run left on other machines (its Ray nodes),
        removed unless ``remove`` is false: one line each."""
        ...


class LocalProcesses:
    """This machine's process table."""

    where = "this machine"

    def running(self, procs: Sequence[RunProcess]) -> list[RunProcess]:
        return [p for p in procs if still_running(p)]

    def left_on_nodes(self, session_root: str, remove: bool) -> list[str]:
        return []  # one machine: the session directory is the run's only copy
