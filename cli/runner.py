"""What ``run`` and ``fleet`` share: build a fleet from the command line, run a headless trunk to
its end, write ``result.json``, and map the outcome to its exit code (docs/scenarios.md).

Exit codes: 0 when the trunk replied or quiesced normally, 1 on a failed or capped run or one
stopped by ``--budget`` (outcome ``budget``: the tree is cancelled and settled), 2 on bad
input (an unreadable scenario, a bad flag, no API key for the hosted service), 130 when cancelled
by SIGINT (Ctrl-C), 143 when cancelled by SIGTERM. Both signals cancel the whole tree and let it
settle (``result.json`` says ``cancelled``) before the process exits. What is printed is
``cli/run_report.py``'s.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, Protocol

import click

from exarch_actors.cli import Refused, exit_guard
from exarch_actors.cli.backend_options import check_backend, make_backend
from exarch_actors.cli.config import with_config
from exarch_actors.cli.recording import open_recording
from exarch_actors.runtime.credentials import SecretPolicy
from exarch_actors.runtime.drills.fault_switch import pause_point
from exarch_actors.runtime.errors import ExarchError, ScenarioError
from exarch_actors.runtime.mcp.config import McpServer
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.governor import Governor
from exarch_actors.runtime.providers.prices import PriceTable
from exarch_actors.runtime.providers.scenario import Scenario, load_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.ral.grants import GrantPolicy
from exarch_actors.runtime.ral.values import render
from exarch_actors.runtime.settlement.fleet_yield import FleetYield
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state import disk_full, durability
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import write_json_document
from exarch_actors.runtime.state.session_dir import SessionDir, SessionDirInUse
from exarch_actors.runtime.state.session_lock import SessionLive, SessionLock

if TYPE_CHECKING:
    from exarch_actors.cli.provider_options import ProviderChoice

EXIT_CODES = {
    "replied": 0,
    "quiesced": 0,
    "failed": 1,
    "capped": 1,
    "budget": 1,
    "cancelled": 130,
}

log = logging.getLogger(__name__)

CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals that cancel a headless run (the whole tree) instead of killing the process."""


def exit_code(outcome: str, signum: int | None = None) -> int:
    """The exit code of an outcome; a run cancelled by a signal exits ``128 + signum``."""
    if outcome == "cancelled" and signum is not None:
        return 128 + signum
    return EXIT_CODES.get(outcome, 1)


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
    grant_exec: tuple[str, ...] = ()
    grant_root: tuple[str, ...] = ()
    """``--grant-exec`` / ``--grant-root`` as given (:func:`cli.grants.fleet_policy` resolves)."""
    limits: ShellLimits = field(default_factory=ShellLimits)
    """Every shell's memory, live-worker and binding-size limits (``cli/limits.py`` flags)."""
    record: str | None = None
    """``--record FILE.toml``: where to write the recording (``cli/recording.py``)."""
    cwd: str | None = None
    grants: GrantPolicy | None = None
    """Grants already resolved (``replay``: the recorded run's); else from the flags."""
    durability: Durability = DEFAULT_DURABILITY
    """``--durability``: what an acknowledged record survives (``runtime/state/durability.py``)."""
    prices: PriceTable = field(default_factory=PriceTable)
    """Dollars per million tokens by model (``--prices`` / ``--price``; ``cli/cost_options.py``)."""
    budget: Decimal | None = None
    """``--budget USD``: the run is cancelled when the fleet's spend reaches it."""

    @property
    def run_prices(self) -> PriceTable:
        """The prices the run is charged by: ``--prices`` / ``--price`` over the built-in table,
        except that the scripted provider bills nothing (no network) unless a flag or file
        priced its model (the scenario's file name: a budget rehearsed offline, docs/cost.md)."""
        if self.provider == "scripted" and self.priced_model not in self.prices.overridden:
            return self.prices.free_of_charge()
        return self.prices

    @property
    def priced_model(self) -> str | None:
        """The model name prices are looked up by: the scripted provider's is the scenario's
        file name without ``.toml`` (as :class:`ScriptedProvider` reports it)."""
        if self.provider == "scripted":
            return Path(self.scenario.source).stem if self.scenario is not None else None
        return self.model

    agents: Literal["thread", "process"] = "thread"
    """``--agents``: each agent on a thread of this process, or in an OS process of its own."""
    backend: Literal["local", "ray"] = "local"
    """``--backend``: agent processes on this machine, or Ray actors (cli/backend_options.py)."""
    ray_address: str | None = None
    placement: str | None = None
    """``--placement``: None is ``spread``."""
    secret_env: tuple[str, ...] = ()
    """``--secret-env``: variables kept out of every shell besides the provider's keys."""
    mcp: tuple[McpServer, ...] = ()
    """The run's MCP servers (``cli/mcp_options.py``: config files, scenario, ``--mcp``)."""
    grant_mcp: tuple[str, ...] = ()
    """``--grant-mcp``: the servers every agent may use (none: every configured one)."""
    otlp_endpoint: str | None = None
    """``--otlp-endpoint``: the collector the run's spans go to (``cli/otlp.py``)."""

    @property
    def secrets(self) -> SecretPolicy:
        """What no shell of the run sees (``runtime/credentials.py``): the marked names (flags
        and the scenario's ``[fleet] secret_env``) and the ``--api-key`` value."""
        return secret_policy(self.secret_env, self.scenario, self.api_key)


