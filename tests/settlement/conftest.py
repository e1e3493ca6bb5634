"""Fixtures for the settlement suite: real local executors that are always reaped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from settlement_support import IGNORE_TERM, SLEEP, kill_hard, pid_gone  # noqa: F401

from exarch_actors.runtime.settlement.executor import ExecutionSpec
from exarch_actors.runtime.settlement.local_executor import LocalProcessExecutor
from exarch_actors.runtime.state.journal import SpawnJournal


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    return tmp_path / "scratch"


@pytest.fixture
def journal(tmp_path: Path) -> SpawnJournal:
    return SpawnJournal(tmp_path / "spawn-journal.jsonl")


@pytest.fixture
def reap() -> Iterator[Callable[[LocalProcessExecutor], LocalProcessExecutor]]:
    """Register executors; every registered process is SIGKILLed and reaped at teardown."""
    made: list[LocalProcessExecutor] = []

    def register(ex: LocalProcessExecutor) -> LocalProcessExecutor:
        made.append(ex)
        return ex

    yield register
    for ex in made:
        popen = getattr(ex, "_popen", None)
        if popen is not None and popen.poll() is None:
            kill_hard(popen.pid)
            popen.wait()


@pytest.fixture
def spawn(
    scratch_root: Path, reap: Callable[[LocalProcessExecutor], LocalProcessExecutor]
) -> Callable[..., LocalProcessExecutor]:
    """Start a real process in a fresh LocalProcessExecutor (or a subclass) and register it."""

    def make(
        argv: tuple[str, ...] = SLEEP,
        cls: type[LocalProcessExecutor] = LocalProcessExecutor,
        node_id: str = "n",
        **kw: object,
    ) -> LocalProcessExecutor:
        ex = reap(cls(scratch_root, **kw))  # type: ignore[arg-type]
        ex.execute(ExecutionSpec(node_id, argv=argv))
        return ex

    return make
