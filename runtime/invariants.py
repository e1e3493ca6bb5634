"""The invariant checker: what a finished session directory must prove, whatever failed.

Pure: it reads the session's files (and, for the process invariant, the process table) and
returns an :class:`InvariantReport`; it never writes. ``exarch-actors check`` and every drill
call :func:`check_session`. Each invariant is *held*, *violated* or *skipped* (not applicable,
e.g. the process check turned off), with the number of items it checked and the details of each
violation:

- ``settled`` — every spawned node has exactly one terminal journal record, the replayed
  journal's ``neverSettled`` is 0, and ``result.json``'s fleet yield agrees with the replay.
- ``committed`` — every binding a completed call committed (a ``Commit`` record in
  ``record.jsonl``, written by the fleet after each clean call) is in that agent's final
  ``snapshot.msgpack``, unless a later ``Prune`` record names it or a later ``/clear`` of that
  agent explains it. A rollback explains nothing: it restores the durable snapshot, which holds
  every committed binding.
- ``rejections`` — no result vanished: each dispatched child's result is in its parent's event
  log (a user event with source ``agent_result``, any generation) or in ``transcript.jsonl`` as
  ``InboxRejected``. A child never dispatched never ran: its parent's ``agent`` call failed
  instead (``spawn failed: ...``), so there is no result to find.
- ``registry-empty`` — every ``Born`` on the bus has its ``Died`` (per agent, per incarnation).
- ``no-leftover-processes`` — no pid the run named (journal environment records, ``Commit``
  records) still runs: matched with ``psutil`` *and* its create time, so a reused pid is not
  blamed.
- ``files-parse`` — every JSON-lines file reads; a torn last line is reported, not a violation
  (the expected shape of a crash mid-append), and so is a ``.torn`` side file (a torn tail the
  next append set aside); a corrupt inner line, a record without the shape its readers rely
  on, an unreadable ``result.json``/``run.json`` or a refused snapshot is a violation (a corrupt
  ``result.json`` is ``settled``'s too, with what to do: resume rebuilds it).

What the files can prove depends on the run's durability policy (``run.json``'s
``durability``, absent: ``process``; :mod:`runtime.durability`), and the report names it.
Both policies promise that an acknowledged record survives the death of any process, so every
invariant above holds after a SIGKILL of the control process, a shell or a worker, under either
(the drills' ``control-kill`` proves it for both); a torn last line is, under both, a record
that was never acknowledged. Only ``machine`` also promises survival of a kernel crash or a
power loss. No drill simulates one (nothing short of the kernel losing its page cache can), so
under ``process`` nothing changes in what is checked: a power loss there may lose acknowledged
records, and a session that went through one is outside what ``process`` promised.

Times compared between files are the ISO ``"at"`` stamps (millisecond resolution). "Later" is
``>=``: two facts of one agent in the same millisecond are written by one thread in order, so
the tie can only hide a violation, never invent one.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from runtime.durability import DEFAULT as DEFAULT_DURABILITY
from runtime.durability import PROMISES, Durability
from runtime.durability import parse as parse_durability
from runtime.durable import TORN_SUFFIX, Shape, read_jsonl
from runtime.errors import ExarchError, SnapshotRefused
from runtime.eventlog import EVENT_SHAPE
from runtime.fleet_yield import read_result
from runtime.journal import JOURNAL_NAME, replay
from runtime.session_dir import RECORD_SHAPE, TRANSCRIPT_SHAPE, born_children
from runtime.session_read import ResumeRefused, read_run
from runtime.snapshot import MobileSnapshot

Status = Literal["held", "violated", "skipped"]

PID_START_TOLERANCE = 1.0
"""Seconds between a recorded and a live create time that still count as the same process
(``pidStartedAt`` is rounded to 10 ms; psutil reports boot-relative clock ticks)."""

_DETAIL_CAP = 50


class NotASession(ExarchError):
    """The path is not a session directory (no journal, transcript or agents directory)."""


# --------------------------------------------------------------------------- the Commit record


def commit_record(agent: str, result: Any, pid: int | None) -> dict[str, Any]:
    """The ``Commit`` forensic record of one clean ral call (``result`` is the shell's
    ToolResult: ``.epoch``, ``.defined``), with the shell pid that ran it and that pid's create
    time, so the process invariant can find it later without blaming a reused pid."""
    started: float | None = None
    if pid:
        try:
            started = round(psutil.Process(pid).create_time(), 2)
        except psutil.Error:
            started = None
    return {
        "kind": "Commit",
        "agent": agent,
        "epoch": int(getattr(result, "epoch", 0)),
        "defined": sorted(set(getattr(result, "defined", ()) or ())),
        "pid": pid,
        "pidStartedAt": started,
    }


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class InvariantResult:
    name: str
    status: Status
    checked: int
    details: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "checked": self.checked,
            "details": list(self.details),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class InvariantReport:
    session: str
    results: tuple[InvariantResult, ...]
    durability: Durability = DEFAULT_DURABILITY
    """The run's policy (``run.json``): what an acknowledged record was promised to survive."""

    @property
    def ok(self) -> bool:
        return not self.violated

    @property
    def violated(self) -> list[InvariantResult]:
        return [r for r in self.results if r.status == "violated"]

    @property
    def held(self) -> list[InvariantResult]:
        return [r for r in self.results if r.status == "held"]

    def get(self, name: str) -> InvariantResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "ok": self.ok,
            "durability": self.durability.value,
            "promise": PROMISES[self.durability],
            "checked": sum(1 for r in self.results if r.status != "skipped"),
            "held": len(self.held),
            "violated": len(self.violated),
            "invariants": [r.to_json() for r in self.results],
        }


