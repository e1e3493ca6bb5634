"""One drill round, run under fire: in this process, or killed in a child process and resumed.

A round is one fleet run in its own session directory. :func:`run_in_process` runs it on a
thread of the drill while the main thread feeds it the live faults as they fall due;
:func:`run_killed_and_resumed` runs it as ``exarch-actors run`` in a child process, SIGKILLs that
process after the k-th ral call, and finishes the round with :func:`actors.resume.resume_run`
(what ``exarch-actors resume`` runs) in this process. Live faults are fed to every phase: all
kinds to a fleet in this process, the kinds that land from outside (a psutil SIGKILL of a shell,
a snapshot write failure) to the child.

Invariants:

- Every round ends settled: its session directory gets ``result.json`` even when the drill is
  interrupted. :class:`DrillStop` (SIGINT, SIGTERM) cancels a fleet in this process (its
  ``result.json`` says ``cancelled``); a child process still running is SIGKILLed once its
  trunk is born and the round is resumed and cancelled at once, so nothing of it is left
  running and its journal is closed by the same code that closes any crashed run.
- :class:`LiveFeed` owns the pending live faults; each is applied at most once, and one that
  cannot land yet never blocks the others (:func:`runtime.drills.nemesis.live_order`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from exarch_actors.cli.drill_faults import Applied, LiveNemesis, ok_calls
from exarch_actors.runtime.drills.fault_switch import FAULTS_ENV
from exarch_actors.runtime.drills.nemesis import Fault, live_order
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir

POLL_SECS = 0.02
"""How often the drill looks at a running round (due faults, the kill threshold, a stop)."""

START_SECS = 60.0
"""The most a round's fleet or child process may take to start before the round is given up."""


# --------------------------------------------------------------------------- interruption


@dataclass
class DrillStop:
    """The drill was asked to stop (SIGINT, SIGTERM): settle the current round and report."""

    event: threading.Event = field(default_factory=threading.Event)
    signum: int | None = None

    def trip(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    @contextmanager
    def installed(self) -> Iterator[DrillStop]:
        """SIGINT and SIGTERM trip this instead of raising (main thread only). The handler only
        sets a flag: cancelling a fleet from inside a signal handler could wait on a lock the
        interrupted frame holds; the drill's polling loop does it within :data:`POLL_SECS`."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, _frame: FrameType | None) -> None:
            self.trip(signum)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


# --------------------------------------------------------------------------- live faults


class LiveFeed:
    """The drill's pending live faults, fed to whatever round is running."""

    def __init__(self, pending: list[Fault], start: float, applied: list[Applied]) -> None:
        self.pending = pending
        self.start = start
        self.applied = applied

    def landed(self) -> Counter[str]:
        return Counter(a.fault.kind for a in self.applied if a.landed)

    def feed(self, nemesis: LiveNemesis) -> None:
        """Apply every due live fault that can land now (see ``live_order``)."""
        now = time.monotonic() - self.start
        due = live_order(self.pending, now, self.landed(), in_process=nemesis.fleet is not None)
        for f in due:
            got = nemesis.apply(f)
            if got is not None:
                self.applied.append(got)
                self.pending.remove(f)


# --------------------------------------------------------------------------- in this process


def _drive(
    run: Callable[[Callable[[Any], None]], Any],
    session: SessionDir,
    rnd: int,
    feed: LiveFeed,
    stop: DrillStop,
    name: str,
) -> dict[str, Any]:
    """Run ``run(on_start)`` on a thread; feed its fleet live faults until it ends, or cancel
    it once ``stop`` trips. Returns ``result`` (what ``run`` returned) or ``error``."""
    holder: dict[str, Any] = {}
    ready = threading.Event()

    def on_start(fleet: Any) -> None:
        holder["fleet"] = fleet
        ready.set()

    def target() -> None:
        try:
            holder["result"] = run(on_start)
        except BaseException as e:  # reported as a finding, never swallowed
            holder["error"] = f"{type(e).__name__}: {e}"
        finally:
            ready.set()

    th = threading.Thread(target=target, name=f"drill-{name}-{rnd}")
    th.start()
    ready.wait(START_SECS)
    fleet = holder.get("fleet")
    nem = LiveNemesis(session, rnd, fleet) if fleet is not None else None
    cancelled = False
    while th.is_alive():
        if stop.is_set():
            if fleet is not None and not cancelled:
                fleet.cancel_all("drill interrupted")
                cancelled = True
        elif nem is not None:
            feed.feed(nem)
        th.join(POLL_SECS)
    holder["cancelled"] = cancelled
    return holder


def run_in_process(
    scenario: Path,
    session: SessionDir,
    rnd: int,
    feed: LiveFeed,
    stop: DrillStop,
    durability: Durability = DEFAULT_DURABILITY,
    *,
    agents: Literal["thread", "process"] = "thread",
    hosts: Any = None,
) -> dict[str, Any]:
    """One round in this process; ``agents`` is the fleet's backend (``process`` when the
    drill asks for ``agent-kill``); ``hosts`` the drill's Ray backend (``--backend ray``:
    every agent a Ray actor), kept across rounds."""
    from exarch_actors.cli.runner import RunSpec, run_headless
    from exarch_actors.runtime.providers.scenario import load_scenario

    spec = RunSpec(
        "scripted",
        None,
        load_scenario(scenario),
        session_dir=str(session.root),
        durability=durability,
        agents="process" if hosts is not None else agents,
    )
    got = _drive(
        lambda on_start: run_headless(spec, on_start=on_start, hosts=hosts),
        session,
        rnd,
        feed,
        stop,
        "round",
    )
    res = got.get("result")
    return {
        "mode": "in-process",
        "outcome": res.outcome if res is not None else None,
        "error": got.get("error"),
    }


# --------------------------------------------------------------------------- killed and resumed


def exarch(*args: str) -> list[str]:
    """The ``exarch-actors`` command line for a child process of this interpreter."""
    return [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *args]


def child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    pp = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        FAULTS_ENV: "1",  # that child's own switch (runtime/drills/fault_switch.py)
        "PYTHONPATH": root + (os.pathsep + pp if pp else ""),
    }


