"""The drill's faults as delivered: :class:`LiveNemesis` applies each live fault kind to a running
round, :class:`Applied` records what it did, and :func:`measure_recovery` reads the round's
transcript for how fast the affected agent recovered.

Invariants:

- A live fault targets a live agent (the trunk only for ``shell-kill``); with none live it is
  not applied (``None``: it stays pending), never aimed at a dead one. ``agent-kill`` aims
  only at children whose agent process runs and has not ended
  (:meth:`LiveNemesis._live_processes`). A ``write-failure`` waits until its agent's shell has
  checkpointed once.
- ``shell-kill`` is a real SIGKILL from outside the fleet: the pid comes from the session files
  alone (:func:`live_shells`: the journal's environment records, the ``Commit`` records) and
  is checked against its recorded create time before psutil kills it, so a reused pid is never
  hit and the kill lands mid-call. Together with ``write-failure`` (a path trick) it needs no
  handle on the fleet, so both land in a control-kill round's child process too.
- A fault's randomness comes from its own ``param`` (``random.Random(f.param)``), so the seeded
  schedule alone fixes what every fault does.
- A fault that fails to apply (typed error, missing agent, OS error) is still recorded, with the
  error in its ``detail`` and ``landed`` false: nothing the nemesis tried goes unreported, and
  nothing that did not happen is counted as applied.
- Recovery is measured from each fault's wall-clock time to the affected agent's next
  successful ral call (``Io`` without error in ``transcript.jsonl``).
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from exarch_actors.runtime.constants import INBOX_SOURCE_CAP, TRUNK_NAME
from exarch_actors.runtime.drills.nemesis import LANDS_OUTSIDE, RECOVERING, Fault
from exarch_actors.runtime.errors import ExarchError, InboxFull
from exarch_actors.runtime.fleet.inbox import AgentMessage, Command, source_of
from exarch_actors.runtime.fleet.spawn_tree import AgentEnded
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.run_processes import PID_START_TOLERANCE
from exarch_actors.runtime.state.session_dir import SessionDir

FLOOD = 1000
WRITE_FAILURE_SECS = 0.15
NODE_LOSS_SECS = 60.0
"""Seconds a ``node-loss`` waits for the lost agent's host to be seen gone (a hang guard)."""


@dataclass
class Applied:
    """One fault as delivered: when (wall clock), to whom, what it did."""

    fault: Fault
    round: int
    agent: str | None
    wall: float
    detail: dict[str, Any] = field(default_factory=dict)
    recovery: float | None = None
    outcome: str = "applied"
    landed: bool = True
    """Whether the fault took effect (a kill sent, a message played, a storm that reached an
    agent); an attempt that did not is recorded with ``landed`` false and never counted."""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.fault.to_json(),
            "round": self.round,
            "agent": self.agent,
            "landed": self.landed,
            "detail": self.detail,
            "recoverySecs": None if self.recovery is None else round(self.recovery, 4),
            "outcome": self.outcome,
        }


# --------------------------------------------------------------------------- reading a round


def _epoch(at: str) -> float:
    return _dt.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def ok_calls(session: SessionDir) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for r in read_jsonl(session.transcript).records:
        if r.get("kind") == "Io" and r.get("error") is None and r.get("at"):
            out[str(r.get("agent"))].append(_epoch(str(r["at"])))
    return out


def round_times(session: SessionDir, agent: str) -> list[float]:
    """When each provider round-trip of ``agent`` ended: an assistant event or a ProviderError
    (every scripted round leaves exactly one), in order, so index n is scripted message n."""
    times: list[float] = []
    for p in session.event_logs(agent):
        times += [_epoch(r["at"]) for r in read_jsonl(p).records if r.get("kind") == "assistant"]
    times += [
        _epoch(r["at"])
        for r in read_jsonl(session.transcript).records
        if r.get("kind") == "ProviderError" and r.get("agent") == agent
    ]
    return sorted(times)


