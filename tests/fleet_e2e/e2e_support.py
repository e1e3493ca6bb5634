"""Helpers for the fleet end to end: a real :class:`actors.fleet.Fleet` in-process, driven by
a scripted scenario, with real shell host processes, real workers and real external programs.

``fleet_of(toml, ...)`` builds the fleet and guarantees ``close()`` at teardown (which cancels
whatever still runs, so a failing test still reaps every process it started). ``Recorder``
subscribes to the bus and stamps each event with ``time.perf_counter()`` on arrival.

There is deliberately no ``conftest.py`` here: tests elsewhere do ``from conftest import``, and a
conftest loaded after theirs (several paths on one pytest command line) would shadow it. Each
test module declares ``fleet_of = pytest.fixture(name="fleet_of")(fleet_factory)`` instead.
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from exarch_actors.actors.bus import Subscription
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.events import Event
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir


class FakeClock:
    """A settable monotonic clock for the registry's idle leases (thread-safe)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def set(self, now: float) -> None:
        with self._lock:
            assert now >= self._now, "a monotonic clock never goes back"
            self._now = now


class Recorder:
    """A bus subscriber on its own daemon thread: every event with its arrival time."""

    def __init__(self, fleet: Fleet) -> None:
        self._sub: Subscription = fleet.bus.subscribe(capacity=100_000, name="e2e")
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.events: list[tuple[float, Event]] = []
        self._thread = threading.Thread(target=self._pump, name="e2e-recorder", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for event in self._sub:
            with self._cond:
                self.events.append((time.perf_counter(), event))
                self._cond.notify_all()

    def of(self, kind: str, agent: str | None = None) -> list[tuple[float, Any]]:
        with self._lock:
            return [
                (t, e)
                for t, e in self.events
                if e.kind == kind and (agent is None or e.agent == agent)
            ]

    def wait_for(
        self,
        kind: str,
        agent: str | None = None,
        timeout: float = 10.0,
        where: Callable[[Any], bool] = lambda _: True,
    ) -> Any:
        """The first ``kind`` event (of ``agent``, satisfying ``where``), waiting for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for _, e in self.events:
                    if e.kind == kind and (agent is None or e.agent == agent) and where(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind} event for {agent} within {timeout} s")
                self._cond.wait(left)

    def close(self) -> None:
        self._sub.close()
        self._thread.join(timeout=5)


@dataclass
class FleetRun:
    """One in-process fleet and what a test reads from it."""

    fleet: Fleet
    playback: ScenarioPlayback
    prompt: str | None
    session: Path
    recorder: Recorder
    _closed: bool = field(default=False, repr=False)

    def transcript(self) -> list[dict[str, Any]]:
        return read_jsonl(self.session / "transcript.jsonl").records

    def journal(self) -> list[dict[str, Any]]:
        return read_jsonl(self.session / "spawn-journal.jsonl").records

    def events(self, agent: str) -> list[dict[str, Any]]:
        return read_jsonl(self.session / "agents" / agent / "events.jsonl").records

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.fleet.close()
            self.recorder.close()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie awaiting its reaper does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants() -> set[int]:
    """Every live process below this one (fork server, hosts, workers, their programs)."""
    try:
        return {p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)}
    except psutil.Error:
        return set()


def fleet_factory(tmp_path: Path) -> Iterator[Callable[..., FleetRun]]:
    """The ``fleet_of`` fixture's body: ``fleet_of(toml, config)`` builds a fleet, closed at
    teardown (which cancels whatever still runs, so a failing test still reaps its processes)."""
    runs: list[FleetRun] = []

    def build(toml: str, config: FleetConfig | None = None) -> FleetRun:
        scenario = parse_scenario(textwrap.dedent(toml), source="e2e.toml")
        playback = ScenarioPlayback(scenario)
        session = tmp_path / f"session-{len(runs)}"
        fleet = Fleet(
            SessionDir.at(session),
            lambda name: make_provider("scripted", scenario=playback, agent_name=name),
            config,
        )
        run = FleetRun(fleet, playback, scenario.prompt, session, Recorder(fleet))
        runs.append(run)
        return run

    yield build
    for run in runs:
        run.close()


def finish(run: FleetRun) -> None:
    """Close a fleet run here and write its ``result.json``, as ``run`` does at its end."""
    run.close()
    run.fleet.write_result("quiesced", None)


def assert_check_holds(session: Path) -> None:
    """``check`` finds no invariant violated in ``session``."""
    report = check_session(SessionDir(session))
    bad = {r.name: r.details for r in report.results if r.status == "violated"}
    assert not bad, bad
