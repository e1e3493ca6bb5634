"""``exarch-actors drill``: break a live fleet on purpose, then prove nothing was lost.

A drill runs *rounds* until ``--duration`` has passed: each round is one fleet run (a synthetic
fan-out from ``--agents/--calls``, or the given scenario) in its own session directory
``<drill dir>/round-NNN/``. The seeded nemesis (``runtime/drills/nemesis.py``) fixes the whole fault
schedule up front and the rules by which faults land; the drill delivers each fault when its
time comes:

- scripted faults are written into the next round's scenario before it starts (one its agent
  never reached goes into a later round);
- live faults are applied to the running round from this thread (``cli/drill_faults.py``);
- ``control-kill`` runs that round in a child process (``exarch-actors run``), SIGKILLs it and
  resumes it here (``cli/drill_rounds.py``); control-kill rounds take at most half the drill's
  time, so every live kind gets in-process rounds to land in.

After every round ``runtime/drills/invariant_check.py`` checks the round's directory; the drill adds
two
checks of its own (a flood's accounting, and no stray child process of the drill). Recovery is
measured from each fault to the affected agent's next successful ral call (``Io`` without error
in the transcript). ``drill-report.json`` in the drill directory holds the schedule, what was
applied (scheduled vs applied per kind), every round's invariants and the figures.

Exit codes (:data:`EXIT_HELD` ...): 0 every invariant held and every requested kind that was
owed landed; 1 an invariant was violated or a requested kind was never applied
(``runtime.drills.nemesis.owed_kinds``); 2 bad input; 130 / 143 interrupted by SIGINT / SIGTERM,
after settling the current round and writing the report of the rounds run, marked
``interrupted``.
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
import psutil
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from exarch_actors.cli import HELP_SETTINGS, Refused
from exarch_actors.cli.backend_options import Backend, backend_options, check_backend, make_backend
from exarch_actors.cli.drill_faults import (
    Applied,
    measure_recovery,
    round_times,
)
from exarch_actors.cli.drill_rounds import (
    DrillStop,
    LiveFeed,
    run_in_process,
    run_killed_and_resumed,
)
from exarch_actors.cli.durability import durability_option
from exarch_actors.runtime.drills.fault_switch import injecting_faults
from exarch_actors.runtime.drills.invariant_check import (
    InvariantReport,
    InvariantResult,
    NotASession,
    check_session,
)
from exarch_actors.runtime.drills.nemesis import (
    CONTROL,
    KNOWN_KINDS,
    LIVE,
    PROCESS,
    RAY,
    SCRIPTED,
    BadFaults,
    Fault,
    Placed,
    child_name,
    control_round,
    coverage_required,
    estimated_round_secs,
    fault_schedule,
    owed_kinds,
    parse_faults,
    plan_scripted,
    script_index,
    sure_calls,
    synthetic_scenario,
)
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.durable import atomic_write_bytes, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_lock import SessionLive

__all__ = [
    "DrillConfig",
    "DrillResult",
    "drill_command",
    "run_drill",
]

EXIT_HELD = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class DrillConfig:
    seed: int
    rate: float
    faults: tuple[str, ...]
    duration: float
    agents: int = 3
    calls: int = 5
    call_ms: int = 20
    scenario: str | None = None
    root: Path = Path(".")
    durability: Durability = DEFAULT_DURABILITY
    """Every round's ``--durability`` (a control-killed round's resume keeps it: run.json)."""
    hosts: Any = None
    """``--backend ray``: the one Ray backend every round's agents run on (None: this
    machine)."""


@dataclass
class DrillResult:
    """What a drill did. ``applied`` holds every fault attempted (``landed`` or not);
    ``skipped`` every scheduled fault never attempted; each scheduled fault is in exactly one
    of the two."""

    config: DrillConfig
    schedule: tuple[Fault, ...]
    applied: list[Applied]
    rounds: list[dict[str, Any]]
    reports: list[InvariantReport]
    extra: list[InvariantResult]
    skipped: list[Fault]
    interrupted: int | None = None
    """The signal number that stopped the drill early, if one did."""
    why_not: dict[int, str] = field(default_factory=dict)
    """Why each fault of ``skipped`` was never applied, by its ``seq``."""

    @property
    def violated(self) -> int:
        return sum(len(r.violated) for r in self.reports) + sum(
            1 for e in self.extra if e.status == "violated"
        )

    def scheduled_by_kind(self) -> Counter[str]:
        return Counter(f.kind for f in self.schedule)

    def landed_by_kind(self) -> Counter[str]:
        return Counter(a.fault.kind for a in self.applied if a.landed)

    @property
    def never_applied(self) -> tuple[str, ...]:
        """Requested kinds that never landed and fail the drill (none once interrupted: a
        drill stopped early owes nothing)."""
        if self.interrupted is not None:
            return ()
        return owed_kinds(
            self.config.faults,
            self.scheduled_by_kind(),
            self.landed_by_kind(),
            self.config.duration,
        )

    @property
    def ok(self) -> bool:
        return self.violated == 0 and not self.never_applied

    @property
    def exit_code(self) -> int:
        if self.interrupted is not None:
            return 128 + self.interrupted  # 130 for SIGINT, 143 for SIGTERM
        return EXIT_HELD if self.ok else EXIT_FAILED

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """Per requested kind: scheduled, aimed (tried on a target), applied (landed), missed
        (aimed, did not land), not applied (never aimed), and why: each reason a fault of the
        kind missed or was never applied, with how many."""
        sched, landed = self.scheduled_by_kind(), self.landed_by_kind()
        missed = Counter(a.fault.kind for a in self.applied if not a.landed)
        skipped = Counter(f.kind for f in self.skipped)
        why: dict[str, Counter[str]] = defaultdict(Counter)
        for a in self.applied:
            if not a.landed:
                why[a.fault.kind][f"missed: {a.detail.get('error') or a.outcome}"] += 1
        for f in self.skipped:
            why[f.kind][f"not applied: {self.why_not.get(f.seq, 'not tried')}"] += 1
        kinds = [k for k in KNOWN_KINDS if k in self.config.faults or sched[k]]
        return {
            k: {
                "scheduled": sched[k],
                "aimed": landed[k] + missed[k],
                "applied": landed[k],
                "missed": missed[k],
                "notApplied": skipped[k],
                "why": dict(why[k].most_common()),
            }
            for k in kinds
        }

    def recoveries(self) -> list[float]:
        return [a.recovery for a in self.applied if a.recovery is not None]

    def figures(self) -> dict[str, Any]:
        rec = self.recoveries()
        by_kind: dict[str, list[float]] = defaultdict(list)
        for a in self.applied:
            if a.recovery is not None:
                by_kind[a.fault.kind].append(a.recovery)
        return {
            "recovered": len(rec),
            "medianSecs": round(statistics.median(rec), 4) if rec else None,
            "worstSecs": round(max(rec), 4) if rec else None,
            "byKind": {
                k: {
                    "n": len(v),
                    "medianSecs": round(statistics.median(v), 4),
                    "worstSecs": round(max(v), 4),
                }
                for k, v in sorted(by_kind.items())
            },
        }

    def to_json(self) -> dict[str, Any]:
        c = self.config
        checked = sum(1 for r in self.reports for x in r.results if x.status != "skipped")
        held = sum(len(r.held) for r in self.reports)
        held += sum(1 for e in self.extra if e.status == "held")
        checked += sum(1 for e in self.extra if e.status != "skipped")
        return {
            "seed": c.seed,
            "rate": c.rate,
            "faults": list(c.faults),
            "duration": c.duration,
            "agents": c.agents,
            "calls": c.calls,
            "scenario": c.scenario,
            "durability": c.durability.value,
            "backend": "local" if c.hosts is None else "ray",
            "ok": self.ok,
            "interrupted": None
            if self.interrupted is None
            else signal.Signals(self.interrupted).name,
            "exitCode": self.exit_code,
            "coverage": {
                "required": coverage_required(c.duration),
                "neverApplied": list(self.never_applied),
            },
            "faultsByKind": self.by_kind(),
            "injectedByKind": dict(self.landed_by_kind()),
            "schedule": [f.to_json() for f in self.schedule],
            "applied": [a.to_json() for a in self.applied],
            "notApplied": [f.to_json() for f in self.skipped],
            "rounds": self.rounds,
            "drillChecks": [e.to_json() for e in self.extra],
            "invariants": {"checked": checked, "held": held, "violated": self.violated},
            "recovery": self.figures(),
        }


# --------------------------------------------------------------------------- the drill


def _stray_children() -> list[int]:
    """Non-zombie processes below this one other than the fork server and resource tracker."""
    me = psutil.Process()
    keep: set[int] = set()
    out: list[int] = []
    for p in me.children(recursive=False):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "forkserver" in cmd or "resource_tracker" in cmd:
            keep.add(p.pid)
    for p in me.children(recursive=True):
        try:
            if p.pid in keep or p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        out.append(p.pid)
    return out


def run_drill(
    cfg: DrillConfig, *, on_progress: Any = None, stop: DrillStop | None = None
) -> DrillResult:
    """Run the drill (see the module docstring); ``stop`` ends it after settling its round.

    Fault injection is on for the shells of the rounds run in this process while the drill runs
    (:func:`runtime.drills.fault_switch.injecting_faults`), and off again when it returns; a round
    run
    in a child process gets it in that child's environment alone (``cli/drill_rounds.py``)."""
    with injecting_faults():
        return _run_rounds(cfg, on_progress, stop if stop is not None else DrillStop())