def measure_recovery(applied: list[Applied], session: SessionDir) -> None:
    ok = ok_calls(session)
    for a in applied:
        if a.agent is None or not a.landed:
            continue
        after = [t for t in ok.get(a.agent, []) if t > a.wall]
        if after:
            a.recovery = min(after) - a.wall
            a.outcome = "recovered"
        elif a.fault.kind in RECOVERING:
            a.outcome = "no later successful call (agent ended)"
        else:
            a.outcome = "agent ended (expected for this kind)"


# --------------------------------------------------------------------------- live faults


def live_shells(session: SessionDir) -> dict[str, psutil.Process]:
    """Each agent's latest recorded shell host that still runs, read from the session files
    alone: the journal's environment records (a child's first shell) and the ``Commit`` records
    (the shell of each clean call; the host a rollback starts shows up at its next commit).
    A pid whose create time differs from the recorded one is a reused pid and is left out."""
    latest: dict[str, tuple[str, int, Any]] = {}
    recs = [
        (str(r.get("id")), r)
        for r in read_jsonl(session.journal).records
        if r.get("kind") == "execution-admitted"
    ]
    recs += [
        (str(r.get("agent")), r)
        for p in session.record_files()
        for r in read_jsonl(p).records
        if r.get("kind") == "Commit"
    ]
    for agent, r in recs:
        at, pid = str(r.get("at", "")), r.get("pid")
        if isinstance(pid, int) and at >= latest.get(agent, ("", 0, None))[0]:
            latest[agent] = (at, pid, r.get("pidStartedAt"))
    out: dict[str, psutil.Process] = {}
    for agent, (_, pid, started) in latest.items():
        if not isinstance(started, int | float):
            continue  # unverifiable: never kill a pid whose start time was not recorded
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if abs(proc.create_time() - started) <= PID_START_TOLERANCE:
                out[agent] = proc
        except psutil.Error:
            continue
    return out


class _NotYet(Exception):
    """The fault cannot land at this moment (its target just went away): keep it pending."""


