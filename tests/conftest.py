"""Suite-wide fixtures: every test must reap every process and thread it starts."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("EXARCH_TEST", "1")
# A user's own config file (~/.config/exarch-actors/config.toml) must not change what the
# suite's commands do: every command the suite starts reads an empty config home instead (a
# test of config files sets its own).
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="exarch-tests-config-")


def _cache_bytecode() -> None:
    """Let every interpreter the suite starts keep its bytecode, outside the tree.

    The suite starts hundreds of interpreters (each ``exarch-actors`` command, its fork server,
    the Ray nodes' workers). Under ``PYTHONDONTWRITEBYTECODE=1`` (set in this box's
    environment) each one compiled this project's modules from source again. Measured, cached
    against not, interleaved in one run: tests/cli/test_run_output.py, test_examples.py and
    tests/agent/test_reply.py took 21.3 s and 18.5 s against 36.0 s and 47.7 s (load 8-21).
    Compiled once into a cache directory of this user's (``PYTHONPYCACHEPREFIX``: nothing is
    written in the tree, which is what the variable keeps clean), read by every later
    interpreter; Python checks each cached file against its source's mtime and size, so an
    edit is never run stale."""
    if os.environ.get("PYTHONPYCACHEPREFIX") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    prefix = Path(tempfile.gettempdir()) / f"exarch-tests-pyc-{os.getuid()}"
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    # This process too: it read the variable at its start, so every test module (rewritten by
    # pytest's assertion rewriter, which caches only when bytecode may be written) and every
    # module of the project was compiled from source at each collection. Measured on a loaded
    # 2-core box, ``pytest --collect-only``: 6.8 s of CPU uncached, 2.1 s cached.
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(prefix)


_cache_bytecode()

# Hypothesis's deadline (200 ms an example) and its too-slow health check are wall-clock bounds:
# on a box at load 100-250 an example of tests/replay/test_recording_format.py took longer and
# failed the suite. Every property here holds or fails on its inputs, never on their speed.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


def _children() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


_FORK_SERVER_DEATHS: list[str] = []
"""Tests during which the session's fork server died (and a later start replaced it)."""


def _fork_server_pid() -> int | None:
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)  # private, 3.8-3.13
    return pid if isinstance(pid, int) else None


def _shared_helpers() -> set[int]:
    """The fork server and multiprocessing's resource tracker as they are now: they live for
    the whole session, and one started again inside a test (its predecessor died) is not that
    test's leak. Killing it as one made every later test that starts a process start another
    and "leak" it in turn: 103 teardown errors in one CI run."""
    from multiprocessing import resource_tracker

    pids = {_fork_server_pid()}
    pids.add(getattr(resource_tracker._resource_tracker, "_pid", None))
    return {p for p in pids if isinstance(p, int)}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, at least 2 and at most 4. The suite mostly waits on
    the processes it starts, so two workers halve it even on one or two cores (11 min 42 s
    against 6 min 21 s on 2 cores, back to back); past four, each worker's fork server,
    agents and shells only add memory and load on a bigger machine's shared disk."""
    return max(2, min(4, os.cpu_count() or 2))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n N --dist loadgroup`` (pyproject's addopts), the Ray tests go to one worker
    together: they share one two-node cluster per session, and a cluster in each worker would
    only double the box's load. Before xdist's own hook, which reads the group marks."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the tests during which the shared fork server died: not a leak, but a run that
    kills a process it did not start is a defect worth finding."""
    if _FORK_SERVER_DEATHS:
        terminalreporter.write_line(
            "the session's fork server died during: " + ", ".join(_FORK_SERVER_DEATHS)
        )


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a child process (or a non-daemon thread) behind.

    Processes get a short grace period to finish exiting: a reaped child can take a few
    milliseconds to disappear from the process table.
    """
    from exarch_actors.actors.process import ensure_fork_server

    ensure_fork_server()  # restarted outside the census if an earlier test's run killed it
    server = _fork_server_pid()
    before = _children()
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    if _fork_server_pid() != server:
        _FORK_SERVER_DEATHS.append(request.node.nodeid)
        # also a warning: under xdist the summary above is a worker's, never printed
        warnings.warn(
            f"the session's fork server died during this test (pid {server})", stacklevel=1
        )
    deadline = time.monotonic() + 3.0
    leaked = _children() - before - _shared_helpers()
    while leaked and time.monotonic() < deadline:
        time.sleep(0.02)
        leaked = {p for p in _children() - before - _shared_helpers() if _alive(p)}
    if leaked:
        for pid in leaked:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        pytest.fail(f"test leaked child processes: {sorted(leaked)}")
    deadline = time.monotonic() + 3.0
    stray = _stray_threads(threads_before)
    while stray and time.monotonic() < deadline:
        time.sleep(0.02)
        stray = _stray_threads(threads_before)
    if stray:
        pytest.fail(f"test leaked non-daemon threads: {[t.name for t in stray]}")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stray_threads(before: set[int | None]) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.ident not in before
        and t.is_alive()
        and not t.daemon
        and t is not threading.main_thread()
    ]


@pytest.fixture(scope="session", autouse=True)
def fork_server() -> Iterator[None]:
    """Start the shell fork server once, before any per-test leak check sees it."""
    from exarch_actors.actors.process import ensure_fork_server

    ensure_fork_server()
    yield
