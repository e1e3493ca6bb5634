"""The seeded nemesis: a deterministic fault schedule and the synthetic fleet it breaks.

Pure: no clocks, no processes. Given ``seed``, ``rate`` (faults per second, a Poisson process),
the fault kinds and a duration, :func:`fault_schedule` returns the same sequence of
:class:`Fault` every time (``random.Random(seed)``, nothing else); the drill (``cli/drill.py``)
applies it. :func:`synthetic_scenario` writes the scenario of one drill round: a trunk fanning
out to N children, each making M ral calls that define bindings, with the round's *scripted*
faults embedded at deterministic positions.

Catalog (``KNOWN_KINDS``; ``all`` is ``FAULT_KINDS``), by how each is delivered:

- scripted into the scenario (:data:`SCRIPTED`): ``panic`` (``fault panic``: an internal
  evaluator error, the call rolls back), ``worker-kill`` (a worker whose closure runs
  ``fault crash``: the kernel SIGKILLs the worker process mid-run), ``stream-cut``
  (``error = "transport"``), ``truncated`` (``error = "truncated"``, a partial reply),
  ``malformed-args`` (``fn_arguments`` that are not JSON), ``empty-reply`` (an empty message),
  ``rate-limit`` (``error = "rate_limit"``, several in a row when the param says a storm);
- applied to the live fleet by the drill (:data:`LIVE`): ``shell-kill`` (SIGKILL of an agent's
  shell process), ``inbox-flood`` (1000 messages at one agent), ``cancel-storm`` (cancel of
  random subtrees), ``clear-storm`` (``/clear`` at random agents), ``write-failure`` (an agent's
  ``snapshot.msgpack`` made unwritable for a moment);
- ``control-kill`` (:data:`CONTROL`): the round runs in a child process that is SIGKILLed, then
  resume finishes it;
- ``agent-kill`` (:data:`PROCESS`): SIGKILL of one agent's own process. Requested by name only
  (not part of ``all``): it runs the rounds with ``--agents process``, where the supervisor
  restarts the agent from its files or settles it ``down``.
- ``ray-worker-kill`` and ``node-loss`` (:data:`RAY`): with ``--backend ray`` only, by name
  only: SIGKILL of the Ray worker process an agent's actor runs in, on its node; removal of a
  node (not the head) that holds a live agent, its raylet SIGKILLed there with every worker on
  it. The supervisor restarts the agents elsewhere from the driver's files or settles them
  ``down`` (``release-unconfirmed``: what they left on the node is out of reach).

Landing rules, so that every requested kind is applied (the drill fails otherwise,
:func:`owed_kinds`): a drill of :data:`COVERAGE_SECS` or more schedules every requested kind;
control-kill rounds take at most :data:`CONTROL_SHARE` of the drill (:func:`control_round`);
due live faults are tried never-applied kinds first and never block each other
(:func:`live_order`); each child plays at most one fault that ends it, after its others
(:func:`plan_scripted`); a control kill comes within the calls its round surely makes
(:func:`sure_calls`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from exarch_actors.runtime.errors import ExarchError

SCRIPTED = (
    "panic",
    "worker-kill",
    "stream-cut",
    "truncated",
    "malformed-args",
    "empty-reply",
    "rate-limit",
)
LIVE = ("shell-kill", "inbox-flood", "cancel-storm", "clear-storm", "write-failure")
CONTROL = ("control-kill",)
PROCESS = ("agent-kill",)
"""Live kinds that need every agent in its own process (the rounds run ``--agents process``)."""
RAY = ("ray-worker-kill", "node-loss")
"""Live kinds that need the agents on a Ray cluster (``--backend ray``)."""
FAULT_KINDS = SCRIPTED + LIVE + CONTROL
"""The kinds of ``all``."""
KNOWN_KINDS = FAULT_KINDS + PROCESS + RAY
"""Every kind a drill may be asked for by name."""

RECOVERING = frozenset(
    {
        "panic",
        "worker-kill",
        "truncated",
        "malformed-args",
        "empty-reply",
        "shell-kill",
        "inbox-flood",
        "write-failure",
        "agent-kill",
        "ray-worker-kill",
        "node-loss",
    }
)
"""Kinds after which the affected agent is expected to make another successful call (a
provider error ends a child ``down``; a cancel ends it; a clear empties it)."""


COVERAGE_SECS = 60.0
"""A drill at least this long applies every requested kind at least once, or fails."""

CONTROL_SHARE = 0.5
"""The most of a drill's elapsed time control-kill rounds may take. A control-kill round runs
the fleet in a child process, where the kinds that need the fleet's handle (inbox flood,
cancel and clear storms) cannot land: before this rule a 180 s drill at rate 5 (seed 90413)
spent 48 of its 54 rounds that way and applied none of 61 shell kills, 66 cancel storms,
65 clear storms, 67 floods and 67 write failures."""

ENDING = frozenset({"stream-cut", "rate-limit"})
"""Scripted kinds that end their child (an exhausted provider error: it ends ``down``); a child
plays nothing placed after one."""

LANDS_OUTSIDE = frozenset({"shell-kill", "write-failure"})
"""Live kinds the drill applies from outside the fleet's process (a psutil SIGKILL of a shell
pid read from the session files; a snapshot path turned into a directory), so they land in a
control-kill round's child process too."""


