"""What ``run`` and ``fleet`` share: build a fleet from the command line, run a headless trunk to
its end, write ``result.json``, and map the outcome to the exit code of SCENARIO.md.

Exit codes: 0 when the trunk replied or quiesced normally, 1 on a failed or capped run, 2 on bad
input (an unreadable scenario, a bad flag), 130 when cancelled (Ctrl-C).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click

from runtime.durable import atomic_write_bytes
from runtime.errors import ScenarioError
from runtime.fleet_yield import FleetYield
from runtime.providers import make_provider
from runtime.providers.base import Provider
from runtime.providers.scenario import Scenario, load_scenario
from runtime.providers.scripted import ScenarioPlayback
from runtime.ral.values import render
from runtime.session_dir import SessionDir, SessionDirInUse

EXIT_CODES = {"replied": 0, "quiesced": 0, "failed": 1, "capped": 1, "cancelled": 130}


@dataclass(frozen=True)
class RunSpec:
    """One headless run, as the command line described it."""

    provider: str
    prompt: str | None
    scenario: Scenario | None = None
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    session_dir: str | None = None
    chat: bool = False
    disk_warn_bytes: int | None = None
    window_tokens: int | None = None
    provider_options: tuple[tuple[str, Any], ...] = ()
    """Extra network-provider settings (``read_timeout``, ``max_retries``, ...)."""


@dataclass(frozen=True)
class RunOutcome:
    outcome: str
    reply: str | None
    fleet_yield: FleetYield
    session: SessionDir

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.outcome, 1)


def read_scenario(path: str) -> Scenario:
    """Load a scenario or exit 2 with the file position of what is wrong."""
    try:
        return load_scenario(path)
    except ScenarioError as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        raise click.UsageError(f"cannot read scenario {path}: {e.strerror or e}") from None


def provider_factory(spec: RunSpec) -> Callable[[str], Provider]:
    if spec.provider == "scripted":
        if spec.scenario is None:
            raise click.UsageError("the scripted provider needs a scenario file")
        playback = ScenarioPlayback(spec.scenario)
        return lambda name: make_provider("scripted", scenario=playback, agent_name=name)
    options: dict[str, Any] = {}
    if spec.window_tokens is not None:
        options["window_tokens"] = spec.window_tokens
    options.update(spec.provider_options)
    try:
        base = make_provider(
            spec.provider,
            model=spec.model,
            base_url=spec.base_url,
            api_key=spec.api_key,
            **options,
        )
    except Exception as e:
        raise click.UsageError(str(e)) from None
    return lambda name: base.for_agent(name)


@contextmanager
def sigint_cancels(cancel: Callable[[], None]) -> Iterator[threading.Event]:
    """Ctrl-C cancels the run (the whole tree) instead of raising KeyboardInterrupt."""
    hit = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield hit
        return

    def handler(_sig: int, _frame: FrameType | None) -> None:
        hit.set()
        cancel()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, previous)


def run_headless(spec: RunSpec, *, on_start: Callable[[Any], None] | None = None) -> RunOutcome:
    """Run a headless trunk to its end and write ``result.json``."""
    from actors.fleet import Fleet, FleetConfig

    session = open_session(spec.session_dir)
    prompt = spec.prompt
    system = None
    if spec.scenario is not None:
        prompt = prompt or spec.scenario.prompt
        system = spec.scenario.system
    if not prompt:
        raise click.UsageError("nothing to do: give a PROMPT or a scenario with [fleet] prompt")
    write_run_spec(session, spec)
    fleet = Fleet(
        session,
        provider_factory(spec),
        FleetConfig(disk_warn_bytes=spec.disk_warn_bytes),
    )
    outcome = "failed"
    reply: str | None = None
    try:
        trunk = fleet.start_trunk(prompt, chat=spec.chat, system=system)
        if on_start is not None:
            on_start(fleet)
        with sigint_cancels(lambda: fleet.cancel_all("interrupted")) as interrupted:
            while not fleet.wait_empty(0.1):
                pass
        outcome = trunk.outcome.value if trunk.outcome is not None else "failed"
        if interrupted.is_set():
            outcome = "cancelled"
        if trunk.replied:
            value = trunk.reply_value
            reply = render(value)
    finally:
        fleet.close()
    fy = fleet.write_result(outcome, reply)
    return RunOutcome(outcome, reply, fy, session)


def open_session(session_dir: str | None) -> SessionDir:
    """The directory of a new run: ``--session-dir`` if given (exit 2 if it already holds a
    run), else a fresh one under ``.exarch/sessions/``."""
    if not session_dir:
        return SessionDir.new()
    try:
        return SessionDir.fresh_at(session_dir)
    except SessionDirInUse as e:
        raise click.UsageError(str(e)) from None


def write_run_spec(session: SessionDir, spec: RunSpec) -> None:
    """``run.json``: what ``resume`` needs to rebuild the run (never the API key)."""
    data = {
        "provider": spec.provider,
        "prompt": spec.prompt,
        "scenario": str(Path(spec.scenario.source).resolve())
        if spec.scenario is not None
        else None,
        "model": spec.model,
        "baseUrl": spec.base_url,
        "chat": spec.chat,
        "diskWarnBytes": spec.disk_warn_bytes,
        "windowTokens": spec.window_tokens,
        "cwd": str(Path.cwd()),
    }
    atomic_write_bytes(session.root / "run.json", json.dumps(data, indent=2).encode())


def session_path(session: SessionDir) -> str:
    try:
        return str(session.root.relative_to(Path.cwd()))
    except ValueError:
        return str(session.root)