class LiveNemesis:
    """Applies live faults to one round. ``fleet`` is the in-process fleet, or None for a
    control-kill round's child process, where only the kinds of
    :data:`runtime.drills.nemesis.LANDS_OUTSIDE` can land."""

    def __init__(self, session: SessionDir, round_no: int, fleet: Any = None) -> None:
        self.session = session
        self.fleet = fleet
        self.round = round_no
        self._shells: dict[str, psutil.Process] = {}
        self._killed: set[int] = set()
        """Shell pids this nemesis SIGKILLed: a dying process is not hit (and counted) twice."""
        self._cancelled: set[str] = set()
        """Agents a cancel storm reached: still registered while they wind down, not targets."""
        self.appliers: dict[str, Callable[[Applied, str, random.Random], bool]] = {
            "shell-kill": self._shell_kill,
            "agent-kill": self._agent_kill,
            "ray-worker-kill": self._ray_worker_kill,
            "node-loss": self._node_loss,
            "inbox-flood": self._inbox_flood,
            "cancel-storm": self._cancel_storm,
            "clear-storm": self._clear_storm,
            "write-failure": self._write_failure,
        }
        """How each live kind (:data:`runtime.drills.nemesis.LIVE`) is applied."""

    def _live(self, *, trunk: bool) -> list[str]:
        if self.fleet is None:
            names = sorted(self._live_shells())
        else:
            names = sorted(self.fleet.registry.names())
        return [n for n in names if (trunk or n != TRUNK_NAME) and n not in self._cancelled]

    def _live_processes(self) -> list[str]:
        """The live children that run in an agent process of their own, not yet ended: an
        agent still registered while it settles has no process to kill (every agent-kill of
        a drill once missed so, aimed at agents that had already ended)."""
        hosted = self.fleet.hosted
        return [
            n
            for n in self._live(trunk=False)
            if hasattr(hosted.get(n), "pids") and not hosted[n].done.is_set()
        ]

    def _live_shells(self) -> dict[str, psutil.Process]:
        shells = live_shells(self.session)
        return {n: p for n, p in shells.items() if p.pid not in self._killed}

    def _snapshot(self, name: str) -> Path:
        return self.session.snapshot(name)

    def apply(self, f: Fault) -> Applied | None:
        """Apply ``f`` now; None when it cannot land yet (nothing live to hit)."""
        if self.fleet is None and f.kind not in LANDS_OUTSIDE:
            return None
        rng = random.Random(f.param)
        if f.kind == "shell-kill":
            self._shells = self._live_shells()
            live = sorted(self._shells)
        elif f.kind == "agent-kill" and self.fleet.config.agents == "process":
            live = self._live_processes()
        else:
            live = self._live(trunk=False)
        if not live:
            return None
        name = live[f.target % len(live)]
        if f.kind == "write-failure" and not self._snapshot(name).exists():
            return None  # its shell has not checkpointed yet: hit it once it has
        a = Applied(f, self.round, name, time.time())
        try:
            a.landed = bool(self.appliers[f.kind](a, name, rng))
        except _NotYet:
            return None
        except (ExarchError, KeyError, OSError, psutil.Error) as e:
            a.detail["error"] = f"{type(e).__name__}: {e}"
            a.landed = False
        if not a.landed:
            a.outcome = "did not land"
        return a

    def _shell_kill(self, a: Applied, name: str, _rng: random.Random) -> bool:
        """A real SIGKILL from outside (psutil), mid-call if a call is running."""
        proc = self._shells[name]
        a.detail["pid"] = proc.pid
        try:
            proc.kill()  # psutil refuses a pid reused since it was looked up
        except psutil.NoSuchProcess:
            raise _NotYet from None  # it ended on its own meanwhile (a rollback, a close)
        self._killed.add(proc.pid)
        return True

    def _agent_kill(self, a: Applied, name: str, _rng: random.Random) -> bool:
        """A real SIGKILL of the agent's own process (``--agents process``), mid-call if a
        call is running; the supervisor restarts it from its files or settles it down."""
        if self.fleet.config.agents != "process":
            a.detail["error"] = "the round's agents run as threads (agent-kill needs processes)"
            return False
        agent = self.fleet.hosted.get(name)
        if agent is None or agent.done.is_set():
            raise _NotYet  # it ended since it was picked: aim again at one still running
        pid = agent.pid
        a.detail.update(pid=pid, restartsBefore=agent.restarts)
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            raise _NotYet from None  # restarting or ended meanwhile
        return True

    def _ray_host(self, a: Applied, name: str) -> tuple[Any, Any] | None:
        """The agent's handle and the fleet's Ray backend, or None (recorded) without them."""
        backend = self.fleet.config.backend
        if not hasattr(backend, "remove_node"):
            a.detail["error"] = "the agents are not hosted on a Ray cluster (--backend ray)"
            return None
        agent = self.fleet.hosted.get(name)
        if agent is None:
            raise _NotYet  # registered, its host still starting
        return agent, backend

    def _ray_worker_kill(self, a: Applied, name: str, _rng: random.Random) -> bool:
        """SIGKILL of the agent's host process on its node (forked there by the node's launcher,
        a Ray worker), by a task placed there; the supervisor restarts it elsewhere or settles
        it down. One agent per fault: killing the launcher itself would restart every agent of
        its node on the others, and a later ``node-loss`` would find no agent off the head to
        take (tests/ray_backend kill a launcher directly)."""
        got = self._ray_host(a, name)
        if got is None:
            return False
        agent, backend = got
        pid, node = agent.pid, agent.node
        a.detail.update(pid=pid, node=node, restartsBefore=agent.restarts)
        if agent.done.is_set():
            raise _NotYet
        backend.kill_worker(node, pid)
        return True

    def _node_loss(self, a: Applied, name: str, _rng: random.Random) -> bool:
        """Remove the node the agent runs on, or, when that is the head (never removed), the
        node of another live agent: its raylet SIGKILLed there, every worker on it gone.
        Applied once that agent's host is seen gone (a restart began, or it ended); with every
        live agent on the head it waits."""
        got = self._ray_host(a, name)
        if got is None:
            return False
        agent, backend = got
        others = [n for n in self._live(trunk=False) if n != name]
        for candidate in [name, *others]:  # the drawn agent first, else one on another node
            host = self.fleet.hosted.get(candidate)
            if host is not None and not host.done.is_set() and backend.removable(host.node):
                agent = host
                break
        else:
            raise _NotYet  # every live agent is on the head: wait for one elsewhere
        a.agent = agent.name
        node, before = agent.node, len(agent.pids)
        a.detail.update(node=node, pid=agent.pid, restartsBefore=agent.restarts)
        backend.remove_node(node)
        deadline = time.monotonic() + NODE_LOSS_SECS
        while time.monotonic() < deadline and len(agent.pids) == before:
            if agent.done.is_set():
                break
            time.sleep(0.05)
        a.detail["hostGone"] = len(agent.pids) > before or agent.done.is_set()
        return True

    def _inbox_flood(self, a: Applied, name: str, _rng: random.Random) -> bool:
        """Up to :data:`FLOOD` messages; the flood stops early if the agent ends meanwhile
        (``sent`` says how many went, so the accounting still adds up).

        ``accepted`` may pass the cap when the agent takes messages off its inbox during the
        flood (a turn boundary frees their slots): what the quota rule bounds is the queue, so
        ``peakDepth`` -- the messages queued right after each accepted one and at the first
        refusal -- is what must stay within the cap."""
        accepted = rejected = sent = peak = 0
        hosted = self.fleet.hosted.get(name)
        source = source_of(AgentMessage("nemesis", ""))
        for j in range(FLOOD):
            try:
                self.fleet.registry.message("nemesis", name, f"flood {j}")
                accepted += 1
                if hosted is not None and source is not None:
                    peak = max(peak, hosted.inbox.depths().get(source, 0))
            except InboxFull:
                if not rejected and hosted is not None and source is not None:  # as it refused
                    peak = max(peak, hosted.inbox.depths().get(source, 0))
                rejected += 1
            except AgentEnded:
                a.detail["endedAfter"] = j
                break
            sent += 1
        a.detail.update(
            sent=sent, accepted=accepted, rejected=rejected, peakDepth=peak, cap=INBOX_SOURCE_CAP
        )
        return sent > 0

    def _cancel_storm(self, a: Applied, name: str, rng: random.Random) -> bool:
        live = self._live(trunk=False)
        picked = sorted({name, *rng.sample(live, min(len(live), rng.randint(0, 2)))})
        cancelled = {n: self.fleet.registry.cancel(n, "drill cancel storm") for n in picked}
        a.detail["cancelled"] = cancelled
        self._cancelled.update(n for ns in cancelled.values() for n in ns)
        return any(cancelled.values())

    def _clear_storm(self, a: Applied, name: str, rng: random.Random) -> bool:
        live = self._live(trunk=False)
        picked = sorted({name, *rng.sample(live, min(len(live), rng.randint(0, 1)))})
        sent = {}
        for n in picked:
            entry = self.fleet.registry.lookup(n)
            if entry is None:
                continue
            try:
                entry.inbox.push(Command("/clear"))
                sent[n] = "queued"
            except InboxFull as e:
                sent[n] = f"refused: {e}"
        a.detail["clear"] = sent
        return "queued" in sent.values()

    def _write_failure(self, a: Applied, name: str, _rng: random.Random) -> bool:
        """The agent's snapshot path becomes a directory for a moment: the atomic rename of a
        checkpoint onto it fails (as root, a read-only mode bit would not stop a write)."""
        path = self._snapshot(name)
        aside = path.with_name(f".{path.name}.drill-aside")
        had = path.exists()
        if had:
            os.replace(path, aside)
        os.mkdir(path)
        time.sleep(WRITE_FAILURE_SECS)
        os.rmdir(path)
        if had:
            if path.exists():  # a checkpoint landed after the window: it is newer
                aside.unlink()
            else:
                os.replace(aside, path)
        litter = [p.name for p in path.parent.glob(f".{path.name}.*.tmp")]
        a.detail.update(window_secs=WRITE_FAILURE_SECS, tmp_litter=litter)
        return True