class BadFaults(ExarchError):
    """An unknown fault kind, or a rate/duration that is not positive."""


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``at`` seconds after the drill started; ``target`` and ``param``
    are raw draws the drill reduces modulo what exists when the fault fires."""

    seq: int
    at: float
    kind: str
    target: int
    param: int

    def to_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "target": self.target,
            "param": self.param,
        }


def parse_faults(text: str | Iterable[str], *, scripted: bool = True) -> tuple[str, ...]:
    """``"a,b,c"`` or ``"all"`` → the kinds, in catalog order; unknown names are refused.

    ``scripted=False`` (a drill of a given scenario, which is played as written): ``all`` means
    the live and control kinds, and a scripted kind is refused, since it could never land."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    catalog = KNOWN_KINDS if scripted else LIVE + CONTROL + PROCESS + RAY
    if names == ["all"]:  # agent-kill and the Ray kinds change how the rounds run: by name only
        return tuple(k for k in catalog if k not in PROCESS + RAY)
    unknown = [n for n in names if n not in KNOWN_KINDS]
    if unknown or not names:
        raise BadFaults(
            f"unknown fault kind(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(KNOWN_KINDS)} or all"
        )
    unplayable = [n for n in names if n not in catalog]
    if unplayable:
        raise BadFaults(
            f"{', '.join(unplayable)} are scripted into the synthetic fleet's scenario; a given "
            f"scenario is played as written, so choose from {', '.join(catalog)} or all"
        )
    return tuple(k for k in KNOWN_KINDS if k in names)


# --------------------------------------------------------------------------- landing rules


def coverage_required(duration: float) -> bool:
    """Whether a drill this long must apply every requested kind (:data:`COVERAGE_SECS`)."""
    return duration >= COVERAGE_SECS


def control_round(
    pending: Iterable[Fault], window: float, now: float, control_secs: float
) -> Fault | None:
    """The control-kill the next round takes, or None for an in-process round.

    The earliest pending control-kill due before ``window`` (the round's estimated end), only
    while control-kill rounds have taken at most :data:`CONTROL_SHARE` of the ``now`` seconds
    elapsed (``control_secs``), so in-process rounds, where every live kind can land, get at
    least the other half of the drill."""
    if control_secs > CONTROL_SHARE * now:
        return None
    due = [f for f in pending if f.kind in CONTROL and f.at < window]
    return min(due, key=lambda f: (f.at, f.seq), default=None)


def live_order(
    pending: Iterable[Fault], now: float, applied: Mapping[str, int], *, in_process: bool = True
) -> list[Fault]:
    """The live faults to try now, in the order to try them.

    Those due (``at <= now``) whose kind can land here: every live kind against an in-process
    fleet, only :data:`LANDS_OUTSIDE` against a control-kill round's child process. Kinds never
    applied (``applied``: count per kind) come first, a cancel storm after the other kinds (it
    ends its targets, so nothing else could land on them this round), then by time. The drill
    tries each in turn: one that cannot land yet stays pending without blocking the rest."""
    due = [
        f
        for f in pending
        if f.kind in LIVE + PROCESS + RAY
        and f.at <= now
        and (in_process or f.kind in LANDS_OUTSIDE)
    ]
    return sorted(
        due, key=lambda f: (applied.get(f.kind, 0) > 0, f.kind == "cancel-storm", f.at, f.seq)
    )