@dataclass(frozen=True)
class RunOutcome:
    outcome: str
    reply: str | None
    fleet_yield: FleetYield
    session: SessionDir
    signum: int | None = None
    """The signal that cancelled the run, if one did."""

    @property
    def exit_code(self) -> int:
        """:func:`exit_code`, except that a trunk that quiesced without a reply while any child
        failed exits 1: its run did not do what it was asked (37 of 40 children failing
        against a rate-limited server once ended ``quiesced``, exit 0)."""
        if self.unanswered_failure:
            return 1
        return exit_code(self.outcome, self.signum)

    @property
    def unanswered_failure(self) -> bool:
        return (
            self.outcome == "quiesced"
            and self.reply is None
            and self.fleet_yield.failed_children > 0
        )


def read_scenario(path: str) -> Scenario:
    """Load a scenario or exit 2 with the file position of what is wrong; each unknown key is a
    ``warning: FILE:LINE: key.path: unknown key (ignored)`` line on stderr (a typo is never
    silently lost, and never fatal: more fields are welcome)."""
    try:
        scenario = load_scenario(path)
    except ScenarioError as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        raise click.UsageError(f"cannot read scenario {path}: {e.strerror or e}") from None
    for warning in scenario.warnings:
        click.echo(f"warning: {warning}", err=True)
    return scenario


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
"""The example scenarios: ``examples/`` of a clone, or the copy a wheel installs beside ``cli``
(``exarch_actors/examples``)."""


