"""A session directory as spans: what the Chrome trace, the HTML report and an offline
OpenTelemetry export draw, read from the files a run leaves (docs/observability.md).

Sources, each through the reader the checker uses (``runtime/drills/session_logs.py``: a
damaged line is reported, never raised):

- ``transcript.jsonl``: ``Born``/``Died`` (an agent's incarnations: a resumed or restarted agent
  has more than one, all on its one track), ``ModelCall`` (model request spans), ``Io`` (ral
  call spans; ``seconds`` is how long it ran, ``at`` its end), errors, ``InboxRejected``,
  notices (restarts, reaps, compactions) and notes (a resume);
- ``spawn-journal.jsonl``: ``spawned`` (the spawn flow from parent to child) and ``settled``
  (the child's terminal reason, and the flow of its end back to its parent);
- ``record.jsonl``: rollbacks and reaps;
- each ``agents/<name>/events*.jsonl``: turns (a turn opens at a ``user`` record and lasts to the
  last record before the next one);
- ``result.json``: the outcome, the reply and the money per agent.

Times are the records' ISO ``at`` stamps (millisecond resolution) as epoch seconds; a span that
knows its duration (``seconds``) ends at ``at`` and starts that much earlier. A resumed session
is one view: its records are appended to the same files.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from exarch_actors.runtime.drills.session_logs import SessionLogs
from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.settlement.fleet_yield import read_result
from exarch_actors.runtime.state.session_dir import SessionDir

TRUNK_PARENT = ""
"""The parent recorded for an agent with none (the trunk, a branch)."""


class NotASessionDir(ExarchError):
    """The path holds none of a run's files: nothing to trace or report."""


@dataclass(frozen=True)
class Span:
    """Something that took time on one agent's track. ``kind``: ``agent`` (an incarnation),
    ``turn``, ``model`` (a provider round trip) or ``ral`` (a tool call)."""

    agent: str
    kind: str
    name: str
    start: float
    end: float
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mark:
    """An instant on one agent's track: ``spawn``, ``cancel``, ``rollback``, ``restart``,
    ``down``, ``reap``, ``resume``, ``rejected``, ``error``, ``note``, ``compacted``."""

    agent: str
    kind: str
    name: str
    at: float
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Flow:
    """An arrow between two tracks: ``spawn`` (parent -> child, at the journal's ``spawned``)
    or ``reply`` / ``end`` (child -> parent, at its ``settled``)."""

    kind: str
    source: str
    source_at: float
    target: str
    target_at: float


@dataclass
class AgentSummary:
    """One agent over the whole session (every incarnation)."""

    name: str
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    depth: int = 0
    born: float | None = None
    died: float | None = None
    outcome: str | None = None
    """How it ended: the journal's terminal reason for a child, the last ``Died`` otherwise."""
    cause: str | None = None
    status: str | None = None
    """The journal's ``settled`` status of a child (done, down, cancelled)."""
    incarnations: int = 0
    node: str = "local"
    model_calls: int = 0
    ral_calls: int = 0
    errors: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cost: Decimal | None = Decimal(0)
    """Dollars; None when any of its round trips' cost is unknown."""
    seconds: float = 0.0


@dataclass(frozen=True)
class Problem:
    """An error or a rejected message, as the report lists it."""

    agent: str
    at: float
    what: str
    text: str


@dataclass
class SessionView:
    """Everything drawn from one session directory; ``agents`` is in spawn-tree order (depth
    first, children in the order they were spawned)."""

    root: str
    outcome: str | None = None
    reply: str | None = None
    fleet_yield: dict[str, Any] = field(default_factory=dict)
    agents: dict[str, AgentSummary] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    rejected: list[Problem] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    def spans_of(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.kind == kind]


def epoch(at: Any) -> float | None:
    """An ISO ``at`` stamp as epoch seconds; None for anything else."""
    if not isinstance(at, str):
        return None
    try:
        return dt.datetime.fromisoformat(at).timestamp()
    except ValueError:
        return None


def first_line(text: str, width: int = 72) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def read_view(session: SessionDir) -> SessionView:
    """The view of ``session``; :class:`NotASessionDir` when it holds no run."""
    if not session.holds_a_run():
        raise NotASessionDir(f"{session.root}: not a session directory (no run files in it)")
    logs = SessionLogs(session)
    view = SessionView(str(session.root))
    _Builder(view, logs).build()
    doc, corrupt = read_result(session)
    if doc is not None:
        view.outcome = str(doc.get("outcome"))
        reply = doc.get("reply")
        view.reply = None if reply is None else str(reply)
        view.fleet_yield = dict(doc.get("fleetYield") or {})
        _money_from_result(view)
    elif corrupt is not None:
        view.damage.append(f"{session.result.name}: {corrupt}")
    view.damage = [*view.damage, *logs.damage, *logs.torn]
    return view