def owed_kinds(
    requested: Iterable[str],
    scheduled: Mapping[str, int],
    applied: Mapping[str, int],
    duration: float,
) -> tuple[str, ...]:
    """The requested kinds whose absence fails the drill: each kind never applied although the
    schedule held it, and, in a drill of :data:`COVERAGE_SECS` or more (whose schedule holds
    every requested kind), each requested kind never applied. ``scheduled`` and ``applied`` are
    counts per kind; a kind the schedule of a short drill never drew is not owed."""
    return tuple(
        k
        for k in requested
        if applied.get(k, 0) == 0 and (scheduled.get(k, 0) > 0 or coverage_required(duration))
    )


def fault_schedule(
    seed: int, rate: float, faults: Sequence[str], duration: float
) -> tuple[Fault, ...]:
    """The drill's faults: Poisson arrivals at ``rate`` per second over ``duration`` seconds,
    each kind drawn uniformly from ``faults``. Same arguments, same tuple.

    Coverage: in a drill of :data:`COVERAGE_SECS` or more every requested kind is scheduled at
    least once. A kind the Poisson draw missed (a low rate, many kinds) gets one extra arrival
    at a seeded uniform time, so the rule "every requested kind is applied" never asks the
    drill for a fault its schedule did not contain."""
    if rate <= 0 or duration <= 0:
        raise BadFaults(f"rate and duration must be positive (got {rate}, {duration})")
    kinds = parse_faults(list(faults))
    rng = random.Random(seed)
    drawn: list[tuple[float, str, int, int]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        drawn.append(
            (round(t, 4), rng.choice(kinds), rng.randrange(1 << 30), rng.randrange(1 << 30))
        )
    if coverage_required(duration):
        seen = {d[1] for d in drawn}
        for kind in (k for k in kinds if k not in seen):
            at = round(rng.uniform(0.0, duration), 4)
            drawn.append(
                (min(at, duration - 1e-4), kind, rng.randrange(1 << 30), rng.randrange(1 << 30))
            )
        drawn.sort(key=lambda d: d[0])
    return tuple(
        Fault(i, at, kind, target, param) for i, (at, kind, target, param) in enumerate(drawn)
    )


def estimated_round_secs(calls: int, call_ms: int) -> float:
    """What one synthetic round takes on the 2-core dev box (children run in parallel): 0.4 s
    of start-up and settlement plus each call's sleep and ~25 ms of provider/shell round trip."""
    return 0.4 + calls * (call_ms / 1000.0 + 0.025)


def child_name(i: int) -> str:
    return f"worker-{i}"


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scripted_entry(kind: str, param: int) -> list[str]:
    """The TOML body of the scripted message(s) that inject ``kind``."""
    if kind == "panic":
        return ['ral = ["fault panic"]']
    if kind == "worker-kill":
        return ['ral = ["let doomed = spawn { sleep 0.02; fault crash }; await $doomed"]']
    if kind == "stream-cut":
        return ['text = "partial answer, then the stream was cut"', 'error = "transport"']
    if kind == "truncated":
        return ['text = "a reply cut off at max_tok"', 'error = "truncated"']
    if kind == "malformed-args":
        return ['fn_arguments = "{\\"script\\": \\"let broken = "', 'ral = ["let broken = 1"]']
    if kind == "empty-reply":
        return ['text = ""', 'stop = "end_turn"']
    if kind == "rate-limit":
        return ['error = "rate_limit"', f"repeat = {1 + param % 3}"]
    raise BadFaults(f"{kind} is not a scripted fault")


@dataclass(frozen=True)
class Placed:
    """A scripted fault placed in a round: child index, before which call, and the fault."""

    child: int
    call: int
    fault: Fault


def place_scripted(faults: Iterable[Fault], agents: int, calls: int) -> list[Placed]:
    """Where each scripted fault's draws put it: child ``target % agents``, before call
    ``param % calls``."""
    return [
        Placed(f.target % agents, f.param % max(1, calls), f) for f in faults if f.kind in SCRIPTED
    ]


def _play_key(p: Placed) -> tuple[int, bool, int]:
    """The order a child plays its placed faults: by call; before one call, an ending fault
    after the others; then in schedule order."""
    return (p.call, p.fault.kind in ENDING, p.fault.seq)


def plan_scripted(
    faults: Iterable[Fault], agents: int, calls: int
) -> tuple[list[Placed], list[Fault]]:
    """A round's scripted faults, placed so that each can be played, and those left for a
    later round.

    A child plays nothing after an :data:`ENDING` fault, so each child gets at most one, moved
    after its other faults (to the latest of their calls if that is later than its own); any
    further ending fault of that child waits for a later round. Without this a busy round
    (seed 90413 at rate 5 placed ~16 scripted faults in 3 children) lost most of its faults
    behind an early stream cut."""
    placed = place_scripted(faults, agents, calls)
    out: list[Placed] = []
    later: list[Fault] = []
    for child in sorted({p.child for p in placed}):
        mine = [p for p in placed if p.child == child]
        rest = [p for p in mine if p.fault.kind not in ENDING]
        ending = sorted((p for p in mine if p.fault.kind in ENDING), key=lambda p: p.fault.seq)
        out += rest
        if ending:
            last = max((p.call for p in rest), default=0)
            out.append(Placed(child, max(ending[0].call, last), ending[0].fault))
            later += [p.fault for p in ending[1:]]
    return sorted(out, key=lambda p: (p.child, *_play_key(p))), later


def script_index(p: Placed, placed: Sequence[Placed], calls: int) -> int:
    """Position of ``p``'s message in its child's script (the faults before call k in play
    order, then call k), counting a rate-limit storm's repeats."""
    mine = sorted((q for q in placed if q.child == p.child), key=_play_key)
    n = 0
    for k in range(calls):
        for q in (q for q in mine if q.call == k):
            if q is p:
                return n
            n += 1 + (q.fault.param % 3 if q.fault.kind == "rate-limit" else 0)
        n += 1
    return n


def sure_calls(agents: int, calls: int, placed: Sequence[Placed]) -> int:
    """The ral calls (``Io`` records) a synthetic round makes whatever the timing: the trunk's
    ``agents`` spawn calls, then each child's calls before its ending fault. Nothing cancels a
    child in a control-kill round's child process, so a kill after at most this many calls
    lands before the trunk's reply ends the run."""
    n = agents
    for i in range(agents):
        ends = [p.call for p in placed if p.child == i and p.fault.kind in ENDING]
        n += min(ends) if ends else calls
    return n


def synthetic_scenario(
    agents: int, calls: int, *, call_ms: int = 20, placed: Sequence[Placed] = ()
) -> str:
    """A round's scenario (TOML): the trunk spawns ``agents`` children in one message and waits;
    each child makes ``calls`` ral calls (call ``k`` binds ``v<k>`` and sleeps ``call_ms``), then
    replies; every placed fault is an extra message before its call."""
    if agents < 1 or calls < 1:
        raise BadFaults("a synthetic fleet needs --agents >= 1 and --calls >= 1")
    lines = [
        "# generated by exarch-actors drill (runtime/drills/nemesis.py)",
        "[fleet]",
        f'prompt = "Drill: fan out to {agents} workers, collect their replies, reply."',
        "",
        "[[agents.trunk]]",
        "ral = ["
        + ", ".join(
            _toml_str(f"agent {child_name(i)} 'make {calls} calls, then reply'")
            for i in range(agents)
        )
        + "]",
        "",
        "[[agents.trunk]]",
        'text = "waiting for workers"',
        'stop = "end_turn"',
        f"repeat = {agents}",
        "",
        "[[agents.trunk]]",
        'ral = ["reply drill-done"]',
        "",
    ]
    secs = call_ms / 1000.0
    for i in range(agents):
        mine = sorted((p for p in placed if p.child == i), key=_play_key)
        for k in range(calls):
            for p in (p for p in mine if p.call == k):
                lines += [
                    f"[[agents.{child_name(i)}]]",
                    *_scripted_entry(p.fault.kind, p.fault.param),
                    "",
                ]
            script = f"let v{k} = {k}; sleep {secs}" if call_ms else f"let v{k} = {k}"
            lines += [f"[[agents.{child_name(i)}]]", f"ral = [{_toml_str(script)}]", ""]
        lines += [f"[[agents.{child_name(i)}]]", f'ral = ["reply {i}"]', ""]
    return "\n".join(lines)
