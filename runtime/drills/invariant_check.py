"""The invariant checker: what a finished session directory must prove, whatever failed.

Only ``check``, the drills and the tests use it; no run does. Pure: it reads the session's files
(through ``runtime/drills/session_logs.py``; for the process invariant, the process table through
``runtime/state/run_processes.py``) and
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
  log (a user event with source ``agent_result``, any generation), in ``transcript.jsonl`` as
  ``InboxRejected`` (a refused reply stays readable: ``agent-result``), or named by a
  ``Collected`` notice (returned by ``agent-wait`` or read by ``agent-result``, never
  delivered as a turn). A child never dispatched never ran: its parent's ``agent`` call failed
  instead (``spawn failed: ...``), so there is no result to find. Nor did a message: each agent
  ``message`` recorded sent (``MessageSent``, written before its sender's call returned) is in
  a log of its recipient (a ``user`` event with its ``messageId``, any generation) or recorded
  ``InboxRejected`` (the message, its id with it), even when the control process died before
  the recipient logged it (``resume`` delivers it again).
- ``registry-empty`` — every ``Born`` on the bus has its ``Died`` (per agent, per incarnation),
  and a child whose end the spawn journal recorded (its execution result) died with that
  outcome: one terminal story, even when the control process died between the settlement and
  the ``Died`` (``resume`` writes the ``Died`` from the journal).
- ``no-leftover-processes`` — no pid the run named (journal environment records, ``Commit``
  records) still runs: matched with ``psutil`` *and* its create time, so a reused pid is not
  blamed. Looked for on this machine, or on every node of a Ray cluster (``check
  --ray-address``: each node's launcher looks on its own, ``actors/ray_launcher.py``); nor
  does any program whose environment marks it as the run's (``EXARCH_SESSION``, inherited
  from its shell, looked for on this machine): one that detached and outlived its shell.
- ``files-parse`` — every JSON-lines file reads; a torn last line is reported, not a violation
  (the expected shape of a crash mid-append), and so is a ``.torn`` side file (a torn tail the
  next append set aside); a corrupt inner line, a record without the shape its readers rely
  on, an unreadable ``result.json``/``run.json`` or a refused snapshot is a violation (a corrupt
  ``result.json`` is ``settled``'s too, with what to do: resume rebuilds it). So is a
  duplicated line in an event log: a tool call answered twice (a second ``tool_result`` of a
  call id no assistant message issued again in between, the shape a write retried after a
  partial one left behind), which no provider accepts.

What the files can prove depends on the run's durability policy (``run.json``'s
``durability``, absent: ``process``; :mod:`runtime.state.durability`), and the report names it.
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

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from exarch_actors.runtime.constants import SESSION_ENV, TRUNK_NAME
from exarch_actors.runtime.drills.session_logs import SessionLogs
from exarch_actors.runtime.errors import ExarchError, SnapshotRefused
from exarch_actors.runtime.settlement.fleet_yield import read_result
from exarch_actors.runtime.state.durability import DEFAULT as DEFAULT_DURABILITY
from exarch_actors.runtime.state.durability import PROMISES, Durability, parse_durability
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.eventlog import EVENT_SHAPE
from exarch_actors.runtime.state.journal import replay
from exarch_actors.runtime.state.run_processes import (
    LocalProcesses,
    ProcessTable,
    grouped_processes,
    marked_processes,
    run_processes,
)
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_read import ResumeRefused, read_run
from exarch_actors.runtime.state.session_records import (
    CONTROL_DIED,
    born_children,
    logged_messages,
    logged_results,
    rejected_messages,
    sent_messages,
)
from exarch_actors.runtime.state.snapshot import MobileSnapshot

Status = Literal["held", "violated", "skipped"]

_DETAIL_CAP = 50


class NotASession(ExarchError):
    """The path is not a session directory (no journal, transcript or agents directory)."""


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


def _by_kind(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == kind]


def _at(r: dict[str, Any]) -> str:
    return str(r.get("at") or "")


# --------------------------------------------------------------------------- the invariants


def _check_settled(s: SessionLogs) -> InvariantResult:
    path = s.session.journal
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
            f"{path.name} is {state}: {s.session.transcript.name} records {len(lost)} Born "
            f"child(ren) it never spawned ({', '.join(lost[:5])}); their settlement is lost"
        )
    result, problem = read_result(s.session)
    notes: list[str] = [f"{len(born)} Born children, all in the journal"] if not lost else []
    resume = f"`exarch-actors resume {s.session.root}`"
    if problem is not None:
        bad.append(
            f"corrupt result.json at {s.session.result}: {problem}; {resume} sets it "
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
        if result.get("resumed") and not any(
            r.get("kind") == "Born" and r.get("agent") == TRUNK_NAME for r in s.transcript
        ):  # what resume did before it started a run killed during start-up
            bad.append(
                f"result.json says {result.get('outcome')!r} after a resume, but the trunk was "
                "never Born: the run was killed during start-up and never ran"
            )
        notes.append(f"outcome {result.get('outcome')!r}")
    return _result("settled", len(rep.state.nodes), bad, notes)


def _snapshot_names(s: SessionLogs, agent: str) -> frozenset[str] | None:
    try:
        return MobileSnapshot.load(s.session.snapshot(agent)).names()
    except SnapshotRefused:
        return None


def _clears(s: SessionLogs) -> dict[str, list[str]]:
    """When each agent was cleared: ``Cleared`` notices and ``cleared`` log markers."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in _by_kind(s.transcript, "Notice"):
        if r.get("notice") == "Cleared":
            out[str(r.get("agent"))].append(_at(r))
    for agent in s.session.agent_names():
        for r in _by_kind(s.events(agent), "cleared"):
            out[agent].append(_at(r))
    return out


