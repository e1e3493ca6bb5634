"""What each agent's ral calls returned then and now, and the first divergence per agent.

A session directory already holds what a replay is compared against: each agent's
``events.jsonl`` keeps every tool result exactly as the model saw it (value, stdout, stderr and
error, digested: ``runtime/fleet/digest.py``), in call order; ``transcript.jsonl``'s ``Born``
records
say which children each agent spawned, in order; ``Died``, ``result.json`` and the spawn
journal's ``execution-result`` say how each agent ended and what it replied.

:func:`read_facts` reads those into :class:`SessionFacts`; :func:`compare` (pure) walks every
agent of either run -- the trunk first, then children in spawn order -- and reports, per agent,
the first of these that differs after both sides are normalised
(:class:`runtime.replay.volatile.Normaliser`):

1. ``result`` -- call N returned something else (or ran another script);
2. ``calls`` -- one run made more ral calls than the other;
3. ``spawn`` -- the children spawned, in order, differ (a name, or one more or fewer);
4. ``end`` -- the outcome or the reply differs;
5. ``agent`` -- the agent exists in one run only.

A recorded run that did not finish (no ``result.json``: it crashed or was killed) is compared
as a prefix: the replay may go on past where it stopped (more calls, more children, agents it
never reached, an ending it never had) without that counting as a divergence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir

_SECTION = re.compile(r"^\[(error|value|stdout|stderr|notes)\]$", re.MULTILINE)


@dataclass(frozen=True)
class RecordedCall:
    """The ``index``-th (1-based) tool call an agent made, and what it returned."""

    index: int
    call_id: str
    tool: str
    script: str | None
    content: str
    is_error: bool


@dataclass(frozen=True)
class Ending:
    outcome: str | None
    reply: str | None


@dataclass(frozen=True)
class AgentFacts:
    name: str
    calls: tuple[RecordedCall, ...] = ()
    children: tuple[str, ...] = ()
    ending: Ending | None = None
    """None while the agent had not ended (an unfinished run)."""


@dataclass(frozen=True)
class SessionFacts:
    root: str
    agents: Mapping[str, AgentFacts]
    order: tuple[str, ...]
    """Agent names, the trunk first, then in the order they were born."""
    finished: bool
    """The run wrote ``result.json``: it ended rather than crashed."""


@dataclass(frozen=True)
class Divergence:
    """The first difference found for one agent; ``then``/``now`` as normalised."""

    agent: str
    kind: str
    summary: str
    call: int | None = None
    call_id: str | None = None
    script: str | None = None
    parts: tuple[str, ...] = ()
    """Which result sections differ (value, stdout, stderr, error, notes)."""
    then: str | None = None
    now: str | None = None


@dataclass(frozen=True)
class Report:
    then: str
    now: str
    divergences: tuple[Divergence, ...]
    agents: int
    calls: int
    """Ral calls compared (pairs present on both sides)."""
    then_finished: bool
    ignore: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def diverged(self) -> bool:
        return bool(self.divergences)

    def to_json(self) -> dict[str, Any]:
        return {
            "then": self.then,
            "now": self.now,
            "diverged": self.diverged,
            "agents": self.agents,
            "calls": self.calls,
            "thenFinished": self.then_finished,
            "ignore": list(self.ignore),
            "notes": list(self.notes),
            "divergences": [
                {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(d).items()}
                for d in self.divergences
            ],
        }


# ---------------------------------------------------------------------------------------------
# Reading a session


def agent_calls(events: Sequence[Mapping[str, Any]]) -> tuple[RecordedCall, ...]:
    """Every tool result of one event log, in order, with the call that asked for it."""
    asked: dict[str, tuple[str, str | None]] = {}
    out: list[RecordedCall] = []
    for rec in events:
        kind = rec.get("kind")
        msg = rec.get("message")
        if not isinstance(msg, Mapping):
            continue
        if kind == "assistant":
            for call in msg.get("tool_calls") or ():
                args = call.get("arguments")
                script = args.get("script") if isinstance(args, Mapping) else None
                asked[str(call.get("id"))] = (
                    str(call.get("name", "")),
                    script if isinstance(script, str) else None,
                )
        elif kind == "tool_result":
            call_id = str(msg.get("tool_call_id", ""))
            tool, script = asked.get(call_id, ("", None))
            out.append(
                RecordedCall(
                    len(out) + 1,
                    call_id,
                    tool,
                    script,
                    str(msg.get("content", "")),
                    bool(msg.get("is_error")),
                )
            )
    return tuple(out)


def read_facts(session: SessionDir) -> SessionFacts:
    """The facts :func:`compare` needs, from the files alone (torn tails skipped)."""
    base = session.root.resolve()
    transcript = read_jsonl(session.transcript).records
    born = [r for r in transcript if r.get("kind") == "Born"]
    died = {str(r.get("agent")): r for r in transcript if r.get("kind") == "Died"}
    journal = read_jsonl(session.journal).records
    order: list[str] = []
    children: dict[str, list[str]] = {}
    # A parent's children in the order it asked for them: the spawn journal's ``spawned``
    # records, written when the registry accepts each request. ``Born`` follows them only
    # where the child starts in the parent's process: on a Ray cluster each child's node
    # writes its own, and two children asked for in one turn were born "hi, lo" once in CI
    # after "lo, hi" was recorded.
    for r in journal:
        if r.get("kind") == "spawned" and isinstance(r.get("parent"), str):
            kids = children.setdefault(str(r["parent"]), [])
            if str(r.get("id")) not in kids:
                kids.append(str(r.get("id")))
    for r in born:
        name = str(r.get("agent"))
        if name not in order:
            order.append(name)
        parent = r.get("parent")
        if parent is not None and name not in children.setdefault(str(parent), []):
            children[str(parent)].append(name)
    order += [name for name in session.agent_names() if name not in order]
    result = _json(session.result)
    replies = {
        str(r.get("id")): r.get("reply") for r in journal if r.get("kind") == "execution-result"
    }
    trunk = next((str(r.get("agent")) for r in born if r.get("parent") is None), None)
    agents: dict[str, AgentFacts] = {}
    for name in order:
        ending = None
        if name in died:
            reply = result.get("reply") if name == trunk else replies.get(name)
            ending = Ending(died[name].get("outcome"), None if reply is None else str(reply))
        agents[name] = AgentFacts(
            name,
            agent_calls(read_jsonl(session.events(name)).records),
            tuple(children.get(name, ())),
            ending,
        )
    return SessionFacts(str(base), agents, tuple(order), bool(result))


def _json(path: Path) -> dict[str, Any]:
    try:
        data = read_json_document(path)[0]
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------------------------
# Comparing


def sections(content: str) -> dict[str, str]:
    """A digested result split into its sections (``[value]``, ``[stdout]``, ...)."""
    marks = list(_SECTION.finditer(content))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() - 1 if i + 1 < len(marks) else len(content)
        out[m.group(1)] = content[m.end() + 1 : max(end, m.end() + 1)]
    return out


def _differing_parts(a: str, b: str) -> tuple[str, ...]:
    sa, sb = sections(a), sections(b)
    names = [n for n in ("error", "value", "stdout", "stderr", "notes") if n in sa or n in sb]
    return tuple(n for n in names if sa.get(n) != sb.get(n))


def compare(
    then: SessionFacts,
    now: SessionFacts,
    normalise: Callable[[str], str] = lambda s: s,
    *,
    ignore: Sequence[str] = (),
) -> Report:
    """The first divergence of every agent of either run (see the module doc)."""
    order = list(then.order) + [n for n in now.order if n not in then.order]
    prefix = not then.finished
    out: list[Divergence] = []
    compared = 0
    for name in order:
        a, b = then.agents.get(name), now.agents.get(name)
        if a is None or b is None:
            if a is None and prefix:
                continue  # the recorded run stopped before it reached this agent
            side = "then" if a is not None else "now"
            out.append(
                Divergence(
                    name,
                    "agent",
                    f"agent {name} ran {side} only",
                    then="present" if a is not None else "absent",
                    now="present" if b is not None else "absent",
                )
            )
            continue
        found, n = _first(a, b, normalise, prefix)
        compared += n
        if found is not None:
            out.append(found)
    notes: tuple[str, ...] = ()
    if prefix:
        notes = ("the recorded run did not finish: it is compared as a prefix of the replay",)
    return Report(
        then.root,
        now.root,
        tuple(out),
        len(order),
        compared,
        then.finished,
        tuple(ignore),
        notes,
    )


def _first(
    a: AgentFacts, b: AgentFacts, normalise: Callable[[str], str], prefix: bool
) -> tuple[Divergence | None, int]:
    """The first divergence of one agent present in both runs, and the calls compared."""
    pairs = 0
    for x, y in zip(a.calls, b.calls):
        pairs += 1
        cx, cy = normalise(x.content), normalise(y.content)
        if x.script != y.script or x.tool != y.tool:
            what = f"call {x.index} ran another script"
            return _call_divergence(a.name, what, x, y, (), x.script, y.script), pairs
        if cx != cy or x.is_error != y.is_error:
            parts = _differing_parts(cx, cy) or ("error",)
            what = f"call {x.index} returned a different {'/'.join(parts)}"
            return _call_divergence(a.name, what, x, y, parts, cx, cy), pairs
    if len(a.calls) != len(b.calls) and not (prefix and len(a.calls) < len(b.calls)):
        longer = a.calls if len(a.calls) > len(b.calls) else b.calls
        extra = longer[pairs]
        return (
            Divergence(
                a.name,
                "calls",
                f"{len(a.calls)} ral calls then, {len(b.calls)} now",
                call=extra.index,
                call_id=extra.call_id,
                script=extra.script,
                then=str(len(a.calls)),
                now=str(len(b.calls)),
            ),
            pairs,
        )
    kids_a, kids_b = a.children, b.children
    if prefix:
        kids_b = kids_b[: len(kids_a)]
    if kids_a != kids_b:
        i = next(
            (i for i, (p, q) in enumerate(zip(kids_a, kids_b)) if p != q),
            min(len(kids_a), len(kids_b)),
        )
        return (
            Divergence(
                a.name,
                "spawn",
                f"spawn {i + 1} differs",
                then=", ".join(kids_a) or "(none)",
                now=", ".join(b.children) or "(none)",
            ),
            pairs,
        )
    if a.ending is not None and b.ending is not None:
        ea = Ending(a.ending.outcome, _norm(a.ending.reply, normalise))
        eb = Ending(b.ending.outcome, _norm(b.ending.reply, normalise))
        if ea != eb:
            what = "ended otherwise" if ea.outcome != eb.outcome else "replied otherwise"
            return (
                Divergence(a.name, "end", what, then=_show_end(ea), now=_show_end(eb)),
                pairs,
            )
    return None, pairs


def _call_divergence(
    agent: str,
    what: str,
    x: RecordedCall,
    y: RecordedCall,
    parts: tuple[str, ...],
    then: str | None,
    now: str | None,
) -> Divergence:
    return Divergence(
        agent, "result", what, x.index, x.call_id, x.script, parts, then=then, now=now
    )


def _norm(text: str | None, normalise: Callable[[str], str]) -> str | None:
    return None if text is None else normalise(text)


def _show_end(e: Ending) -> str:
    return f"{e.outcome}: {e.reply}" if e.reply is not None else str(e.outcome)