def _count(session: SessionDir, kind: str) -> int:
    return sum(1 for r in read_jsonl(session.transcript).records if r.get("kind") == kind)


def _trunk_born(session: SessionDir, proc: subprocess.Popen[bytes]) -> bool:
    """Wait until the child's trunk is on the bus (so a kill leaves a run that resume can
    rebuild) or the child has ended; whether it was born."""
    deadline = time.monotonic() + START_SECS
    while proc.poll() is None and time.monotonic() < deadline:
        if _count(session, "Born") >= 1:
            return True
        time.sleep(POLL_SECS)
    return _count(session, "Born") >= 1


def run_killed_and_resumed(
    scenario: Path,
    session: SessionDir,
    f: Fault,
    sure_calls: int,
    rnd: int,
    feed: LiveFeed,
    stop: DrillStop,
    durability: Durability = DEFAULT_DURABILITY,
) -> tuple[dict[str, Any], Applied]:
    """Run the round in a child process, SIGKILL it once ``f.param`` picks how far in (after
    the k-th ral call on the bus, k at most ``sure_calls``, the calls the round makes whatever
    happens, so the kill lands mid-run whatever the machine's speed), then resume it here.
    Returns the round's facts and the control-kill as applied (``landed`` false when the
    round ended before the kill)."""
    threshold = 1 + f.param % max(1, sure_calls)
    proc = subprocess.Popen(
        exarch(
            "run",
            str(scenario),
            "--session-dir",
            str(session.root),
            "--durability",
            durability,
            "--agents",  # as the drill's own rounds run theirs (a control-kill is not agent-kill)
            "thread",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        start_new_session=True,  # a terminal's Ctrl-C reaches the drill, which settles the round
    )
    outside = LiveNemesis(session, rnd)
    deadline = time.monotonic() + START_SECS
    while proc.poll() is None and time.monotonic() < deadline and not stop.is_set():
        if _count(session, "Io") >= threshold:
            break
        feed.feed(outside)
        time.sleep(POLL_SECS)
    if stop.is_set():
        _trunk_born(session, proc)
    killed = proc.poll() is None and not session.result.exists()
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    rc = proc.wait()
    a = Applied(
        f,
        rnd,
        None,
        time.time(),
        {"killAfterCalls": threshold, "runExit": rc, "callsBeforeKill": _count(session, "Io")},
    )
    if stop.is_set():
        a.detail["interrupted"] = True
    info: dict[str, Any] = {"mode": "killed+resumed" if killed else "subprocess", "runExit": rc}
    if killed:
        from exarch_actors.actors.resume import resume_run

        got = _drive(
            lambda on_start: resume_run(session, on_start=on_start),
            session,
            rnd,
            feed,
            stop,
            "resume",
        )
        res = got.get("result")
        info.update(outcome=res.outcome if res is not None else None, error=got.get("error"))
        a.detail["resumeOutcome"] = info["outcome"]
        if got.get("error"):
            a.detail["resumeError"] = got["error"]
        later = [t for ts in ok_calls(session).values() for t in ts if t > a.wall]
        if later:
            a.recovery = min(later) - a.wall
            a.outcome = "recovered (resume)"
        else:
            a.outcome = "resumed; no later successful call"
    else:
        a.landed = False
        a.outcome = "round ended before the kill"
    return info, a