def _run_rounds(cfg: DrillConfig, on_progress: Any, stop: DrillStop) -> DrillResult:
    cfg.root.mkdir(parents=True, exist_ok=True)
    schedule = fault_schedule(cfg.seed, cfg.rate, cfg.faults, cfg.duration)
    scripted = [f for f in schedule if f.kind in SCRIPTED]
    control = [f for f in schedule if f.kind in CONTROL]
    applied: list[Applied] = []
    start = time.monotonic()
    feed = LiveFeed([f for f in schedule if f.kind in LIVE + PROCESS + RAY], start, applied)
    backend: Literal["thread", "process"] = (
        "process" if any(k in PROCESS for k in cfg.faults) else "thread"
    )
    rounds: list[dict[str, Any]] = []
    reports: list[InvariantReport] = []
    extra: list[InvariantResult] = []
    est = estimated_round_secs(cfg.calls, cfg.call_ms)
    control_secs = 0.0
    fewest_calls: int | None = None
    """The fewest ral calls a finished in-process round of the given scenario made: how far
    into such a round a control-kill may wait and still land (the flags' --agents x --calls
    described a synthetic round, not the scenario: chain.toml makes 8 calls and every
    control-kill waiting for a later one missed, drill after drill)."""
    why_not: dict[int, str] = {}
    tries: Counter[int] = Counter()
    rnd = 0
    while not stop.is_set() and (rnd == 0 or time.monotonic() - start < cfg.duration):
        t0 = time.monotonic() - start
        window = t0 + est
        mine = [f for f in scripted if f.at < window]
        scripted = [f for f in scripted if f.at >= window]
        session = SessionDir(cfg.root / f"round-{rnd:03d}")
        scenario_path = cfg.root / f"round-{rnd:03d}.toml"
        placed: list[Placed] = []
        sure = 1  # a given scenario before any round of it finished: its first call
        if cfg.scenario is not None:
            scenario_path.write_bytes(Path(cfg.scenario).read_bytes())
            sure = fewest_calls or 1
        else:
            placed, later = plan_scripted(mine, cfg.agents, cfg.calls)
            scripted += later
            sure = sure_calls(cfg.agents, cfg.calls, placed)
            scenario_path.write_text(
                synthetic_scenario(cfg.agents, cfg.calls, call_ms=cfg.call_ms, placed=placed)
            )
        kill = control_round(control, window, t0, control_secs)
        before = len(applied)
        if kill is not None:
            control.remove(kill)
            # each try that ended before the kill halves how far in the next one waits
            reach = max(1, sure >> tries[kill.seq])
            info, killed = run_killed_and_resumed(
                scenario_path, session, kill, reach, rnd, feed, stop, cfg.durability
            )
            control_secs += time.monotonic() - start - t0
            if killed.landed:
                applied.append(killed)
            else:
                control.append(kill)  # the round ended before the kill: a later round takes it
                tries[kill.seq] += 1
                why_not[kill.seq] = (
                    f"each round it was tried in ({tries[kill.seq]}) ended before the kill"
                )
        else:
            info = run_in_process(
                scenario_path,
                session,
                rnd,
                feed,
                stop,
                cfg.durability,
                agents=backend,
                hosts=cfg.hosts,
            )
        unplayed = _played(placed, session, cfg.calls, rnd, applied)
        for f in unplayed:
            why_not[f.seq] = "its agent ended before the scripted message was played"
        scripted += unplayed
        if cfg.scenario is not None and kill is None and info.get("outcome") is not None:
            made = _ral_calls(session)
            fewest_calls = made if fewest_calls is None else min(fewest_calls, made)
        measure_recovery(applied[before:], session)
        extra += _flood_accounting(applied[before:], rnd)
        try:
            report = check_session(session)
        except NotASession as e:
            # A round that left no session directory lost everything it was given: a
            # violation to report, never a reason for the drill itself to crash.
            report = InvariantReport(
                str(session.root),
                (InvariantResult("session-written", "violated", 1, (str(e),)),),
            )
        reports.append(report)
        if stop.is_set():
            info["interrupted"] = True
        rounds.append(
            {"round": rnd, "dir": str(session.root), **info, "invariants": report.to_json()}
        )
        if on_progress is not None:
            on_progress(rnd, time.monotonic() - start, sum(1 for a in applied if a.landed))
        rnd += 1
    stray = _wait_no_strays()
    extra.append(
        InvariantResult(
            "no-stray-children",
            "violated" if stray else "held",
            1,
            tuple(f"pid {p} still running" for p in stray),
        )
    )
    skipped = sorted(feed.pending + scripted + control, key=lambda f: f.seq)
    elapsed = time.monotonic() - start
    for f in skipped:
        if f.seq in why_not:
            continue
        if f.at > elapsed:
            why_not[f.seq] = "not due before the drill ended"
        elif f.kind in CONTROL:
            why_not[f.seq] = "control-kill rounds had taken their share of the drill"
        elif f.kind in SCRIPTED:
            why_not[f.seq] = "no round placed it"
        else:
            why_not[f.seq] = "no live target while it was due"
    result = DrillResult(
        cfg, schedule, applied, rounds, reports, extra, skipped, stop.signum, why_not
    )
    atomic_write_bytes(
        cfg.root / "drill-report.json", (json.dumps(result.to_json(), indent=2) + "\n").encode()
    )
    return result