def _check_committed(s: SessionLogs) -> InvariantResult:
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


def _behind_at_control_death(s: SessionLogs, commits: list[dict[str, Any]]) -> set[int]:
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


def _check_rejections(s: SessionLogs) -> InvariantResult:
    rep = replay(s.session.journal, strict=False)
    rejected: set[tuple[str, str]] = set()
    rejected_count = 0
    for r in _by_kind(s.transcript, "InboxRejected"):
        rejected_count += 1
        msg = r.get("message") or {}
        child = msg.get("child") if isinstance(msg, dict) else None
        if child is not None:
            rejected.add((str(r.get("agent")), str(child)))
    collected: set[tuple[str, str]] = set()  # returned by agent-wait, read by agent-result
    for r in _by_kind(s.transcript, "Notice"):
        data = r.get("data")
        if r.get("notice") == "Collected" and isinstance(data, dict):
            children = data.get("children")
            for child in children if isinstance(children, list) else ():
                collected.add((str(r.get("agent")), str(child)))
    bad: list[str] = []
    checked = 0
    logged: dict[str, set[str]] = {}
    for nid, node in rep.state.nodes.items():
        parent = node.spawned.get("parent")
        if node.open or not isinstance(parent, str) or "dispatched" not in node.phases:
            continue  # never dispatched: the parent's spawn call failed, it had no result
        checked += 1
        if (parent, nid) in rejected or (parent, nid) in collected:
            continue
        if nid in logged.setdefault(parent, logged_results(s.events(parent))):
            continue
        bad.append(
            f"{nid}: its result is neither in {parent}'s event log, nor InboxRejected, nor "
            "Collected (agent-wait, agent-result)"
        )
    bad += [
        f"InboxRejected at {_at(r)} for {r.get('agent')} carries no message"
        for r in _by_kind(s.transcript, "InboxRejected")
        if not r.get("message")
    ]
    sent = sent_messages(s.transcript)
    rejected_ids = rejected_messages(s.transcript)
    held: dict[str, set[str]] = {}
    for r in sent:
        to, mid = str(r.get("agent")), str(r.get("id"))
        checked += 1
        if mid in rejected_ids or mid in held.setdefault(to, logged_messages(s.events(to))):
            continue
        bad.append(
            f"message {mid} from {r.get('sender')} to {to} (sent at {_at(r)}): neither in "
            f"{to}'s event log nor InboxRejected"
        )
    notes = [
        f"{rejected_count} InboxRejected records",
        f"{len(collected)} results Collected",
        f"{len(sent)} messages sent",
    ]
    return _result("rejections", checked, bad, notes)