def packaged_example(target: str) -> str | None:
    """The example scenario a bare word names (``fanout`` -> ``examples/fanout.toml``) when no
    file of that name exists here; else ``None``, and the word stays what it was (a prompt)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", target) or Path(target).exists():
        return None
    found = EXAMPLES / f"{target}.toml"
    return str(found) if found.is_file() else None


def spec_for(
    target: str, connection: ProviderChoice, *, chat: bool = False, **settings: Any
) -> RunSpec:
    """The :class:`RunSpec` of ``run`` / ``fleet``: a ``.toml`` target is a scenario played by
    the scripted provider (with a network ``--provider`` its ``[fleet]`` prompt and system prompt
    go to the real model), any other target is a prompt for ``--provider`` (default openai)."""
    target = packaged_example(target) or target
    refuse_missing_path(target)
    is_scenario = target.endswith(".toml")
    connection = with_config(connection, scenario=is_scenario)
    provider = connection.provider or ("scripted" if is_scenario else "openai")
    scenario = read_scenario(target) if is_scenario else None
    if provider == "scripted" and scenario is None:
        raise click.UsageError("the scripted provider plays a scenario file (SCENARIO.toml)")
    from exarch_actors.cli.mcp_options import check_grants, run_servers

    settings["mcp"] = run_servers(tuple(settings.get("mcp") or ()), scenario)
    check_grants(tuple(settings.get("grant_mcp") or ()), settings["mcp"])
    return RunSpec(
        provider=provider,
        prompt=(scenario.prompt if scenario is not None else target)
        if provider != "scripted"
        else None,
        scenario=scenario,
        model=connection.model,
        base_url=connection.base_url,
        api_key=connection.api_key,
        chat=chat,
        provider_options=connection.network_options(provider),
        secret_env=connection.secret_env,
        **settings,
    )


def looks_like_a_path(target: str) -> bool:
    """A target that is taken for a file, never a prompt: it has a ``/`` or ends in ``.toml``,
    and no whitespace (a prompt is words)."""
    return ("/" in target or target.endswith(".toml")) and not any(c.isspace() for c in target)


def refuse_missing_path(target: str) -> None:
    """Exit 2 naming the missing file when ``target`` looks like a path and names no file:
    ``run examples/fanout`` once went to the model as a prompt (with a key set, to the hosted
    API)."""
    if not looks_like_a_path(target) or Path(target).is_file():
        return
    hint = ""
    if Path(target + ".toml").is_file():
        hint = f"; did you mean {target}.toml?"
    elif Path(target).is_dir():
        hint = f"; {target} is a directory, not a SCENARIO.toml"
    raise click.UsageError(
        f"no such file: {target} (an argument with a '/' or a .toml ending and no spaces is a "
        f"scenario path, not a prompt){hint}"
    )


def secret_policy(
    names: tuple[str, ...], scenario: Scenario | None, api_key: str | None
) -> SecretPolicy:
    """The run's :class:`SecretPolicy`: ``names`` and the scenario's marked, ``api_key`` held."""
    marked = (*names, *(scenario.secret_env if scenario is not None else ()))
    return SecretPolicy().marking(marked).holding([api_key])


class ProviderFactory:
    """Each agent's provider by name, and the run's traffic governor (``None`` for a scripted
    run: it has no network), which the command hands to the fleet and closes at the end."""

    def __init__(self, make: Callable[[str], Provider], governor: Governor | None = None) -> None:
        self._make = make
        self.governor = governor

    def __call__(self, name: str) -> Provider:
        return self._make(name)


def provider_factory(spec: RunSpec) -> ProviderFactory:
    if spec.provider == "scripted":
        if spec.scenario is None:
            raise click.UsageError("the scripted provider needs a scenario file")
        playback = ScenarioPlayback(spec.scenario)
        return ProviderFactory(
            lambda name: make_provider("scripted", scenario=playback, agent_name=name)
        )
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
    return ProviderFactory(base.for_agent, getattr(base, "governor", None))


class Interruption:
    """Whether a cancelling signal arrived, and which came first."""

    def __init__(self) -> None:
        self._hit = threading.Event()
        self.signum: int | None = None

    def is_set(self) -> bool:
        return self._hit.is_set()

    def _set(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        self._hit.set()


@contextmanager
def signals_cancel(cancel: Callable[[], None]) -> Iterator[Interruption]:
    """SIGINT (Ctrl-C) and SIGTERM cancel the run (the whole tree) instead of ending the process
    on the spot: the caller lets the tree settle, writes ``result.json`` and exits 130 / 143.
    A shell that ignores the cancel is killed after its grace, so settling always ends.

    A second signal while the tree settles ends a command at once (128 + signum), as a
    control process's death would (``resume`` carries the run on): a run whose settling
    cannot end -- its bus dead of a failed write, say -- is never left to SIGKILL. A cancel
    that fails is logged, never raised into the interrupted thread."""
    hit = Interruption()
    if threading.current_thread() is not threading.main_thread():
        yield hit
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if hit.is_set() and exit_guard.installed():
            exit_guard.end_now(
                128 + signum,
                f"{signal.Signals(signum).name} again: not waiting for the tree to settle",
            )
        hit._set(signum)
        try:
            cancel()
        except Exception:
            log.exception("cancelling the run on %s failed", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in CANCEL_SIGNALS}
    try:
        yield hit
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


class RunObserver(Protocol):
    """What watches a run from the waiting thread (``cli/run_report.py``: the live status)."""

    def attach(self, fleet: Any) -> None:
        """The fleet exists and no agent has started: subscribe to its bus here."""

    def tick(self) -> None:
        """Called about every 0.1 s while the run goes on."""

    def detach(self) -> None:
        """The fleet has closed (every event is published), or the run raised."""


def run_headless(
    spec: RunSpec,
    *,
    on_start: Callable[[Any], None] | None = None,
    observer: RunObserver | None = None,
    hosts: Any = None,
) -> RunOutcome:
    """Run a headless trunk to its end and write ``result.json``.

    ``hosts``: a ``HostBackend`` the caller made and closes (a drill's one Ray connection for
    all its rounds), used instead of one made from ``spec.backend`` for this run alone.

    What can be refused (a bad flag, a missing API key, no prompt) is refused before the
    session directory is created, so a refused run leaves nothing behind."""
    from exarch_actors.cli.grants import fleet_policy
    from exarch_actors.cli.limits import sandboxed

    grants = spec.grants or fleet_policy(
        spec.grant_exec, spec.grant_root, spec.scenario, spec.grant_mcp
    )
    prompt = spec.prompt
    system = None
    if spec.scenario is not None:
        prompt = prompt or spec.scenario.prompt
        system = spec.scenario.system
    if not prompt:
        raise click.UsageError("nothing to do: give a PROMPT or a scenario with [fleet] prompt")
    if spec.budget is not None and spec.run_prices.free:
        click.echo(
            f"note: --budget {spec.budget}: a scripted run costs nothing ($0), so the "
            "budget never stops it",
            err=True,
        )
    elif spec.budget is not None and spec.prices.price(spec.priced_model) is None:
        name = spec.priced_model or "(none)"
        raise click.UsageError(
            f"--budget needs a price for model {name!r}: add --price {name}=INPUT,OUTPUT or "
            f"--prices FILE (dollars per million tokens; docs/cost.md)"
        )
    spec = replace(spec, limits=sandboxed(spec.limits, spec.provider))
    made = provider_factory(spec)
    governor = made.governor
    factory: Callable[[str], Provider] = made
    check_backend(spec.backend, spec.ray_address, spec.placement)
    session, lock = open_session(spec.session_dir)
    try:
        return _run_owned(
            spec, session, factory, governor, grants, prompt, system, hosts, on_start, observer
        )
    finally:
        lock.release()


def _run_owned(
    spec: RunSpec,
    session: SessionDir,
    factory: Callable[[str], Provider],
    governor: Governor | None,
    grants: GrantPolicy,
    prompt: str,
    system: str | None,
    hosts: Any,
    on_start: Callable[[Any], None] | None = None,
    observer: RunObserver | None = None,
) -> RunOutcome:
    """:func:`run_headless` once the session is owned (its lock held by the caller)."""
    from exarch_actors.actors.fleet import Fleet, FleetConfig
    from exarch_actors.actors.mcp_site import McpSetup

    disk_full.reset()  # a latch an earlier run in this process tripped is not this run's
    write_run_spec(session, spec, grants)
    pause_point("run-spec-written")  # a kill here: a run that never got going (resume starts it)
    recording = open_recording(spec, session, factory, prompt=prompt, system=system)
    if recording is not None:
        factory = recording.factory
    owned = hosts is None
    tables = spec.scenario.placement if spec.scenario is not None else ()
    backend = (
        make_backend(spec.backend, spec.ray_address, spec.placement, tables) if owned else hosts
    )
    fleet = Fleet(
        session,
        factory,
        FleetConfig(
            disk_warn_bytes=spec.disk_warn_bytes,
            grants=grants,
            limits=spec.limits,
            cwd=spec.cwd,
            durability=spec.durability,
            prices=spec.run_prices,
            budget=spec.budget,
            agents="process" if backend is not None else spec.agents,
            backend=backend,
            traffic=governor,
            secrets=spec.secrets,
            mcp=McpSetup(
                spec.mcp,
                spec.scenario.mcp_replies if spec.scenario is not None else {},
                recording.recorder.mcp_reply if recording is not None else None,
            ),
            otlp_endpoint=spec.otlp_endpoint,
        ),
    )
    outcome = "failed"
    reply: str | None = None
    try:
        # Ctrl-C / SIGTERM are caught from the first line printed on: before the trunk exists
        # the signal is remembered and cancels the trunk as soon as it does.
        with signals_cancel(lambda: fleet.cancel_all("interrupted")) as interrupted:
            if observer is not None:
                observer.attach(fleet)
            try:
                trunk = fleet.start_trunk(prompt, chat=spec.chat, system=system)
            except ExarchError as e:  # its Ray host could not start (a placement refused)
                if spec.backend != "ray":
                    raise
                raise TrunkNotStarted(f"the trunk could not start: {e}") from None
            if interrupted.is_set():
                fleet.cancel_all("interrupted")
            if on_start is not None:
                on_start(fleet)
            while not fleet.wait_empty(0.1):
                if observer is not None:
                    observer.tick()
                if disk_full.tripped() is not None:  # a caller in-process: not ended by it
                    fleet.cancel_all("disk full")
                    break
        full = disk_full.tripped()
        if full is not None:
            raise full
        outcome = trunk.outcome.value if trunk.outcome is not None else "failed"
        if interrupted.is_set():
            outcome = "cancelled"
        elif fleet.budget_reached:
            outcome = "budget"
        if trunk.replied:
            value = trunk.reply_value
            reply = render(value)
    finally:
        try:
            fleet.close()
        finally:
            if backend is not None and owned:
                backend.close()
            if recording is not None:
                recording.close()
            if governor is not None:
                governor.close()
            if observer is not None:
                observer.detach()
    fy = fleet.write_result(outcome, reply)
    return RunOutcome(outcome, reply, fy, session, interrupted.signum)


class TrunkNotStarted(click.ClickException):
    """The trunk's host could not be started (on Ray: no node held its resource request):
    the run fails (exit 1) with the reason, never a traceback."""

    exit_code = 1


def open_session(session_dir: str | None) -> tuple[SessionDir, SessionLock]:
    """The directory of a new run and its owner lock, held until the caller releases it:
    ``--session-dir`` if given (exit 2 if a live run owns it, or it already holds a run), else
    a fresh one under ``.exarch/sessions/``."""
    try:
        return SessionDir.claim_fresh(session_dir or None)
    except (SessionDirInUse, SessionLive) as e:
        raise Refused(str(e)) from None


def write_run_spec(session: SessionDir, spec: RunSpec, grants: GrantPolicy | None = None) -> None:
    """``run.json``: what ``resume`` needs to rebuild the run (never the API key). The grants
    are written resolved, so a resumed run keeps exactly them instead of resolving again."""
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
        "shellLimits": spec.limits.to_json(),
        "cwd": spec.cwd or str(Path.cwd()),
        "grants": (grants or GrantPolicy()).to_dict(),
        "durability": spec.durability.value,
        "agents": "process" if spec.backend == "ray" else spec.agents,
        "secretEnv": spec.secrets.to_json(),  # names only: a key is never written
        "mcp": [s.to_dict() for s in spec.mcp],  # env and header values left out
    }
    traffic = dict(spec.provider_options).get("traffic")
    if traffic is not None:
        data["traffic"] = traffic.to_dict()  # resume governs with the limits the run was given
    with durability.bound_to(session.root, spec.durability):
        write_json_document(session.run_spec, data)


def session_path(session: SessionDir) -> str:
    try:
        return str(session.root.relative_to(Path.cwd()))
    except ValueError:
        return str(session.root)