class _Builder:
    def __init__(self, view: SessionView, logs: SessionLogs) -> None:
        self.view = view
        self.logs = logs
        self.open: dict[str, tuple[float, dict[str, Any]]] = {}
        self.times: list[float] = []

    def agent(self, name: str) -> AgentSummary:
        found = self.view.agents.get(name)
        if found is None:
            found = self.view.agents[name] = AgentSummary(name)
        return found

    def build(self) -> None:
        for r in self.logs.transcript:
            at = epoch(r.get("at"))
            if at is not None:
                self.times.append(at)
                self._transcript(r, at)
        self._journal()
        self._records()
        self._turns()
        view = self.view
        view.start = min(self.times, default=0.0)
        view.end = max(self.times, default=0.0)
        for name, (start, args) in self.open.items():  # no Died: the run stopped around it
            self._close(name, start, view.end, {**args, "outcome": "(no end recorded)"})
        view.spans.sort(key=lambda s: (s.start, -s.end))
        view.marks.sort(key=lambda m: m.at)
        _order_tree(view)

    # --- transcript.jsonl ---------------------------------------------------------------

    def _transcript(self, r: dict[str, Any], at: float) -> None:
        kind, name = r.get("kind"), str(r.get("agent", ""))
        a = self.agent(name)
        if kind == "Born":
            a.incarnations += 1
            a.born = a.born if a.born is not None else at
            parent = r.get("parent")
            if isinstance(parent, str) and a.parent is None:
                a.parent = parent
            a.node = str(r.get("node") or a.node)
            if name in self.open:  # a second Born without a Died: close the first here
                start, args = self.open.pop(name)
                self._close(name, start, at, {**args, "outcome": "(replaced)"})
            self.open[name] = (at, {"incarnation": a.incarnations, "pid": r.get("pid")})
        elif kind == "Died":
            a.died = at
            outcome, cause = r.get("outcome"), r.get("cause")
            a.outcome, a.cause = str(outcome), cause  # a child's: the journal's reason, later
            start, args = self.open.pop(name, (a.born if a.born is not None else at, {}))
            self._close(name, start, at, {**args, "outcome": outcome, "cause": cause})
            if outcome == "cancelled":
                self._mark(name, "cancel", f"cancelled: {cause or ''}".strip(), at)
            elif outcome == "failed":
                self._error(name, at, "failed", str(cause or "failed"))
        elif kind == "ModelCall":
            self._model_call(a, r, at)
        elif kind == "Io":
            self._io(a, r, at)
        elif kind == "ProviderError":
            text = f"{r.get('error', '')}: {r.get('message', '')}"
            self._error(name, at, "provider error", text)
        elif kind == "InboxRejected":
            text = f"{r.get('reason', '')} (from {r.get('source', '')}): {r.get('message', {})}"
            self.view.rejected.append(Problem(name, at, "inbox rejected", text))
            self._mark(name, "rejected", f"inbox rejected: {r.get('reason', '')}", at, r)
        elif kind == "Notice":
            notice = str(r.get("notice") or "notice")
            mark = {"Restarted": "restart", "Down": "down", "Reap": "reap"}.get(notice)
            if notice == "Down":
                self._error(name, at, "down", str(r.get("text") or ""))
            if notice != "Collected":
                text = str(r.get("text") or "")
                self._mark(name, mark or notice.lower(), f"{notice} {text}".strip(), at)
        elif kind == "SystemNote":
            text = str(r.get("text") or "")
            self._mark(name, "resume" if text.startswith("resumed") else "note", text, at)

    def _close(self, name: str, start: float, end: float, args: dict[str, Any]) -> None:
        self.view.spans.append(Span(name, "agent", name, start, max(start, end), args))

    def _model_call(self, a: AgentSummary, r: dict[str, Any], at: float) -> None:
        seconds = _number(r.get("seconds"))
        a.model_calls += 1
        a.seconds += seconds
        for attr, key in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_tokens", "cache_read_tokens"),
        ):
            value = r.get(key)
            if isinstance(value, int):
                setattr(a, attr, (getattr(a, attr) or 0) + value)
        cost = _decimal(r.get("cost"))
        a.cost = None if cost is None or a.cost is None else a.cost + cost
        args = {k: v for k, v in r.items() if k not in ("kind", "agent", "at")}
        name = f"{r.get('operation') or 'chat'} {r.get('model') or ''}".strip()
        self.view.spans.append(Span(a.name, "model", name, at - seconds, at, args))

    def _io(self, a: AgentSummary, r: dict[str, Any], at: float) -> None:
        seconds = _number(r.get("seconds"))
        script = str(r.get("script") or "")
        a.ral_calls += 1
        args = {
            "call_id": r.get("call_id"),
            "script": script[:2000],
            "value": str(r.get("value") or "")[:2000],
            "error": r.get("error"),
        }
        self.view.spans.append(Span(a.name, "ral", first_line(script), at - seconds, at, args))
        if r.get("error"):
            value = str(r.get("value") or "").removeprefix("[error]").strip()  # the digest's header
            self._error(
                a.name, at, "ral error", f"{first_line(script)} -> {first_line(value, 200)}"
            )

    def _error(self, agent: str, at: float, what: str, text: str) -> None:
        self.agent(agent).errors += 1
        self.view.errors.append(Problem(agent, at, what, text))
        self._mark(agent, "error", f"{what}: {first_line(text)}", at)

    def _mark(
        self, agent: str, kind: str, name: str, at: float, args: Mapping[str, Any] | None = None
    ) -> None:
        self.view.marks.append(Mark(agent, kind, name, at, dict(args or {})))

    # --- spawn-journal.jsonl, record.jsonl ----------------------------------------------

    def _journal(self) -> None:
        for r in self.logs.journal:
            at, child = epoch(r.get("at")), str(r.get("id", ""))
            if at is None or not child:
                continue
            self.times.append(at)
            a = self.agent(child)
            kind = r.get("kind")
            if kind == "spawned":
                parent = str(r.get("parent") or TRUNK_PARENT)
                a.parent = parent or a.parent
                self._mark(parent, "spawn", f"spawn {child}", at, {"child": child})
                self.view.flows.append(Flow("spawn", parent, at, child, a.born or at))
            elif kind == "settled":
                a.status = str(r.get("status") or "")
                a.outcome = str(r.get("reason") or a.status)
                if a.status == "cancelled":
                    self._mark(child, "cancel", f"settled cancelled: {a.outcome}", at)
                if a.parent:
                    flow = "reply" if a.outcome == "replied" else "end"
                    self.view.flows.append(Flow(flow, child, at, a.parent, at))

    def _records(self) -> None:
        for r in self.logs.record:
            kind, at = r.get("kind"), epoch(r.get("at"))
            if at is None or kind not in ("Rollback", "Reap"):
                continue
            name = str(r.get("agent", ""))
            what = f"{kind} {r.get('reason') or r.get('detail') or ''}".strip()
            self._mark(name, str(kind).lower(), what, at, r)
            if kind == "Rollback":
                self._error(name, at, "rollback", str(r.get("reason") or ""))

    # --- agents/<name>/events*.jsonl ----------------------------------------------------

    def _turns(self) -> None:
        for name in list(self.view.agents):
            turns = len(self.view.spans)
            self._turns_of(name)
            self._cover(name, turns)

    def _cover(self, agent: str, first: int) -> None:
        """Stretch each turn of ``agent`` (the spans from ``first`` on) over the model and ral
        calls that began in it: their stamps can be a millisecond past the turn's last record."""
        turns = sorted(self.view.spans[first:], key=lambda s: s.start)
        del self.view.spans[first:]
        calls = [s for s in self.view.spans if s.agent == agent and s.kind in ("model", "ral")]
        for n, t in enumerate(turns):
            until = turns[n + 1].start if n + 1 < len(turns) else float("inf")
            end = max([t.end, *(c.end for c in calls if t.start <= c.start < until)])
            self.view.spans.append(Span(t.agent, t.kind, t.name, t.start, min(end, until), t.args))

    def _turns_of(self, name: str) -> None:
        turn: list[Any] = []  # [start, end, source, text, number]
        number = 0
        for r in self.logs.events(name):
            at = epoch(r.get("at"))
            if at is None:
                continue
            if r.get("kind") == "user":
                self._end_turn(name, turn)
                number += 1
                turn = [at, at, str(r.get("source") or "user"), str(r.get("text")), number]
            elif r.get("kind") == "cleared":
                self._end_turn(name, turn)
                turn = []
            elif turn:
                turn[1] = max(turn[1], at)
        self._end_turn(name, turn)

    def _end_turn(self, agent: str, turn: list[Any]) -> None:
        if not turn:
            return
        start, end, source, text, number = turn
        args = {"source": source, "text": first_line(text, 300)}
        self.view.spans.append(Span(agent, "turn", f"turn {number} ({source})", start, end, args))


