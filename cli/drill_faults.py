"""The drill's faults as delivered: :class:`LiveNemesis` applies each live fault kind to a running
fleet, :class:`Applied` records what it did, and :func:`measure_recovery` reads the round's
transcript for how fast the affected agent recovered.

Invariants:

- A live fault targets a live agent (the trunk only for ``shell-kill``); with none live it is
  not applied (``None``), never aimed at a dead one. A ``write-failure`` waits until its agent's
  shell has checkpointed once.
- A fault's randomness comes from its own ``param`` (``random.Random(f.param)``), so the seeded
  schedule alone fixes what every fault does.
- A fault that fails to apply (typed error, missing agent, OS error) is still recorded, with the
  error in its ``detail``: nothing the nemesis tried goes unreported.
- Recovery is measured from each fault's wall-clock time to the affected agent's next
  successful ral call (``Io`` without error in ``transcript.jsonl``).
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from runtime.constants import INBOX_SOURCE_CAP, TRUNK_NAME
from runtime.durable import read_jsonl
from runtime.errors import ExarchError, InboxFull
from runtime.inbox import Command
from runtime.nemesis import RECOVERING, Fault

FLOOD = 1000
WRITE_FAILURE_SECS = 0.15


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

    def to_json(self) -> dict[str, Any]:
        return {
            **self.fault.to_json(),
            "round": self.round,
            "agent": self.agent,
            "detail": self.detail,
            "recoverySecs": None if self.recovery is None else round(self.recovery, 4),
            "outcome": self.outcome,
        }


# --------------------------------------------------------------------------- reading a round


def _epoch(at: str) -> float:
    return _dt.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def ok_calls(root: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for r in read_jsonl(root / "transcript.jsonl").records:
        if r.get("kind") == "Io" and r.get("error") is None and r.get("at"):
            out[str(r.get("agent"))].append(_epoch(str(r["at"])))
    return out


def round_times(root: Path, agent: str) -> list[float]:
    """When each provider round-trip of ``agent`` ended: an assistant event or a ProviderError
    (every scripted round leaves exactly one), in order, so index n is scripted message n."""
    times: list[float] = []
    d = root / "agents" / agent
    for p in sorted(d.glob("events*.jsonl")) if d.is_dir() else []:
        times += [_epoch(r["at"]) for r in read_jsonl(p).records if r.get("kind") == "assistant"]
    times += [
        _epoch(r["at"])
        for r in read_jsonl(root / "transcript.jsonl").records
        if r.get("kind") == "ProviderError" and r.get("agent") == agent
    ]
    return sorted(times)


def measure_recovery(applied: list[Applied], root: Path) -> None:
    ok = ok_calls(root)
    for a in applied:
        if a.agent is None:
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


class LiveNemesis:
    """Applies live faults to one in-process fleet."""

    def __init__(self, fleet: Any, round_no: int) -> None:
        self.fleet = fleet
        self.round = round_no

    def _live(self, *, trunk: bool) -> list[str]:
        names = sorted(self.fleet.registry.names())
        return [n for n in names if trunk or n != TRUNK_NAME]

    def apply(self, f: Fault) -> Applied | None:
        rng = random.Random(f.param)
        live = self._live(trunk=f.kind == "shell-kill")
        if not live:
            return None
        name = live[f.target % len(live)]
        if f.kind == "write-failure" and not self.fleet.session.snapshot(name).exists():
            return None  # its shell has not checkpointed yet: hit it once it has
        a = Applied(f, self.round, name, time.time())
        try:
            getattr(self, "_" + f.kind.replace("-", "_"))(a, name, rng)
        except (ExarchError, KeyError, OSError, psutil.Error) as e:
            a.detail["error"] = f"{type(e).__name__}: {e}"
        return a

    def _shell_kill(self, a: Applied, name: str, _rng: random.Random) -> None:
        agent = self.fleet.agents[name]
        pid = agent.shell_pid()
        a.detail["pid"] = pid
        if pid:
            os.kill(pid, signal.SIGKILL)

    def _inbox_flood(self, a: Applied, name: str, _rng: random.Random) -> None:
        accepted = rejected = 0
        for j in range(FLOOD):
            try:
                self.fleet.registry.message("nemesis", name, f"flood {j}")
                accepted += 1
            except InboxFull:
                rejected += 1
        a.detail.update(sent=FLOOD, accepted=accepted, rejected=rejected, cap=INBOX_SOURCE_CAP)

    def _cancel_storm(self, a: Applied, name: str, rng: random.Random) -> None:
        live = self._live(trunk=False)
        picked = sorted({name, *rng.sample(live, min(len(live), rng.randint(0, 2)))})
        a.detail["cancelled"] = {
            n: self.fleet.registry.cancel(n, "drill cancel storm") for n in picked
        }

    def _clear_storm(self, a: Applied, name: str, rng: random.Random) -> None:
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

    def _write_failure(self, a: Applied, name: str, _rng: random.Random) -> None:
        """The agent's snapshot path becomes a directory for a moment: the atomic rename of a
        checkpoint onto it fails (as root, a read-only mode bit would not stop a write)."""
        path = self.fleet.session.snapshot(name)
        aside = path.with_name(".snapshot.msgpack.drill-aside")
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
        litter = [p.name for p in path.parent.glob(".snapshot.msgpack.*.tmp")]
        a.detail.update(window_secs=WRITE_FAILURE_SECS, tmp_litter=litter)
