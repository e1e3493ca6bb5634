"""Fixtures for the settlement suite: real local executors that are always reaped."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from runtime.executor import ExecutionSpec, LocalProcessExecutor
from runtime.journal import SpawnJournal

SLEEP = ("sleep", "60")
IGNORE_TERM = (
    sys.executable,
    "-c",
    "import signal, time, pathlib\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path('ready').write_text('1')\n"
    "time.sleep(60)\n",
)


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def kill_hard(pid: int | None) -> None:
    """What a sweeper does with a teardown-unconfirmed pid (and the test's own reaping)."""
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


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
