"""Fixtures for drills: in-process fleet runs with fault natives on, in a temporary directory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cli.runner import RunOutcome, RunSpec, run_headless
from runtime.providers.scenario import load_scenario


@pytest.fixture(autouse=True)
def faults_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("EXARCH_FAULTS", "1")
    yield


def run_scenario_text(tmp: Path, toml: str, name: str = "run") -> RunOutcome:
    """Run a scenario to its end in this process; the session is ``tmp/name``."""
    path = tmp / f"{name}.toml"
    path.write_text(toml)
    spec = RunSpec("scripted", None, load_scenario(path), session_dir=str(tmp / name))
    return run_headless(spec)


@dataclass
class LiveRun:
    """A fleet running on a background thread; ``fleet`` once it has started."""

    session: Path
    thread: threading.Thread
    fleet: Any = None
    result: RunOutcome | None = None
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def finish(self, timeout: float = 30.0) -> RunOutcome:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not end"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def start_live(tmp: Path, toml: str, name: str = "live") -> LiveRun:
    path = tmp / f"{name}.toml"
    path.write_text(toml)
    spec = RunSpec("scripted", None, load_scenario(path), session_dir=str(tmp / name))
    live = LiveRun(tmp / name, threading.Thread(target=lambda: None))

    def on_start(fleet: Any) -> None:
        live.fleet = fleet
        live.started.set()

    def target() -> None:
        try:
            live.result = run_headless(spec, on_start=on_start)
        except BaseException as e:
            live.error = e
        finally:
            live.started.set()

    live.thread = threading.Thread(target=target, name=f"live-{name}")
    live.thread.start()
    assert live.started.wait(30)
    return live
