"""The Python API: what the ``run``, ``resume``, ``check``, ``replay``, ``trace`` and
``report`` commands do, as functions (docs/api.md).

One code path: :func:`start` builds its ``RunSpec`` with the ``run`` command's own
``cli.runner.spec_for`` and runs it with ``cli.runner.run_headless``; :func:`replay` is the
``replay`` command's ``replay_session``; :func:`resume` and :func:`check` call what those
commands call. What the command line refuses with exit 2 (a bad option, an unreadable scenario,
no API key) is raised here as :class:`RunRefused`, before anything is written.

Live events: a :class:`Run` subscribes to the fleet's bus before the trunk starts, with the
bus's bounded buffer (``actors/bus.py``: a consumer that falls behind is handed one
``Overflow`` record counting what it missed, never blocks the run), and adds a
:class:`Progress` record whenever an agent's turns, ral calls, tokens or cost change.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, Literal

import click

from exarch_actors.actors.bus import SUBSCRIBER_BUFFER, Subscription
from exarch_actors.cli.backend_options import DEFAULT_AGENTS
from exarch_actors.cli.provider_options import ProviderChoice
from exarch_actors.cli.replay import DEFAULT_DEADLINE, replay_session
from exarch_actors.cli.report import session_report
from exarch_actors.cli.run_report import live_agents
from exarch_actors.cli.runner import RunOutcome, RunSpec, run_headless, spec_for
from exarch_actors.runtime.drills.invariant_check import InvariantReport, NotASession, check_session
from exarch_actors.runtime.events import Event
from exarch_actors.runtime.observe.chrome_trace import chrome_trace
from exarch_actors.runtime.observe.otel import OtelMissing, otel_available
from exarch_actors.runtime.observe.spans import NotASessionDir, read_view
from exarch_actors.runtime.providers.prices import PriceTable
from exarch_actors.runtime.replay.divergence import Report
from exarch_actors.runtime.settlement.fleet_yield import FleetYield
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_read import ResumeRefused


class RunRefused(Exception):
    """A run, resume, check or replay refused before it began: the message is what the command
    line prints for its exit 2 (a bad option, an unreadable scenario, no API key, a directory
    that is not a session or cannot be resumed). Nothing was started."""


@dataclass(frozen=True)
class Progress(Event):
    """An agent's figures changed (sampled about every 0.1 s while a run goes on): model turns,
    ral calls, tokens so far, and its cost in dollars (``None`` while unknown: an unpriced
    model or a reply without usage)."""

    turns: int = 0
    ral_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal | None = None
    kind: ClassVar[str] = "Progress"


@dataclass(frozen=True)
class Result:
    """How a run ended: what ``result.json`` says, and the exit code ``run`` would exit with."""

    outcome: str
    """``replied``, ``quiesced``, ``failed``, ``capped``, ``budget`` or ``cancelled``."""
    reply: str | None
    """The trunk's reply (rendered as ral renders it; ``None`` if it never replied)."""
    fleet_yield: FleetYield
    """What the fleet did: children by outcome, tokens, spend (``docs/cost.md``)."""
    session: Path
    """The run's session directory (``check``, ``resume`` and ``replay`` take it)."""
    exit_code: int
    """The ``run`` command's exit code for this end (0 replied or quiesced, 1, 130, ...)."""

    @classmethod
    def of(cls, outcome: RunOutcome) -> Result:
        """The result of a finished ``run_headless`` (or resume) outcome."""
        return cls(
            outcome.outcome,
            outcome.reply,
            outcome.fleet_yield,
            outcome.session.root,
            outcome.exit_code,
        )


