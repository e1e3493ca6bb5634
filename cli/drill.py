"""``exarch-actors drill``: break a live fleet on purpose, then prove nothing was lost.

A drill runs *rounds* until ``--duration`` has passed: each round is one fleet run (a synthetic
fan-out from ``--agents/--calls``, or the given scenario) in its own session directory
``<drill dir>/round-NNN/``. The seeded nemesis (``runtime/nemesis.py``) fixes the whole fault
schedule up front; the drill delivers each fault when its time comes:

- scripted faults are written into the next round's scenario before it starts;
- live faults are applied to the running fleet from this thread (SIGKILL of a shell, an inbox
  flood, cancel and clear storms, a snapshot write failure);
- ``control-kill`` runs that round in a child process (``exarch-actors run``), SIGKILLs it, and
  finishes it with ``exarch-actors resume``.

Live faults are applied, recorded and measured by ``cli/drill_faults.py``.

After every round ``runtime/invariants.py`` checks the round's directory; the drill adds two
checks of its own (a flood's accounting, and no stray child process of the drill). Recovery is
measured from each fault to the affected agent's next successful ral call (``Io`` without error
in the transcript). ``drill-report.json`` in the drill directory holds the schedule, what was
applied, every round's invariants and the figures; the exit code is 1 if any invariant was
violated, 2 on bad input.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psutil
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.drill_faults import (
    FLOOD,
    WRITE_FAILURE_SECS,
    Applied,
    LiveNemesis,
    measure_recovery,
    ok_calls,
    round_times,
)
from runtime.durable import atomic_write_bytes, read_jsonl
from runtime.invariants import InvariantReport, InvariantResult, NotASession, check_session
from runtime.nemesis import (
    CONTROL,
    LIVE,
    SCRIPTED,
    BadFaults,
    Fault,
    Placed,
    estimated_round_secs,
    fault_schedule,
    parse_faults,
    place_scripted,
    synthetic_scenario,
)
from runtime.session_dir import SessionDir

__all__ = [
    "FLOOD",
    "WRITE_FAILURE_SECS",
    "Applied",
    "DrillConfig",
    "DrillResult",
    "drill_command",
    "run_drill",
]


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


@dataclass
class DrillResult:
    config: DrillConfig
    schedule: tuple[Fault, ...]
    applied: list[Applied]
    rounds: list[dict[str, Any]]
    reports: list[InvariantReport]
    extra: list[InvariantResult]
    skipped: list[Fault]

    @property
    def violated(self) -> int:
        return sum(len(r.violated) for r in self.reports) + sum(
            1 for e in self.extra if e.status == "violated"
        )

    @property
    def ok(self) -> bool:
        return self.violated == 0

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
            "ok": self.ok,
            "schedule": [f.to_json() for f in self.schedule],
            "applied": [a.to_json() for a in self.applied],
            "notApplied": [f.to_json() for f in self.skipped],
            "injectedByKind": dict(Counter(a.fault.kind for a in self.applied)),
            "rounds": self.rounds,
            "drillChecks": [e.to_json() for e in self.extra],
            "invariants": {"checked": checked, "held": held, "violated": self.violated},
            "recovery": self.figures(),
        }


# --------------------------------------------------------------------------- rounds


def _exarch(*args: str) -> list[str]:
    return [sys.executable, "-c", "from cli.main import main; main()", *args]


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    pp = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "EXARCH_FAULTS": "1",
        "PYTHONPATH": root + (os.pathsep + pp if pp else ""),
    }


def _run_in_process(
    scenario: Path, session: Path, live: list[Fault], start: float, rnd: int, applied: list[Applied]
) -> dict[str, Any]:
    from cli.runner import RunSpec, run_headless
    from runtime.providers.scenario import load_scenario

    holder: dict[str, Any] = {}
    ready = threading.Event()

    def on_start(fleet: Any) -> None:
        holder["fleet"] = fleet
        ready.set()

    def target() -> None:
        try:
            holder["result"] = run_headless(
                RunSpec(
                    provider="scripted",
                    prompt=None,
                    scenario=load_scenario(scenario),
                    session_dir=str(session),
                ),
                on_start=on_start,
            )
        except BaseException as e:  # reported as a finding, never swallowed
            holder["error"] = f"{type(e).__name__}: {e}"
        finally:
            ready.set()

    th = threading.Thread(target=target, name=f"drill-round-{rnd}")
    th.start()
    ready.wait(30)
    fleet = holder.get("fleet")
    nem = LiveNemesis(fleet, rnd) if fleet is not None else None
    while th.is_alive():
        now = time.monotonic() - start
        while nem is not None and live and live[0].at <= now and th.is_alive():
            got = nem.apply(live[0])
            if got is None:
                break  # nothing live to hit yet: keep it for later
            applied.append(got)
            live.pop(0)
        th.join(0.01)
    th.join()
    res = holder.get("result")
    return {
        "mode": "in-process",
        "outcome": res.outcome if res is not None else None,
        "error": holder.get("error"),
    }


def _io_count(session: Path) -> int:
    return sum(1 for r in read_jsonl(session / "transcript.jsonl").records if r.get("kind") == "Io")


def _run_killed_and_resumed(
    scenario: Path, session: Path, f: Fault, total_calls: int, rnd: int, applied: list[Applied]
) -> dict[str, Any]:
    """Run the round in a child process, SIGKILL it once ``f.param`` picks how far in (after
    the k-th ral call on the bus, so the kill lands mid-run whatever the machine's speed),
    then ``exarch-actors resume`` it."""
    threshold = 1 + f.param % max(1, total_calls)
    proc = subprocess.Popen(
        _exarch("run", str(scenario), "--session-dir", str(session)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
    )
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if _io_count(session) >= threshold:
            break
        time.sleep(0.005)
    killed = proc.poll() is None and not (session / "result.json").exists()
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    rc = proc.wait()
    a = Applied(
        f,
        rnd,
        None,
        time.time(),
        {"killAfterCalls": threshold, "runExit": rc, "callsBeforeKill": _io_count(session)},
    )
    resumed = None
    if killed:
        r = subprocess.run(
            _exarch("resume", str(session)), capture_output=True, text=True, env=_env(), timeout=120
        )
        resumed = r.returncode
        a.detail["resumeExit"] = resumed
        if r.returncode not in (0, 1):
            a.detail["resumeStderr"] = r.stderr[-2000:]
        later = [t for ts in ok_calls(session).values() for t in ts if t > a.wall]
        if later:
            a.recovery = min(later) - a.wall
            a.outcome = "recovered (resume)"
        else:
            a.outcome = "resumed; no later successful call"
    else:
        a.outcome = "round ended before the kill"
    applied.append(a)
    return {
        "mode": "killed+resumed" if killed else "subprocess",
        "runExit": rc,
        "resumeExit": resumed,
    }


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


def run_drill(cfg: DrillConfig, *, on_progress: Any = None) -> DrillResult:
    """Run the drill (see the module docstring)."""
    os.environ["EXARCH_FAULTS"] = "1"
    cfg.root.mkdir(parents=True, exist_ok=True)
    schedule = fault_schedule(cfg.seed, cfg.rate, cfg.faults, cfg.duration)
    scripted = [f for f in schedule if f.kind in SCRIPTED]
    live = [f for f in schedule if f.kind in LIVE]
    control = [f for f in schedule if f.kind in CONTROL]
    skipped: list[Fault] = []
    applied: list[Applied] = []
    rounds: list[dict[str, Any]] = []
    reports: list[InvariantReport] = []
    extra: list[InvariantResult] = []
    est = estimated_round_secs(cfg.calls, cfg.call_ms)
    start = time.monotonic()
    rnd = 0
    while rnd == 0 or time.monotonic() - start < cfg.duration:
        t0 = time.monotonic() - start
        window = t0 + est
        mine = [f for f in scripted if f.at < window]
        scripted = [f for f in scripted if f.at >= window]
        session = cfg.root / f"round-{rnd:03d}"
        scenario_path = cfg.root / f"round-{rnd:03d}.toml"
        placed: list[Placed] = []
        if cfg.scenario is not None:
            skipped += mine  # a given scenario is played as written
            scenario_path.write_bytes(Path(cfg.scenario).read_bytes())
        else:
            placed = place_scripted(mine, cfg.agents, cfg.calls)
            scenario_path.write_text(
                synthetic_scenario(cfg.agents, cfg.calls, call_ms=cfg.call_ms, placed=placed)
            )
        kill = next((f for f in control if f.at < window), None)
        before = len(applied)
        if kill is not None:
            control.remove(kill)
            info = _run_killed_and_resumed(
                scenario_path, session, kill, cfg.agents * cfg.calls, rnd, applied
            )
        else:
            info = _run_in_process(scenario_path, session, live, start, rnd, applied)
        wall_start = time.time() - (time.monotonic() - start - t0)
        for p in placed:
            agent = f"worker-{p.child}"
            times = round_times(session, agent)
            n = _script_index(p, placed, cfg.calls)
            at = times[n] if n < len(times) else None
            applied.append(
                Applied(
                    p.fault,
                    rnd,
                    agent,
                    at if at is not None else wall_start,
                    {"beforeCall": p.call, "scriptIndex": n, "played": at is not None},
                )
            )
            if at is None:
                applied[-1].outcome = "not reached (agent ended first)"
        measure_recovery(applied[before:], session)
        for a in applied[before:]:
            if a.fault.kind == "inbox-flood" and "accepted" in a.detail:
                d = a.detail
                bad = d["accepted"] + d["rejected"] != d["sent"]
                extra.append(
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
        try:
            report = check_session(session)
        except NotASession as e:
            # A round that left no session directory lost everything it was given: a
            # violation to report, never a reason for the drill itself to crash.
            report = InvariantReport(
                str(session),
                (InvariantResult("session-written", "violated", 1, (str(e),)),),
            )
        reports.append(report)
        rounds.append({"round": rnd, "dir": str(session), **info, "invariants": report.to_json()})
        if on_progress is not None:
            on_progress(rnd, time.monotonic() - start, len(applied))
        rnd += 1
    skipped += live + scripted + control
    stray = _wait_no_strays()
    extra.append(
        InvariantResult(
            "no-stray-children",
            "violated" if stray else "held",
            1,
            tuple(f"pid {p} still running" for p in stray),
        )
    )
    result = DrillResult(cfg, schedule, applied, rounds, reports, extra, skipped)
    atomic_write_bytes(
        cfg.root / "drill-report.json", (json.dumps(result.to_json(), indent=2) + "\n").encode()
    )
    return result


def _wait_no_strays(timeout: float = 3.0) -> list[int]:
    deadline = time.monotonic() + timeout
    stray = _stray_children()
    while stray and time.monotonic() < deadline:
        time.sleep(0.05)
        stray = _stray_children()
    return stray


def _script_index(p: Placed, placed: list[Placed], calls: int) -> int:
    """Position of ``p``'s message in its child's script (faults before call k, then call k)."""
    mine = sorted((q for q in placed if q.child == p.child), key=lambda q: (q.call, q.fault.seq))
    n = 0
    for k in range(calls):
        for q in (q for q in mine if q.call == k):
            if q is p:
                return n
            n += 1 + (q.fault.param % 3 if q.fault.kind == "rate-limit" else 0)
        n += 1
    return n


# --------------------------------------------------------------------------- the command


def summary_table(result: DrillResult) -> Table:
    t = Table(title=f"drill seed {result.config.seed}: faults and recovery")
    for col in ("fault", "scheduled", "injected", "recovered", "median s", "worst s"):
        t.add_column(col, justify="left" if col == "fault" else "right")
    sched = Counter(f.kind for f in result.schedule)
    inj = Counter(a.fault.kind for a in result.applied)
    figs = result.figures()["byKind"]
    for kind in sorted(set(sched) | set(inj)):
        f = figs.get(kind, {})
        t.add_row(
            kind,
            str(sched[kind]),
            str(inj[kind]),
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


@click.command("drill")
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
    help="Comma-separated kinds: " + ", ".join(SCRIPTED + LIVE + CONTROL),
)
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds.")
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the drill.")
@click.option("--json", "as_json", is_flag=True, help="Print drill-report.json instead of tables.")
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
) -> None:
    """Run fleets for --duration seconds while a seeded nemesis injects faults; check the
    invariants after each round. Each round plays SCENARIO if given (as written: only live
    faults hit it), else a synthetic fan-out of --agents children with --calls ral calls each.
    Rounds and drill-report.json go to --session-dir (default .exarch/sessions/<id>/).

    \b
    Exit codes:
      0    every invariant held in every round
      1    an invariant was violated (the tables say which round)
      2    bad input: an unknown fault kind, a bad flag, an unreadable SCENARIO
    """
    try:
        kinds = parse_faults(faults)
        fault_schedule(seed, rate, kinds, duration)
    except BadFaults as e:
        raise click.UsageError(str(e)) from None
    root = Path(session_dir) if session_dir else SessionDir.new().root
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
                description=f"round {rnd + 1}, {n} faults injected",
            )

        result = run_drill(cfg, on_progress=tick)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        out = Console()
        out.print(summary_table(result))
        out.print(invariant_table(result))
        fig = result.figures()
        out.print(
            f"recovery: {fig['recovered']} measured, median {fig['medianSecs']} s, "
            f"worst {fig['worstSecs']} s"
        )
        out.print(f"drill: {cfg.root}  ({len(result.rounds)} rounds)")
        out.print(
            "[green]all invariants held[/]"
            if result.ok
            else f"[bold red]{result.violated} invariant violation(s)[/]"
        )
    sys.exit(0 if result.ok else 1)