def _order_tree(view: SessionView) -> None:
    """``view.agents`` in depth-first spawn order, with depths and children filled in."""
    agents = view.agents
    roots: list[str] = []
    for a in agents.values():
        if a.parent and a.parent in agents:
            agents[a.parent].children.append(a.name)
        else:
            roots.append(a.name)
    ordered: dict[str, AgentSummary] = {}
    stack = [(name, 0) for name in reversed(roots)]
    while stack:
        name, depth = stack.pop()
        if name in ordered:
            continue
        a = agents[name]
        a.depth = depth
        ordered[name] = a
        stack.extend((c, depth + 1) for c in reversed(a.children))
    view.agents = ordered


def _money_from_result(view: SessionView) -> None:
    """Each agent's dollars as ``result.json`` metered them (they include what a resumed run
    read from the journal), where it says."""
    per_agent = (view.fleet_yield.get("cost") or {}).get("agents") or {}
    for name, money in per_agent.items():
        if name in view.agents and isinstance(money, dict):
            view.agents[name].cost = _decimal(money.get("usd"))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _decimal(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def most_expensive(spans: Iterable[Span], n: int = 20) -> list[Span]:
    """Model calls by cost, then tokens, then duration: the top ``n``."""

    def key(s: Span) -> tuple[Decimal, int, float]:
        tokens = sum(int(s.args.get(k) or 0) for k in ("input_tokens", "output_tokens"))
        return (_decimal(s.args.get("cost")) or Decimal(0), tokens, s.end - s.start)

    return sorted((s for s in spans if s.kind == "model"), key=key, reverse=True)[:n]