class Run:
    """A run going on in a thread of its own (:func:`start`): its events, its cancel, its end.

    Events are buffered from before the trunk starts, in one bounded buffer shared by
    :meth:`events` and :meth:`aevents` (each event is handed out once)."""

    def __init__(self, spec: RunSpec, buffer: int = SUBSCRIBER_BUFFER) -> None:
        self._spec = spec
        self._lock = threading.Lock()
        self._fleet: Any = None
        self._cancelled = False
        self._sub = Subscription(buffer, name="api")
        self._bus_sub: Subscription | None = None
        self._seen: dict[str, tuple[int, int, int, int, Decimal | None]] = {}
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="exarch-run", daemon=True)
        self._thread.start()

    # --- the RunObserver of run_headless (on the run's thread) --------------------------------

    def _attach(self, fleet: Any) -> None:
        """The fleet exists and no agent has started: subscribe to its bus."""
        self._bus_sub = fleet.bus.subscribe(name="api")
        with self._lock:
            self._fleet = fleet

    def _tick(self) -> None:
        """Move the bus's events into the run's buffer and sample each agent's figures."""
        self._move()
        fleet = self._fleet
        if fleet is None:
            return
        for name, view in live_agents(fleet).items():
            s = view.stats
            cost = s.spend.read().cost
            figures = (s.turns, s.ral_calls, s.input_tokens, s.output_tokens, cost)
            if self._seen.get(name) != figures:
                self._seen[name] = figures
                self._sub.offer(Progress(name, *figures))

    def _detach(self) -> None:
        """The fleet has closed: hand over the last events and end the buffer."""
        self._tick()
        with self._lock:
            fleet, self._fleet = self._fleet, None
        if fleet is not None and self._bus_sub is not None:
            fleet.bus.unsubscribe(self._bus_sub)
            self._move()

    def _move(self) -> None:
        if self._bus_sub is not None:
            for event in self._bus_sub.drain():
                self._sub.offer(event)

    def _started(self, fleet: Any) -> None:
        if self._cancelled:  # cancel() came before the trunk existed
            fleet.cancel_all("interrupted")

    def _main(self) -> None:
        try:
            self._result = Result.of(
                run_headless(self._spec, on_start=self._started, observer=_Feed(self))
            )
        except click.ClickException as e:
            self._error = RunRefused(e.format_message())
        except BaseException as e:
            self._error = e
        finally:
            self._sub.close()
            self._done.set()

    # --- the caller's side --------------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the whole tree (from any thread); the run settles every child and ends
        ``cancelled`` (or as it was ending already). Idempotent."""
        with self._lock:
            self._cancelled = True
            fleet = self._fleet
        if fleet is not None:
            fleet.cancel_all("interrupted")

    @property
    def done(self) -> bool:
        """Whether the run has ended (its result or its error is ready)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Result:
        """The run's result once it ended; raises :class:`RunRefused` if it was refused,
        ``TimeoutError`` if ``timeout`` seconds pass first."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the run did not end within {timeout} s")
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """The run's events as they happen, ending when the run has ended and every event was
        handed out; ``timeout``: stop early once no event came for that many seconds."""
        while True:
            event = self._sub.get(timeout)
            if event is None:
                return
            yield event

    async def aevents(self) -> AsyncIterator[Event]:
        """:meth:`events` for asyncio: each wait runs on the loop's default executor, so the
        loop goes on serving other tasks while the run is quiet."""
        loop = asyncio.get_running_loop()
        while True:
            event = await loop.run_in_executor(None, self._sub.get, 0.5)
            if event is not None:
                yield event
            elif self._done.is_set():  # the buffer is closed: what is left, then the end
                for event in self._sub.drain():
                    yield event
                return

    async def await_result(self) -> Result:
        """:meth:`wait` for asyncio (the wait runs on the loop's default executor)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.wait)


class _Feed:
    """The ``RunObserver`` of a :class:`Run` (``cli/runner.py``): its hooks, kept off the
    handle's public face."""

    def __init__(self, run: Run) -> None:
        self.attach = run._attach
        self.tick = run._tick
        self.detach = run._detach


def _spec(
    target: str,
    *,
    provider: str | None,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    session_dir: str | Path | None,
    chat: bool,
    agents: Literal["thread", "process"],
    backend: Literal["local", "ray"],
    ray_address: str | None,
    placement: str | None,
    limits: ShellLimits | None,
    durability: Durability,
    prices: PriceTable | None,
    budget: Decimal | float | str | None,
    grant_exec: tuple[str, ...],
    grant_root: tuple[str, ...],
    record: str | Path | None,
    secret_env: tuple[str, ...],
    disk_warn_bytes: int | None,
    window_tokens: int | None,
    otlp_endpoint: str | None,
) -> RunSpec:
    if backend == "ray" and record:
        raise RunRefused("record keeps every agent's provider in this process: not with ray")
    if otlp_endpoint and not otel_available():
        raise RunRefused(str(OtelMissing()))
    connection = ProviderChoice(
        provider=provider, model=model, base_url=base_url, api_key=api_key, secret_env=secret_env
    )
    try:
        return spec_for(
            str(target),
            connection,
            chat=chat,
            session_dir=str(session_dir) if session_dir is not None else None,
            disk_warn_bytes=disk_warn_bytes,
            window_tokens=window_tokens,
            grant_exec=tuple(grant_exec),
            grant_root=tuple(grant_root),
            limits=limits or ShellLimits(),
            record=str(record) if record is not None else None,
            durability=durability,
            prices=prices or PriceTable(),
            budget=Decimal(str(budget)) if budget is not None else None,
            agents=agents,
            backend=backend,
            ray_address=ray_address,
            placement=placement,
            otlp_endpoint=otlp_endpoint,
        )
    except click.ClickException as e:
        raise RunRefused(e.format_message()) from None


def start(
    target: str | Path,
    *,
    provider: str | None = None,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    session_dir: str | Path | None = None,
    chat: bool = False,
    agents: Literal["thread", "process"] = DEFAULT_AGENTS,
    backend: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    placement: str | None = None,
    limits: ShellLimits | None = None,
    durability: Durability = DEFAULT_DURABILITY,
    prices: PriceTable | None = None,
    budget: Decimal | float | str | None = None,
    grant_exec: tuple[str, ...] = (),
    grant_root: tuple[str, ...] = (),
    record: str | Path | None = None,
    secret_env: tuple[str, ...] = (),
    disk_warn_bytes: int | None = None,
    window_tokens: int | None = None,
    otlp_endpoint: str | None = None,
    buffer: int = SUBSCRIBER_BUFFER,
) -> Run:
    """Start a run in a thread of its own and return its :class:`Run` handle at once.

    ``target`` is what ``exarch-actors run`` takes: a ``SCENARIO.toml`` (the scripted provider,
    no network), a packaged example's name (``"fanout"``), or a prompt for ``provider``. Every
    option is the ``run`` flag of that name (``docs/api.md``). ``buffer``: events the handle
    holds before a slow consumer is handed an ``Overflow`` record. Raises :class:`RunRefused` for
    what ``run`` exits 2 on (nothing is started then)."""
    spec = _spec(
        str(target),
        provider=provider,
        model=model,
        base_url=base_url,
        api_key=api_key,
        session_dir=session_dir,
        chat=chat,
        agents=agents,
        backend=backend,
        ray_address=ray_address,
        placement=placement,
        limits=limits,
        durability=durability,
        prices=prices,
        budget=budget,
        grant_exec=grant_exec,
        grant_root=grant_root,
        record=record,
        secret_env=secret_env,
        disk_warn_bytes=disk_warn_bytes,
        window_tokens=window_tokens,
        otlp_endpoint=otlp_endpoint,
    )
    return Run(spec, buffer)


def run(target: str | Path, **options: Any) -> Result:
    """Run to the end and return its :class:`Result`: :func:`start` (same ``target`` and
    options) then :meth:`Run.wait`. A ``KeyboardInterrupt`` while waiting cancels the tree,
    waits for it to settle, and is raised again."""
    handle = start(target, **options)
    try:
        return handle.wait()
    except KeyboardInterrupt:
        handle.cancel()
        handle.wait()
        raise


def resume(
    session_dir: str | Path,
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    durability: Durability | None = None,
    agents: Literal["thread", "process"] | None = None,
    secret_env: tuple[str, ...] = (),
    otlp_endpoint: str | None = None,
) -> Result:
    """Resume the run in ``session_dir`` after its control process died, and finish it (what
    ``exarch-actors resume`` does). Raises :class:`RunRefused` for a directory that is not a
    session, holds no unfinished run, or has a damaged file (or ``otlp_endpoint`` without the
    otel extra)."""
    from exarch_actors.actors.resume import resume_run

    if otlp_endpoint and not otel_available():
        raise RunRefused(str(OtelMissing()))
    overrides = {
        k: v
        for k, v in {"model": model, "base_url": base_url, "api_key": api_key}.items()
        if v is not None
    }
    try:
        got = resume_run(
            SessionDir(Path(session_dir).resolve()),
            connection=overrides,
            durability=durability,
            agents=agents,
            secret_env=secret_env,
            otlp_endpoint=otlp_endpoint,
        )
    except ResumeRefused as e:
        raise RunRefused(str(e)) from None
    return Result.of(RunOutcome(got.outcome, got.reply, got.fleet_yield, got.session))


def check(session_dir: str | Path, *, processes: bool = True) -> InvariantReport:
    """Check the invariants of a session directory (what ``exarch-actors check`` prints);
    ``report.ok`` says whether every one held. ``processes=False`` skips the check that no
    process of the run is still alive. Raises :class:`RunRefused` if it is not a session."""
    try:
        return check_session(SessionDir(Path(session_dir)), processes=processes)
    except NotASession as e:
        raise RunRefused(str(e)) from None


def trace(session_dir: str | Path, output: str | Path | None = None) -> dict[str, Any]:
    """The session as a Chrome trace object (``exarch-actors trace``: the JSON that
    ui.perfetto.dev and chrome://tracing open), also written to ``output`` when given. Raises
    :class:`RunRefused` if it is not a session."""
    try:
        view = read_view(SessionDir(Path(session_dir)))
    except NotASessionDir as e:
        raise RunRefused(str(e)) from None
    doc = chrome_trace(view)
    if output is not None:
        Path(output).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return doc


def report(
    session_dir: str | Path, output: str | Path | None = None, *, processes: bool = True
) -> str:
    """The session's self-contained HTML report (``exarch-actors report``), also written to
    ``output`` when given; ``processes=False`` skips the leftover-process invariant. Raises
    :class:`RunRefused` if it is not a session."""
    try:
        page = session_report(SessionDir(Path(session_dir)), processes=processes)
    except NotASessionDir as e:
        raise RunRefused(str(e)) from None
    if output is not None:
        Path(output).write_text(page, encoding="utf-8")
    return page


def replay_recording(
    session_dir: str | Path,
    *,
    session_out: str | Path | None = None,
    ignore: tuple[str, ...] = (),
    ignore_regex: tuple[str, ...] = (),
    deadline: float = DEFAULT_DEADLINE,
) -> tuple[Result, Report]:
    """Replay a recorded session (``run(..., record=...)``) offline into a new session and
    compare every agent's ral results with the recording's (``exarch-actors replay``);
    ``report.diverged`` says whether anything differed. Raises :class:`RunRefused` for a session
    with no recording."""
    try:
        outcome, report = replay_session(
            str(session_dir),
            str(session_out) if session_out is not None else None,
            tuple(ignore),
            tuple(ignore_regex),
            deadline,
            quiet=True,
        )
    except click.ClickException as e:
        raise RunRefused(e.format_message()) from None
    if report is None:
        raise KeyboardInterrupt("the replay was cancelled before it was compared")
    return Result.of(outcome), report
