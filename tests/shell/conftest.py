"""Fixtures for the process-separated shell: real host processes, real pipes, real files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.process import ensure_fork_server
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.state.session_dir import SessionDir


@pytest.fixture(scope="session", autouse=True)
def fork_server() -> None:
    """The fork server and resource tracker live for the whole session: start them before the
    per-test leak check takes its first census."""
    ensure_fork_server()


class Notices:
    """A notice sink that records what it was given."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def __call__(self, notice: Any) -> None:
        self.items.append(notice)

    def kinds(self) -> list[str]:
        return [n.notice for n in self.items]


@pytest.fixture
def notices() -> Notices:
    return Notices()


@pytest.fixture
def start_shell(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start ShellActors in ``tmp_path``; every one is stopped (and its processes reaped)."""
    refs: list[Any] = []

    def start(name: str = "trunk", **kwargs: Any) -> Any:
        kwargs.setdefault("session", SessionDir(tmp_path))
        kwargs.setdefault("faults", True)
        ref = ShellActor.start(name=name, **kwargs)
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        if ref.is_alive():
            ref.stop(block=True, timeout=20)