def _check_registry_empty(s: SessionLogs) -> InvariantResult:
    born: Counter[str] = Counter(str(r.get("agent")) for r in _by_kind(s.transcript, "Born"))
    died: Counter[str] = Counter(str(r.get("agent")) for r in _by_kind(s.transcript, "Died"))
    bad = [
        f"{a}: {born[a]} Born, {died[a]} Died"
        for a in sorted(set(born) | set(died))
        if born[a] != died[a]
    ]
    last_died = {str(r.get("agent")): r for r in _by_kind(s.transcript, "Died")}
    for nid, node in replay(s.session.journal, strict=False).state.nodes.items():
        ended = node.results[-1].get("outcome") if node.results else None
        record = last_died.get(nid)
        if ended is not None and record is not None and record.get("outcome") != ended:
            bad.append(
                f"{nid}: its last Died says {record.get('outcome')!r}, its settlement "
                f"recorded {ended!r}"
            )
    return _result("registry-empty", sum(born.values()), bad)


def _check_processes(s: SessionLogs, table: ProcessTable) -> InvariantResult:
    procs = run_processes(s.session)
    bad = [f"{p.owner}: pid {p.pid} still running" for p in table.running(procs)]
    named = {p.pid for p in procs}
    marked = [p for p in marked_processes(s.session) if p.pid not in named]
    bad += [f"{p.owner}: pid {p.pid} outlived its shell ({SESSION_ENV})" for p in marked]
    seen = named | {p.pid for p in marked}
    grouped = [p for p in grouped_processes(s.session) if p.pid not in seen]
    bad += [f"{p.owner}: pid {p.pid} outlived its shell" for p in grouped]
    unverifiable = sum(1 for p in procs if p.started_at is None)
    notes = [f"{unverifiable} pids without a recorded start time"] if unverifiable else []
    if table.where != LocalProcesses.where:
        notes.append(f"looked for on {table.where}; programs by {SESSION_ENV} on this machine")
    # a node's copy of the session is removed only once nothing of the run runs any more
    copies = table.left_on_nodes(str(s.session.root), remove=not bad)
    verb = "kept while its processes run" if bad else "removed"
    notes += [f"a copy of the session left on {c} ({verb})" for c in copies]
    return _result("no-leftover-processes", len(procs), bad, notes)


def _check_files(s: SessionLogs) -> InvariantResult:
    session = s.session
    files = s.read_every_log()
    checked = len(files)
    bad = list(s.damage)
    if session.result.exists():
        checked += 1
        problem = read_result(session)[1]
        if problem is not None:
            bad.append(f"{session.result.name}: {problem}")
    if session.run_spec.exists():
        checked += 1
        try:
            read_run(session)
        except ResumeRefused as e:
            bad.append(f"{session.run_spec.name}: {e}")
    for agent in session.agent_names():
        p = session.snapshot(agent)
        if p.exists():
            checked += 1
            try:
                MobileSnapshot.load(p)
            except SnapshotRefused as e:
                bad.append(f"{p.relative_to(session.root)}: {e}")
    bad.extend(_answered_twice(session))
    notes = list(s.torn) + [
        f"{p.relative_to(session.root)}: {len(read_jsonl(p).records)} torn tail(s) of a crash "
        "mid-append, set aside by the next append (bytes kept)"
        for p in session.torn_side_files()
    ]
    notes += _predates_checksums(s)
    return _result("files-parse", checked, bad, notes)