def _played(
    placed: list[Placed], session: SessionDir, calls: int, rnd: int, applied: list[Applied]
) -> list[Fault]:
    """Record each scripted fault the round played, at the time its message was played; return
    the ones it never reached (their agent ended first), which a later round places again."""
    missed: list[Fault] = []
    for p in placed:
        agent = child_name(p.child)
        times = round_times(session, agent)
        n = script_index(p, placed, calls)
        if n >= len(times):
            missed.append(p.fault)
            continue
        applied.append(
            Applied(
                p.fault,
                rnd,
                agent,
                times[n],
                {"beforeCall": p.call, "scriptIndex": n},
            )
        )
    return missed


def _ral_calls(session: SessionDir) -> int:
    """How many ral calls (``Io`` records) a round's transcript holds."""
    return sum(1 for r in read_jsonl(session.transcript).records if r.get("kind") == "Io")


def _flood_accounting(applied: list[Applied], rnd: int) -> list[InvariantResult]:
    """The drill's own check of each inbox flood: accepted + rejected == sent."""
    out: list[InvariantResult] = []
    for a in applied:
        if a.fault.kind == "inbox-flood" and "accepted" in a.detail:
            d = a.detail
            bad = d["accepted"] + d["rejected"] != d["sent"]
            out.append(
                InvariantResult(
                    "flood-accounting",
                    "violated" if bad else "held",
                    d["sent"],
                    (f"round {rnd}: {d}",) if bad else (),
                    (
                        f"round {rnd}: {d['accepted']} accepted (cap {d['cap']}), "
                        f"{d['rejected']} rejected to the sender",
                    ),
                )
            )
    return out


