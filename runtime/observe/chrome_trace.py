"""A session as a Chrome trace (the JSON object format that chrome://tracing and
ui.perfetto.dev open as is): one track (thread) per agent in spawn-tree order, named by its path
from the trunk, in one process named after the session.

What it holds:

- complete events (``ph: "X"``) nested on each track: an agent's incarnation, its turns, and
  inside them its model requests and ral calls (``cat`` is the span's kind);
- instant events (``ph: "i"``, thread scope) for spawns, cancels, rollbacks, restarts, reaps,
  errors, rejected messages and notes;
- flow events (``ph: "s"`` then ``ph: "f"``, ``bp: "e"``, one id per arrow) from a spawn to the
  child's first moment and from a child's end to its parent.

The format needs each track's complete events properly nested: a child span is clipped into
its parent and after its previous sibling (the records' stamps have millisecond resolution, so
a 0.3 ms request may appear to start 0.7 ms before the turn that holds it). Times are
microseconds since the session's first record; ``otherData.startedAt`` is that instant.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

from exarch_actors.runtime.observe.spans import Flow, SessionView, Span

PID = 1
LEVEL = {"agent": 0, "turn": 1, "model": 2, "ral": 2}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def track_names(view: SessionView) -> dict[str, str]:
    """Each agent's track name: its path from the root of its tree (``trunk/lo``)."""
    names: dict[str, str] = {}
    for name, a in view.agents.items():
        parent = names.get(a.parent) if a.parent else None
        names[name] = f"{parent}/{name}" if parent else name
    return names


class _Clock:
    def __init__(self, origin: float) -> None:
        self.origin = origin

    def us(self, t: float) -> float:
        return round((t - self.origin) * 1e6, 3)


def nest(spans: list[Span]) -> list[tuple[Span, float, float]]:
    """One track's spans with their start and end clipped so that every span lies inside the
    span of a lower level that holds it and after its previous sibling (see the module
    docstring); in start order."""
    out: list[tuple[Span, float, float]] = []
    stack: list[tuple[int, float, float]] = []  # (level, start, end) of the open ancestors
    last_end: dict[int, float] = {}
    bounds = _snapped(spans)
    ordered = sorted(spans, key=lambda s: (bounds[id(s)][0], LEVEL.get(s.kind, 3), -s.end))
    for s in ordered:
        level = LEVEL.get(s.kind, 3)
        start, end = bounds[id(s)]
        while stack and (stack[-1][0] >= level or stack[-1][2] <= start):
            stack.pop()
        if stack:
            start = max(start, stack[-1][1])
            end = min(end, stack[-1][2])
        start = max(start, last_end.get(level, start))
        end = max(start, end)
        for deeper in [lv for lv in last_end if lv > level]:
            del last_end[deeper]
        last_end[level] = end
        stack.append((level, start, end))
        out.append((s, start, end))
    return out


def _snapped(spans: list[Span]) -> dict[int, tuple[float, float]]:
    """Each span's bounds clipped into the span one level up that it overlaps most (a request
    stamped a little before its turn belongs to that turn, not beside it)."""
    bounds = {id(s): (s.start, max(s.start, s.end)) for s in spans}
    for level in (1, 2):
        parents = [bounds[id(s)] for s in spans if LEVEL.get(s.kind, 3) == level - 1]
        for s in spans:
            if LEVEL.get(s.kind, 3) != level:
                continue
            start, end = bounds[id(s)]
            best = max(
                parents,
                key=lambda p: min(end, p[1]) - max(start, p[0]) + (p[0] <= start <= p[1]) * 1e-9,
                default=None,
            )
            if best is not None and min(end, best[1]) >= max(start, best[0]):
                start = min(max(start, best[0]), best[1])
                bounds[id(s)] = (start, max(start, min(end, best[1])))
    return bounds


def chrome_trace(view: SessionView) -> dict[str, Any]:
    """The trace object of ``view`` (``json.dumps`` it; :func:`dumps` does)."""
    clock = _Clock(view.start)
    names = track_names(view)
    tids = {name: n for n, name in enumerate(view.agents, start=1)}
    session = view.root.rstrip("/").rsplit("/", 1)[-1]
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "args": {"name": f"session {session}"}},
    ]
    for name, tid in tids.items():
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": PID,
                "tid": tid,
                "args": {"name": names[name]},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": PID,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    placed: dict[str, list[tuple[Span, float, float]]] = {}
    for name in tids:
        placed[name] = nest([s for s in view.spans if s.agent == name])
        for s, start, end in placed[name]:
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.kind,
                    "pid": PID,
                    "tid": tids[name],
                    "ts": clock.us(start),
                    "dur": round(clock.us(end) - clock.us(start), 3),  # ends meet exactly
                    "args": _jsonable(dict(s.args)),
                }
            )
    for m in view.marks:
        if m.agent in tids:
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": m.name,
                    "cat": m.kind,
                    "pid": PID,
                    "tid": tids[m.agent],
                    "ts": clock.us(m.at),
                    "args": _jsonable(dict(m.args)),
                }
            )
    for n, flow in enumerate(view.flows, start=1):
        if placed.get(flow.source) and placed.get(flow.target):  # a child never born: no arrow
            events.extend(_flow(n, flow, placed, tids, clock))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "session": view.root,
            "startedAt": dt.datetime.fromtimestamp(view.start, dt.UTC).isoformat(),
            "outcome": view.outcome,
        },
    }


def _inside(
    placed: list[tuple[Span, float, float]], at: float, kinds: tuple[str, ...], naming: str = ""
) -> float:
    """``at`` moved inside the latest span of ``kinds`` that began by then (else the first one),
    so a flow event binds to a slice of its track; with ``naming``, a span whose script or value
    names it is preferred (the ral call that spawned a child returns before the child is
    journalled when its process is born in the background)."""
    chosen: tuple[float, float] | None = None
    named = False
    for s, start, end in placed:
        if s.kind not in kinds or (start > at and chosen is not None):
            continue
        hit = bool(naming) and any(naming in str(s.args.get(k) or "") for k in ("script", "value"))
        if hit or not named:
            chosen, named = (start, end), hit
    if chosen is None:
        return at
    start, end = chosen
    return min(max(at, start), max(start, end - 1e-6))  # inside, not on its closing edge


def _flow(
    n: int,
    flow: Flow,
    placed: dict[str, list[tuple[Span, float, float]]],
    tids: dict[str, int],
    clock: _Clock,
) -> list[dict[str, Any]]:
    if flow.kind == "spawn":  # from the parent's ral call that spawned it, to the child's birth
        src = _inside(placed[flow.source], flow.source_at, ("ral",), flow.target)
        dst = _inside(placed[flow.target], flow.target_at, ("agent",))
    else:  # from the child's end to its parent, wherever the parent was then
        src = _inside(placed[flow.source], flow.source_at, ("agent",))
        dst = _inside(placed[flow.target], flow.target_at, ("agent",))
    common = {"name": flow.kind, "cat": "flow", "id": n, "pid": PID}
    return [
        {**common, "ph": "s", "tid": tids[flow.source], "ts": clock.us(src)},
        {**common, "ph": "f", "bp": "e", "tid": tids[flow.target], "ts": clock.us(dst)},
    ]


def dumps(view: SessionView) -> str:
    return json.dumps(chrome_trace(view), ensure_ascii=False, separators=(",", ":"))