def _predates_checksums(s: SessionLogs) -> list[str]:
    """What of the session was written before records carried checksums: damage there reads
    as it is (such a session is accepted; ``runtime/state/checksum.py``)."""
    bare: list[str] = []
    old = not s.session.run_spec.exists()
    for p in (s.session.run_spec, s.session.result):
        try:
            if not read_json_document(p)[1]:
                bare.append(p.name)
                old = old or p == s.session.run_spec
        except (OSError, ValueError):
            continue  # missing, or reported as damage above
    bare += [f"{p} ({n} lines)" for p, n in s.bare.items()]
    if not bare:
        return []
    more = f" and {len(bare) - 6} more files" if len(bare) > 6 else ""
    what = "the session predates checksums" if old else "records without a checksum (by hand?)"
    return [
        f"{what}: {', '.join(bare[:6])}{more} carry none, so a changed byte there cannot be "
        "detected"
    ]


def _answered_twice(session: SessionDir) -> list[str]:
    """Each ``tool_result`` line of an agent's event logs that answers a tool call already
    answered since an assistant message last issued it (a restarted scripted agent issues its
    call ids again: each issue may be answered once)."""
    bad: list[str] = []
    for agent in session.agent_names():
        for path in session.event_logs(agent):
            read = read_jsonl(path, EVENT_SHAPE)
            answered: dict[str, int] = {}
            for line, r in zip(read.lines, read.records, strict=True):
                message = r.get("message")
                if not isinstance(message, dict):
                    continue
                if r.get("kind") == "assistant":
                    for call in message.get("tool_calls") or ():
                        if isinstance(call, dict):
                            answered.pop(str(call.get("id")), None)
                    continue
                call_id = message.get("tool_call_id")
                if r.get("kind") != "tool_result" or not isinstance(call_id, str):
                    continue
                if call_id in answered:
                    bad.append(
                        f"{path.relative_to(session.root)}:{line}: a duplicated line: tool "
                        f"call {call_id} answered again (first at line {answered[call_id]})"
                    )
                else:
                    answered[call_id] = line
    return bad


def check_session(
    session: SessionDir,
    *,
    processes: bool = True,
    live: bool = False,
    table: ProcessTable | None = None,
) -> InvariantReport:
    """Check every invariant of a finished session directory (see the module docstring).

    ``live``: the run is still going, so only what must hold at every instant is checked
    (committed bindings, files); the end-of-run invariants are skipped. ``table``: where the
    run's processes are looked for (default: this machine)."""
    markers = (session.transcript, session.journal, session.agents, session.run_spec)
    if not session.root.is_dir() or not any(p.exists() for p in markers):
        raise NotASession(
            f"{session.root} is not a session directory (no transcript, journal or agents)"
        )
    s = SessionLogs(session)

    def skip(name: str, why: str) -> InvariantResult:
        return InvariantResult(name, "skipped", 0, (), (why,))

    results = [
        skip("settled", "run still live") if live else _check_settled(s),
        _check_committed(s),
        skip("rejections", "results may still be queued") if live else _check_rejections(s),
        skip("registry-empty", "run still live") if live else _check_registry_empty(s),
        _check_processes(s, table or LocalProcesses())
        if processes and not live
        else skip("no-leftover-processes", "run still live" if live else "turned off"),
    ]
    results.append(_check_files(s))  # last: every file the others read is in its cache
    return InvariantReport(str(session.root), tuple(results), _durability_of(session))


def _durability_of(session: SessionDir) -> Durability:
    """The run's policy; ``process`` when ``run.json`` does not say (or cannot: files-parse
    reports a damaged one)."""
    try:
        run = read_run(session)
    except ResumeRefused:
        return DEFAULT_DURABILITY
    return parse_durability(run.get("durability"))