def _wait_no_strays(timeout: float = 3.0) -> list[int]:
    deadline = time.monotonic() + timeout
    stray = _stray_children()
    while stray and time.monotonic() < deadline:
        time.sleep(0.05)
        stray = _stray_children()
    return stray


# --------------------------------------------------------------------------- the command


def summary_table(result: DrillResult) -> Table:
    t = Table(title=f"drill seed {result.config.seed}: faults and recovery")
    cols = ("fault", "scheduled", "aimed", "applied", "missed", "not applied", "recovered")
    for col in (*cols, "median s", "worst s"):
        t.add_column(col, justify="left" if col == "fault" else "right")
    figs = result.figures()["byKind"]
    owed = set(result.never_applied)
    for kind, n in result.by_kind().items():
        f = figs.get(kind, {})
        applied = f"[bold red]{n['applied']}[/]" if kind in owed else str(n["applied"])
        t.add_row(
            kind,
            str(n["scheduled"]),
            str(n["aimed"]),
            applied,
            str(n["missed"]),
            str(n["notApplied"]),
            str(f.get("n", 0)),
            str(f.get("medianSecs", "-")),
            str(f.get("worstSecs", "-")),
        )
    return t


def invariant_table(result: DrillResult) -> Table:
    t = Table(title="invariants over every round")
    for col in ("invariant", "checked", "held", "violated", "first violation"):
        t.add_column(col)
    rows: dict[str, list[Any]] = {}
    for r in [x for rep in result.reports for x in rep.results] + result.extra:
        row = rows.setdefault(r.name, [0, 0, 0, ""])
        row[0] += r.status != "skipped"
        row[1] += r.status == "held"
        row[2] += r.status == "violated"
        if r.status == "violated" and not row[3]:
            row[3] = r.details[0] if r.details else ""
    for name, (c, h, v, first) in rows.items():
        t.add_row(name, str(c), str(h), f"[bold red]{v}[/]" if v else "0", first[:80])
    return t


