"""The seeded nemesis: a deterministic fault schedule and the synthetic fleet it breaks.

Pure: no clocks, no processes. Given ``seed``, ``rate`` (faults per second, a Poisson process),
the fault kinds and a duration, :func:`fault_schedule` returns the same sequence of
:class:`Fault` every time (``random.Random(seed)``, nothing else); the drill (``cli/drill.py``)
applies it. :func:`synthetic_scenario` writes the scenario of one drill round: a trunk fanning
out to N children, each making M ral calls that define bindings, with the round's *scripted*
faults embedded at deterministic positions.

Catalog (``FAULT_KINDS``), by how each is delivered:

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
  ``exarch-actors resume`` finishes it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from runtime.errors import ExarchError

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
FAULT_KINDS = SCRIPTED + LIVE + CONTROL

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
    }
)
"""Kinds after which the affected agent is expected to make another successful call (a
provider error ends a child ``down``; a cancel ends it; a clear empties it)."""


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


def parse_faults(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"a,b,c"`` or ``"all"`` → the kinds, in catalog order; unknown names are refused."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    if names == ["all"]:
        return FAULT_KINDS
    unknown = [n for n in names if n not in FAULT_KINDS]
    if unknown or not names:
        raise BadFaults(
            f"unknown fault kind(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(FAULT_KINDS)} or all"
        )
    return tuple(k for k in FAULT_KINDS if k in names)


def fault_schedule(
    seed: int, rate: float, faults: Sequence[str], duration: float
) -> tuple[Fault, ...]:
    """The drill's faults: Poisson arrivals at ``rate`` per second over ``duration`` seconds,
    each kind drawn uniformly from ``faults``. Same arguments, same tuple."""
    if rate <= 0 or duration <= 0:
        raise BadFaults(f"rate and duration must be positive (got {rate}, {duration})")
    kinds = parse_faults(list(faults))
    rng = random.Random(seed)
    out: list[Fault] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        out.append(
            Fault(
                len(out),
                round(t, 4),
                rng.choice(kinds),
                rng.randrange(1 << 30),
                rng.randrange(1 << 30),
            )
        )
    return tuple(out)


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
    return [
        Placed(f.target % agents, f.param % max(1, calls), f) for f in faults if f.kind in SCRIPTED
    ]


def synthetic_scenario(
    agents: int, calls: int, *, call_ms: int = 20, placed: Sequence[Placed] = ()
) -> str:
    """A round's scenario (TOML): the trunk spawns ``agents`` children in one message and waits;
    each child makes ``calls`` ral calls (call ``k`` binds ``v<k>`` and sleeps ``call_ms``), then
    replies; every placed fault is an extra message before its call."""
    if agents < 1 or calls < 1:
        raise BadFaults("a synthetic fleet needs --agents >= 1 and --calls >= 1")
    lines = [
        "# generated by exarch-actors drill (runtime/nemesis.py)",
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
        mine = sorted((p for p in placed if p.child == i), key=lambda p: (p.call, p.fault.seq))
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