def _result(name: str, checked: int, bad: list[str], notes: Iterable[str] = ()) -> InvariantResult:
    shown = bad[:_DETAIL_CAP] + (
        [f"... and {len(bad) - _DETAIL_CAP} more"] if len(bad) > _DETAIL_CAP else []
    )
    return InvariantResult(name, "violated" if bad else "held", checked, tuple(shown), tuple(notes))


# --------------------------------------------------------------------------- reading


@dataclass
class _Session:
    root: Path
    damage: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    cache: dict[Path, list[dict[str, Any]]] = field(default_factory=dict)

    def jsonl(self, path: Path) -> list[dict[str, Any]]:
        """The records of ``path`` that have the shape their readers rely on; the rest is
        reported (a torn last line as a note, anything else as damage)."""
        if path not in self.cache:
            read = read_jsonl(path, _shape_of(path))
            rel = path.relative_to(self.root)
            for d in read.damage:
                if d.torn_tail:
                    self.torn.append(f"{rel}:{d.line}: torn last line ({len(d.text)} B) skipped")
                else:
                    self.damage.append(d.where(str(rel)))
            self.cache[path] = read.records
        return self.cache[path]

    @property
    def transcript(self) -> list[dict[str, Any]]:
        return self.jsonl(self.root / "transcript.jsonl")

    @property
    def record(self) -> list[dict[str, Any]]:
        return self.jsonl(self.root / "record.jsonl")

    def agent_names(self) -> list[str]:
        agents = self.root / "agents"
        return sorted(p.name for p in agents.iterdir() if p.is_dir()) if agents.is_dir() else []

    def event_logs(self, agent: str) -> list[Path]:
        """Every generation of ``agent``'s event log (archives from /clear, then the current)."""
        d = self.root / "agents" / agent
        if not d.is_dir():
            return []
        return sorted(d.glob("events*.jsonl"))

    def events(self, agent: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in self.event_logs(agent):
            out.extend(self.jsonl(p))
        return out


def _shape_of(path: Path) -> Shape | None:
    if path.name == "transcript.jsonl":
        return TRANSCRIPT_SHAPE
    if path.name == "record.jsonl":
        return RECORD_SHAPE
    if path.name.startswith("events") and path.parent.parent.name == "agents":
        return EVENT_SHAPE
    return None  # the journal: its fold is the stricter reader (see _check_settled)


def _by_kind(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == kind]


def _at(r: dict[str, Any]) -> str:
    return str(r.get("at") or "")


# --------------------------------------------------------------------------- the invariants


def _check_settled(s: _Session) -> InvariantResult:
    path = s.root / JOURNAL_NAME
    rep = replay(path, strict=False)
    bad = rep.inconsistencies()  # unreadable lines are files-parse's
    terminal_count: Counter[str] = Counter()
    for r in rep.records:
        if r["kind"] == "cancelled" or (
            r["kind"] == "settled" and r.get("retainedExecution") != "pending"
        ):
            terminal_count[r["id"]] += 1
    for nid, node in rep.state.nodes.items():
        if node.open:
            bad.append(f"{nid}: no terminal record (neverSettled)")
        elif terminal_count[nid] != 1:
            bad.append(f"{nid}: {terminal_count[nid]} terminal records")
    born = born_children(s.transcript)
    lost = sorted(born - set(rep.state.nodes))
    if lost:
        state = "missing" if not path.exists() else "empty" if not rep.records else "incomplete"
        bad.append(
            f"{JOURNAL_NAME} is {state}: transcript.jsonl records {len(lost)} Born child(ren) "
            f"it never spawned ({', '.join(lost[:5])}); their settlement is lost"
        )
    result, problem = read_result(s.root)
    notes: list[str] = [f"{len(born)} Born children, all in the journal"] if not lost else []
    resume = f"`exarch-actors resume {s.root}`"
    if problem is not None:
        bad.append(
            f"corrupt result.json at {s.root / 'result.json'}: {problem}; {resume} sets it "
            "aside and rebuilds it from the journal and the transcript"
        )
    elif result is None:
        bad.append(f"result.json is missing: the run never finished ({resume} finishes it)")
    else:
        fy = result["fleetYield"]
        if fy.get("neverSettled") != 0:
            bad.append(f"result.json fleetYield.neverSettled = {fy.get('neverSettled')!r}")
        if fy.get("spawned") != len(rep.state.nodes):
            bad.append(
                f"result.json spawned {fy.get('spawned')!r} != journal {len(rep.state.nodes)}"
            )
        notes.append(f"outcome {result.get('outcome')!r}")
    return _result("settled", len(rep.state.nodes), bad, notes)


def _snapshot_names(s: _Session, agent: str) -> frozenset[str] | None:
    p = s.root / "agents" / agent / "snapshot.msgpack"
    try:
        return MobileSnapshot.load(p).names()
    except SnapshotRefused:
        return None


def _clears(s: _Session) -> dict[str, list[str]]:
    """When each agent was cleared: ``Cleared`` notices and ``cleared`` log markers."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in _by_kind(s.transcript, "Notice"):
        if r.get("notice") == "Cleared":
            out[str(r.get("agent"))].append(_at(r))
    for agent in s.agent_names():
        for r in _by_kind(s.events(agent), "cleared"):
            out[agent].append(_at(r))
    return out


def _check_committed(s: _Session) -> InvariantResult:
    commits = _by_kind(s.record, "Commit")
    prunes: dict[str, list[tuple[int, set[str]]]] = defaultdict(list)
    for r in _by_kind(s.record, "Prune"):
        prunes[str(r.get("agent"))].append((int(r.get("epoch") or 0), set(r.get("names") or ())))
    clears = _clears(s)
    # A final snapshot write the runtime could not make (and said so) explains what the file
    # lacks: the loss was reported, not silent. Nothing else does.
    unwritable = {
        str(r.get("agent"))
        for r in _by_kind(s.transcript, "Notice")
        if r.get("notice") == "SnapshotWriteFailed"
        and str(r.get("text", "")).startswith("final snapshot write failed")
    }
    crashed_behind = _behind_at_control_death(s, commits)
    reported = 0
    snaps: dict[str, frozenset[str] | None] = {}
    bad: list[str] = []
    checked = 0
    explained = 0
    for c in commits:
        agent = str(c.get("agent"))
        if agent not in snaps:
            snaps[agent] = _snapshot_names(s, agent)
        names = snaps[agent]
        epoch = int(c.get("epoch") or 0)
        for name in c.get("defined") or ():
            checked += 1
            if names is not None and name in names:
                continue
            if any(pe >= epoch and name in pn for pe, pn in prunes[agent]):
                explained += 1
                continue
            if any(at >= _at(c) for at in clears.get(agent, ())):
                explained += 1
                continue
            if agent in unwritable or id(c) in crashed_behind:
                reported += 1
                continue
            why = "no readable snapshot" if names is None else "missing from the final snapshot"
            bad.append(f"{agent}: {name!r} committed at epoch {epoch}: {why}")
    notes = [f"{len(commits)} commits, {explained} bindings explained by Prune or /clear"]
    if reported:
        notes.append(
            f"{reported} bindings not in the file: its final write failed, or its write "
            "failed and the control process died before a retry; reported"
        )
    return _result("committed", checked, bad, notes)


CONTROL_DIED = "control process died"
"""The ``Died`` cause resume records for an incarnation that died with the control process."""


def _behind_at_control_death(s: _Session, commits: list[dict[str, Any]]) -> set[int]:
    """Commits (by ``id``) whose snapshot file was still behind when the control process died.

    A refused snapshot write is reported (a ``SnapshotWriteFailed`` Notice with the call's
    epoch) and retried at the agent's next checkpoint, or at close. When the control process
    is killed first, neither happens: the loss was reported at the time, not silent, just as a
    failed final write is. Exact: a commit counts only if its own epoch's write failed (in its
    incarnation), its incarnation then died with the control process (a ``Died`` with cause
    :data:`CONTROL_DIED`), and every later commit of that incarnation failed its write too, so
    no write after it reached the file."""
    failures = [
        (str(r.get("agent")), (r.get("data") or {}).get("epoch"), _at(r))
        for r in _by_kind(s.transcript, "Notice")
        if r.get("notice") == "SnapshotWriteFailed"
    ]
    spans: list[tuple[str, str, str]] = []  # (agent, born, died with the control process)
    born: dict[str, str] = {}
    for r in s.transcript:
        agent = str(r.get("agent"))
        if r.get("kind") == "Born":
            born[agent] = _at(r)
        elif r.get("kind") == "Died" and r.get("cause") == CONTROL_DIED:
            spans.append((agent, born.pop(agent, ""), _at(r)))
    out: set[int] = set()
    for agent, start, died in spans:
        failed = {e for a, e, at in failures if a == agent and start <= at <= died}
        mine = [c for c in commits if str(c.get("agent")) == agent and start <= _at(c) <= died]
        for c in reversed(mine):  # the commits after the file's last successful write
            if c.get("epoch") not in failed:
                break
            out.add(id(c))
    return out


def _result_logged(s: _Session, parent: str, child: str) -> bool:
    head = f"[agent {child} finished"
    return any(
        r.get("kind") == "user"
        and r.get("source") == "agent_result"
        and str(r.get("text", "")).startswith(head)
        for r in s.events(parent)
    )


def _check_rejections(s: _Session) -> InvariantResult:
    rep = replay(s.root / JOURNAL_NAME, strict=False)
    rejected: set[tuple[str, str]] = set()
    rejected_count = 0
    for r in _by_kind(s.transcript, "InboxRejected"):
        rejected_count += 1
        msg = r.get("message") or {}
        child = msg.get("child") if isinstance(msg, dict) else None
        if child is not None:
            rejected.add((str(r.get("agent")), str(child)))
    bad: list[str] = []
    checked = 0
    for nid, node in rep.state.nodes.items():
        parent = node.spawned.get("parent")
        if node.open or not isinstance(parent, str) or "dispatched" not in node.phases:
            continue  # never dispatched: the parent's spawn call failed, it had no result
        checked += 1
        if (parent, nid) in rejected or _result_logged(s, parent, nid):
            continue
        bad.append(f"{nid}: its result is neither in {parent}'s event log nor InboxRejected")
    bad += [
        f"InboxRejected at {_at(r)} for {r.get('agent')} carries no message"
        for r in _by_kind(s.transcript, "InboxRejected")
        if not r.get("message")
    ]
    return _result("rejections", checked, bad, [f"{rejected_count} InboxRejected records"])


def _check_registry_empty(s: _Session) -> InvariantResult:
    born: Counter[str] = Counter(str(r.get("agent")) for r in _by_kind(s.transcript, "Born"))
    died: Counter[str] = Counter(str(r.get("agent")) for r in _by_kind(s.transcript, "Died"))
    bad = [
        f"{a}: {born[a]} Born, {died[a]} Died"
        for a in sorted(set(born) | set(died))
        if born[a] != died[a]
    ]
    return _result("registry-empty", sum(born.values()), bad)


@dataclass(frozen=True)
class RunProcess:
    """A process the run named: who, its pid, and its recorded create time (None: unknown)."""

    owner: str
    pid: int
    started_at: float | None


def run_processes(session_dir: str | os.PathLike[str]) -> list[RunProcess]:
    """Every process a session names (journal environments, Commit records), deduplicated."""
    s = _Session(Path(session_dir))
    out: dict[tuple[int, float | None], RunProcess] = {}
    for r in read_jsonl(s.root / JOURNAL_NAME).records:
        if r.get("kind") == "execution-admitted" and isinstance(r.get("pid"), int):
            st = r.get("pidStartedAt")
            key = (r["pid"], st if isinstance(st, int | float) else None)
            out.setdefault(key, RunProcess(f"{r.get('id')} (journal)", key[0], key[1]))
    for r in _by_kind(s.record, "Commit"):
        if isinstance(r.get("pid"), int):
            st = r.get("pidStartedAt")
            key = (r["pid"], st if isinstance(st, int | float) else None)
            out.setdefault(key, RunProcess(f"{r.get('agent')} (shell)", key[0], key[1]))
    return list(out.values())


def still_running(proc: RunProcess) -> bool:
    """Whether ``proc`` is still on the machine (a zombie is not; a reused pid is not)."""
    try:
        p = psutil.Process(proc.pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if proc.started_at is None:
            return False  # unverifiable: never blame a pid whose start time was not recorded
        return abs(p.create_time() - proc.started_at) <= PID_START_TOLERANCE
    except psutil.Error:
        return False


def leftover_processes(session_dir: str | os.PathLike[str]) -> list[RunProcess]:
    return [p for p in run_processes(session_dir) if still_running(p)]


def _check_processes(s: _Session) -> InvariantResult:
    procs = run_processes(s.root)
    bad = [f"{p.owner}: pid {p.pid} still running" for p in procs if still_running(p)]
    unverifiable = sum(1 for p in procs if p.started_at is None)
    notes = [f"{unverifiable} pids without a recorded start time"] if unverifiable else []
    return _result("no-leftover-processes", len(procs), bad, notes)


def _check_files(s: _Session) -> InvariantResult:
    files = [s.root / "transcript.jsonl", s.root / "record.jsonl", s.root / JOURNAL_NAME]
    for agent in s.agent_names():
        files += s.event_logs(agent)
    for f in files:
        s.jsonl(f)
    checked = len(files)
    bad = list(s.damage)
    if (s.root / "result.json").exists():
        checked += 1
        problem = read_result(s.root)[1]
        if problem is not None:
            bad.append(f"result.json: {problem}")
    if (s.root / "run.json").exists():
        checked += 1
        try:
            read_run(s.root)
        except ResumeRefused as e:
            bad.append(f"run.json: {e}")
    for agent in s.agent_names():
        p = s.root / "agents" / agent / "snapshot.msgpack"
        if p.exists():
            checked += 1
            try:
                MobileSnapshot.load(p)
            except SnapshotRefused as e:
                bad.append(f"agents/{agent}/snapshot.msgpack: {e}")
    aside = [*s.root.glob("*" + TORN_SUFFIX), *s.root.glob(f"agents/*/*{TORN_SUFFIX}")]
    notes = list(s.torn) + [
        f"{p.relative_to(s.root)}: {len(read_jsonl(p).records)} torn tail(s) of a crash "
        "mid-append, set aside by the next append (bytes kept)"
        for p in sorted(aside)
    ]
    return _result("files-parse", checked, bad, notes)


def check_session(
    session_dir: str | os.PathLike[str], *, processes: bool = True, live: bool = False
) -> InvariantReport:
    """Check every invariant of a finished session directory (see the module docstring).

    ``live``: the run is still going, so only what must hold at every instant is checked
    (committed bindings, files); the end-of-run invariants are skipped."""
    root = Path(session_dir)
    if not root.is_dir() or not any(
        (root / n).exists() for n in ("transcript.jsonl", JOURNAL_NAME, "agents", "run.json")
    ):
        raise NotASession(f"{root} is not a session directory (no transcript, journal or agents)")
    s = _Session(root)

    def skip(name: str, why: str) -> InvariantResult:
        return InvariantResult(name, "skipped", 0, (), (why,))

    results = [
        skip("settled", "run still live") if live else _check_settled(s),
        _check_committed(s),
        skip("rejections", "results may still be queued") if live else _check_rejections(s),
        skip("registry-empty", "run still live") if live else _check_registry_empty(s),
        _check_processes(s)
        if processes and not live
        else skip("no-leftover-processes", "run still live" if live else "turned off"),
    ]
    results.append(_check_files(s))  # last: every file the others read is in its cache
    return InvariantReport(str(root), tuple(results), _durability_of(root))


def _durability_of(root: Path) -> Durability:
    """The run's policy; ``process`` when ``run.json`` does not say (or cannot: files-parse
    reports a damaged one)."""
    try:
        run = read_run(root)
    except ResumeRefused:
        return DEFAULT_DURABILITY
    return parse_durability(run.get("durability"))