@click.command("drill", context_settings=HELP_SETTINGS)
@click.argument("scenario", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--agents",
    type=click.IntRange(1, 200),
    default=3,
    show_default=True,
    help="Children of the synthetic fan-out (no SCENARIO).",
)
@click.option(
    "--calls",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="ral calls per synthetic child (no SCENARIO).",
)
@click.option(
    "--call-ms",
    type=click.IntRange(0, 10_000),
    default=20,
    show_default=True,
    help="Each synthetic call sleeps this long (keeps agents busy to be hit).",
)
@click.option("--seed", type=int, required=True, help="Fixes the whole fault schedule.")
@click.option("--rate", type=float, default=2.0, show_default=True, help="Faults per second.")
@click.option(
    "--faults",
    default="all",
    show_default=True,
    help="Comma-separated kinds: "
    + ", ".join(SCRIPTED + LIVE + CONTROL + PROCESS + RAY)
    + " (all: every kind but agent-kill, which runs each agent in its own process, and "
    "ray-worker-kill and node-loss, which need --backend ray)",
)
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds.")
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the drill.")
@click.option("--json", "as_json", is_flag=True, help="Print drill-report.json instead of tables.")
@durability_option()
@backend_options
def drill_command(
    scenario: str | None,
    agents: int,
    calls: int,
    call_ms: int,
    seed: int,
    rate: float,
    faults: str,
    duration: float,
    session_dir: str | None,
    as_json: bool,
    durability: Durability,
    backend: Backend,
    ray_address: str | None,
    placement: str | None,
) -> None:
    """Run fleets for --duration seconds while a seeded nemesis injects faults; check the
    invariants after each round. Each round plays SCENARIO if given (as written: only live
    faults hit it), else a synthetic fan-out of --agents children with --calls ral calls each.
    Rounds and drill-report.json go to --session-dir (default .exarch/sessions/<id>/).

    Every requested fault kind must land: in a drill of 60 s or more each is scheduled and
    applied at least once, and a kind the schedule held that never landed fails the drill. The
    table shows per kind how many faults were scheduled, aimed at a target, applied, missed
    and not applied, with a line for each reason one missed or was not applied;
    drill-report.json in the drill directory holds every fault, round and invariant.

    Ctrl-C (or SIGTERM) settles the current round (cancelled, with its result.json), writes
    the report of the rounds run, marked interrupted, and exits 130 (143).

    \b
    Exit codes:
      0    every invariant held and every requested kind was applied
      1    an invariant was violated, or a requested kind was never applied
      2    bad input (an unknown or unplayable fault kind, a rate or duration <= 0, a Ray
           kind without --backend ray, a scripted kind or control-kill with it, --backend ray
           without Ray)
      130  interrupted by Ctrl-C (SIGINT); the report is written, marked interrupted
      143  interrupted by SIGTERM, likewise
    """
    try:
        kinds = parse_faults(faults, scripted=scenario is None)
        fault_schedule(seed, rate, kinds, duration)
    except BadFaults as e:
        raise click.UsageError(str(e)) from None
    check_backend(backend, ray_address, placement)
    ray_kinds = [k for k in kinds if k in RAY]
    if ray_kinds and backend != "ray":
        raise click.UsageError(f"{', '.join(ray_kinds)} needs --backend ray")
    if backend == "ray" and any(k in CONTROL + SCRIPTED for k in kinds):
        raise click.UsageError(
            "with --backend ray a drill applies the live kinds only: control-kill runs its "
            "round in a child process on this machine, and the scripted kinds need the fault "
            "switch, which does not reach a Ray host's shell (name the kinds with --faults)"
        )
    drill_dir = SessionDir.at(session_dir) if session_dir else SessionDir.new()
    try:
        lock = drill_dir.claim()  # a live run or drill there is never written into
    except SessionLive as e:
        raise Refused(str(e)) from None
    click.get_current_context().call_on_close(lock.release)
    root = drill_dir.root
    cfg = DrillConfig(
        seed,
        rate,
        kinds,
        duration,
        agents,
        calls,
        call_ms,
        str(Path(scenario).resolve()) if scenario else None,
        root.resolve(),
        durability,
        make_backend(backend, ray_address, placement),
    )
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    ) as progress:
        task = progress.add_task("drill", total=duration)

        def tick(rnd: int, elapsed: float, n: int) -> None:
            progress.update(
                task,
                completed=min(elapsed, duration),
                description=f"round {rnd + 1}, {n} faults applied",
            )

        try:
            with DrillStop().installed() as stop:
                result = run_drill(cfg, on_progress=tick, stop=stop)
        finally:
            if cfg.hosts is not None:
                cfg.hosts.close()
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=120)  # a file or a pipe: the fault table's 9 columns fit whole
        out.print(summary_table(result))
        for line in _why_lines(result):
            out.print(line, markup=False, highlight=False)
        out.print(invariant_table(result))
        fig = result.figures()
        out.print(
            f"recovery: {fig['recovered']} measured, median {fig['medianSecs']} s, "
            f"worst {fig['worstSecs']} s"
        )
        out.print(f"drill: {cfg.root}  ({len(result.rounds)} rounds)")
        for line in _verdict(result):
            out.print(line)
    sys.exit(result.exit_code)


def _why_lines(result: DrillResult) -> list[str]:
    """One line per reason a kind's faults missed or were never applied."""
    return [
        f"{kind}: {n} {reason}"
        for kind, row in result.by_kind().items()
        for reason, n in row["why"].items()
    ]


def _verdict(result: DrillResult) -> list[str]:
    lines = []
    if result.interrupted is not None:
        name = signal.Signals(result.interrupted).name
        lines.append(
            f"[yellow]interrupted by {name}[/]: the current round was settled; "
            f"the report covers {len(result.rounds)} round(s)"
        )
    if result.violated:
        lines.append(f"[bold red]{result.violated} invariant violation(s)[/]")
    else:
        lines.append("[green]all invariants held[/]")
    if result.never_applied:
        lines.append(
            "[bold red]requested fault kind(s) never applied: "
            + ", ".join(result.never_applied)
            + "[/]"
        )
    return lines
