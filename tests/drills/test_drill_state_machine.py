"""A Hypothesis state machine drives a small live fleet (real shells) with random operations and
faults, checking the live invariants after every step and every invariant at the end."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.drills.nemesis import synthetic_scenario
from exarch_actors.runtime.errors import ExarchError, InboxFull
from exarch_actors.runtime.fleet.inbox import Command
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import LiveRun, start_live
from tests.support.waiting import eventually

WORKERS = ("worker-0", "worker-1")


class FleetUnderFire(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        os.environ["EXARCH_FAULTS"] = "1"
        self.tmp = tempfile.TemporaryDirectory(prefix="drill-sm-")
        toml = synthetic_scenario(len(WORKERS), 12, call_ms=40)
        self.live: LiveRun = start_live(Path(self.tmp.name), toml)
        self.fleet = self.live.fleet
        assert eventually(
            lambda: (
                all(self.fleet.registry.is_live(w) for w in WORKERS) or self.fleet.wait_empty(0)
            ),
            10,
        )

    def _alive(self, name: str) -> bool:
        return self.fleet is not None and self.fleet.registry.is_live(name)

    @rule(w=st.sampled_from(WORKERS))
    def kill_shell(self, w: str) -> None:
        agent = self.fleet.agents.get(w)
        if agent is None or not self._alive(w):
            return
        pid = agent.shell_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    @rule(w=st.sampled_from(WORKERS))
    def cancel(self, w: str) -> None:
        if self._alive(w):
            self.fleet.registry.cancel(w, "state machine")

    @rule(w=st.sampled_from(WORKERS))
    def clear(self, w: str) -> None:
        entry = self.fleet.registry.lookup(w)
        if entry is not None:
            try:
                entry.inbox.push(Command("/clear"))
            except InboxFull:
                pass

    @rule(w=st.sampled_from(WORKERS), n=st.integers(1, 200))
    def flood(self, w: str, n: int) -> None:
        accepted = rejected = 0
        for i in range(n):
            try:
                self.fleet.registry.message("machine", w, f"m{i}")
                accepted += 1
            except InboxFull:
                rejected += 1
            except ExarchError:
                return  # it ended meanwhile
        assert accepted + rejected == n

    @rule()
    def wait_a_little(self) -> None:
        self.fleet.wait_empty(0.05)

    @invariant()
    def committed_bindings_and_files_hold(self) -> None:
        root = self.live.session
        if not root.exists():
            return
        # a /clear between the shell reset and its marker is a few ms: re-read before blaming
        ok = eventually(lambda: check_session(SessionDir(root), live=True).ok)
        assert ok, json.dumps(check_session(SessionDir(root), live=True).to_json(), indent=1)

    def teardown(self) -> None:
        try:
            if self.fleet is not None:
                self.fleet.cancel_all("state machine done")
            self.live.finish(30)
            report = check_session(SessionDir(self.live.session))
            assert report.ok, json.dumps(report.to_json(), indent=1)
        finally:
            self.tmp.cleanup()


@pytest.mark.slow
def test_a_fleet_under_random_faults_keeps_every_invariant_after_every_step() -> None:
    FleetUnderFire.TestCase.settings = settings(
        max_examples=8,
        stateful_step_count=6,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    FleetUnderFire.TestCase().runTest()
