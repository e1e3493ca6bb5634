"""Executors: the one interface through which a child's execution environment is provisioned,
observed and torn down — and the wrappers that decorate it without dropping any of it.

Invariants:
- The interface is two protocols: :class:`Executor` (required surfaces) and
  :class:`OptionalSurfaces`. An optional surface is *absent* (no attribute) when an executor does
  not implement it; absence is the one legitimate "not implemented" answer, so a wrapper must
  never turn a present surface into an absent one. :class:`DelegatingExecutor` guarantees this by
  construction: every attribute it does not define is looked up on the executor it wraps
  (``__getattr__``), so presence and absence both propagate through any depth of wrapping. The
  field report on an earlier design saw two allowlist wrappers drop ``release_retained``,
  ``recover``, ``cancel`` and ``accounting``; there is no allowlist here to forget.
- A :class:`Receipt` says whether *this executor's own action* destroyed the environment
  (``destroyed``) and, separately, what the environment is now (``state``). "Gone" (it ended
  abnormally outside our teardown — the stopped-sandbox case) and "alive but undeletable" are both
  ``destroyed=False`` and differ in ``state``, so a slot can close on either while a sweeper still
  learns what is left to delete.
- :meth:`cancel` answers ``accepted`` only on an acknowledgement (the process was observed to
  end); a signal sent with no observed effect is ``unknown``, never ``accepted``.

The one implementation for OS processes, ``LocalProcessExecutor``, lives in
:mod:`runtime.settlement.local_executor` (which imports this interface; nothing here imports it
back).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import ExarchError

__all__ = [
    "OPTIONAL_SURFACES",
    "REQUIRED_SURFACES",
    "Accounting",
    "Backoff",
    "CancelAck",
    "CancelAnswer",
    "CompletionGate",
    "DelegatingExecutor",
    "DeliverableCheck",
    "EnvironmentState",
    "Execution",
    "ExecutionResult",
    "ExecutionSpec",
    "Executor",
    "ExecutorMisuse",
    "Grace",
    "InFlight",
    "Observation",
    "OptionalSurfaces",
    "PreSpawnRefusal",
    "Receipt",
    "RetryPreSpawnRefusals",
    "Starter",
    "scratch_file_deliverable",
    "surface",
]

Grace = float | Literal["brutal-kill", "infinity"]
"""Seconds between SIGTERM and SIGKILL; ``"brutal-kill"`` = SIGKILL at once; ``"infinity"`` =
SIGTERM and wait for as long as it takes."""


class PreSpawnRefusal(ExarchError):
    """The environment could not be provisioned and nothing was started: retrying is safe."""

    def __init__(self, environment_id: str, reason: str) -> None:
        self.environment_id = environment_id
        self.reason = reason
        super().__init__(
            f"pre-spawn refusal for {environment_id}: {reason}; nothing was started, retry is safe"
        )


class ExecutorMisuse(ExarchError):
    """A surface was called in a state that cannot serve it (e.g. execute twice)."""


class EnvironmentState(StrEnum):
    """What an environment is after a teardown attempt: destroyed by us, gone on its own, or still
    there — typed, because a sweeper acts differently on each."""

    DESTROYED = "destroyed"  # this executor ended it (or it completed cleanly) and removed scratch
    NEVER_PROVISIONED = "never-provisioned"  # nothing was ever started
    GONE = "gone"  # ended abnormally outside our teardown; scratch kept as evidence
    ALIVE_UNDELETABLE = "alive-undeletable"  # still running, or its scratch cannot be removed
    UNKNOWN = "unknown"  # could not be observed


@dataclass(frozen=True)
class Receipt:
    """One teardown's answer. ``destroyed`` is the gate; ``state`` says what remains."""

    destroyed: bool
    detail: str
    environment_id: str
    state: EnvironmentState = EnvironmentState.UNKNOWN
    pid: int | None = None
    scratch: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "destroyed": self.destroyed,
            "detail": self.detail,
            "environmentId": self.environment_id,
            "state": str(self.state),
            "pid": self.pid,
            "scratch": self.scratch,
        }


CancelAnswer = Literal["accepted", "rejected", "already-terminal", "unknown"]


@dataclass(frozen=True)
class CancelAck:
    answer: CancelAnswer
    detail: str


@dataclass(frozen=True)
class Accounting:
    """Spend of one execution. ``None`` means unknown, never zero."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    unmetered_turns: int = 0  # turns whose provider reported no usage
    wall_seconds: float | None = None
    cache_write: int | None = None
    cache_read: int | None = None
    """Parts of ``tokens_in`` written to / read from a prompt cache (``None``: not metered)."""
    cost_usd: str | None = None
    """The cost in US dollars (``runtime/settlement/cost.py``); ``None`` means unknown, never
    zero."""

    @property
    def tokens_known(self) -> bool:
        return (
            self.tokens_in is not None and self.tokens_out is not None and not self.unmetered_turns
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tokensIn": self.tokens_in,
            "tokensOut": self.tokens_out,
            "tokensKnown": self.tokens_known,
            "unmeteredTurns": self.unmetered_turns,
            "wallSeconds": self.wall_seconds,
            "cacheWrite": self.cache_write,
            "cacheRead": self.cache_read,
            "costUsd": self.cost_usd,
        }


@dataclass(frozen=True)
class InFlight:
    """What the child was doing when its environment is given up: the in-flight turn's provider
    events (that turn's output) and the path of its shell's durable snapshot."""

    turn: int | None = None
    events: tuple[dict[str, Any], ...] = ()
    snapshot_path: str | None = None


Starter = Callable[[Path], "subprocess.Popen[bytes]"]


@dataclass(frozen=True)
class ExecutionSpec:
    """The work: an argv, or a callable that starts the process given the scratch directory."""

    node_id: str
    argv: tuple[str, ...] = ()
    starter: Starter | None = None
    env: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Execution:
    """A provisioned environment: enough for a sweeper (or a resumer) to find it again."""

    environment_id: str
    node_id: str
    pid: int
    scratch: str
    pid_started_at: float | None  # psutil create_time: guards against pid reuse on adopt


@dataclass(frozen=True)
class ExecutionResult:
    status: Literal["done", "down"]
    exit_code: int | None
    reason: str = ""


@dataclass(frozen=True)
class Observation:
    state: Literal["running", "exited", "never-started", "unknown"]
    exit_code: int | None = None
    detail: str = ""


class Executor(Protocol):
    """Required surfaces."""

    @property
    def environment_id(self) -> str: ...

    def execute(self, spec: ExecutionSpec) -> Execution: ...

    def result(self, timeout: float | None = None) -> ExecutionResult | None: ...

    def teardown(self, grace: Grace) -> Receipt: ...


class OptionalSurfaces(Protocol):
    """Optional surfaces: absent when not implemented. Look them up with :func:`surface`."""

    def release_retained(self) -> list[Receipt]: ...

    def recover(self) -> Execution | None: ...

    def cancel(self) -> CancelAck: ...

    def accounting(self) -> Accounting: ...

    def observe(self) -> Observation: ...

    def in_flight(self) -> InFlight: ...


def _members(proto: type) -> tuple[str, ...]:
    return tuple(n for n in vars(proto) if not n.startswith("_"))


REQUIRED_SURFACES: tuple[str, ...] = _members(Executor)
OPTIONAL_SURFACES: tuple[str, ...] = _members(OptionalSurfaces)


def surface(executor: object, name: str) -> Callable[..., Any] | None:
    """The bound optional surface ``name`` of ``executor``, or ``None`` if it is absent."""
    if name not in OPTIONAL_SURFACES:
        raise ExecutorMisuse(f"{name!r} is not an optional executor surface: {OPTIONAL_SURFACES}")
    fn = getattr(executor, name, None)
    return fn if callable(fn) else None


# --------------------------------------------------------------------------- wrappers


class DelegatingExecutor:
    """Base of every wrapper: forwards every surface it does not override, by construction.

    The required surfaces are spelled out (so type checkers see them); every other attribute —
    each optional surface included, and any surface added later — resolves on the inner executor
    through ``__getattr__``. An optional surface the inner executor lacks is absent here too.
    """

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    @property
    def inner(self) -> Executor:
        return self._inner

    @property
    def environment_id(self) -> str:
        return self._inner.environment_id

    def execute(self, spec: ExecutionSpec) -> Execution:
        return self._inner.execute(spec)

    def result(self, timeout: float | None = None) -> ExecutionResult | None:
        return self._inner.result(timeout)

    def teardown(self, grace: Grace) -> Receipt:
        return self._inner.teardown(grace)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._inner)))


@dataclass(frozen=True)
class Backoff:
    """Bounded exponential backoff: ``attempts`` tries, delays ``base * factor**k`` capped."""

    attempts: int = 3
    base: float = 0.05
    factor: float = 2.0
    cap: float = 2.0

    def delays(self) -> list[float]:
        return [min(self.cap, self.base * self.factor**k) for k in range(max(0, self.attempts - 1))]


class RetryPreSpawnRefusals(DelegatingExecutor):
    """Retries ``execute`` on :class:`PreSpawnRefusal` (nothing started, so retry is safe)."""

    def __init__(
        self, inner: Executor, backoff: Backoff | None = None, scope: CancelScope | None = None
    ) -> None:
        super().__init__(inner)
        self._backoff = backoff or Backoff()
        self._scope = scope
        self.refusals: list[PreSpawnRefusal] = []

    def execute(self, spec: ExecutionSpec) -> Execution:
        delays = self._backoff.delays()
        for attempt in range(len(delays) + 1):
            try:
                return self._inner.execute(spec)
            except PreSpawnRefusal as e:
                self.refusals.append(e)
                if attempt == len(delays):
                    raise
                if self._scope is not None:
                    self._scope.check()
                    self._scope.wait(delays[attempt])
                    self._scope.check()
                else:
                    time.sleep(delays[attempt])
        raise AssertionError("unreachable")  # pragma: no cover


DeliverableCheck = Callable[[ExecutionResult, Execution | None], str | None]
"""Returns ``None`` when the deliverable is present, else why it is not."""


class CompletionGate(DelegatingExecutor):
    """Gates settlement on a deliverable: a ``done`` result without it settles ``down``."""

    def __init__(self, inner: Executor, deliverable: DeliverableCheck) -> None:
        super().__init__(inner)
        self._deliverable = deliverable
        self._execution: Execution | None = None

    def execute(self, spec: ExecutionSpec) -> Execution:
        self._execution = self._inner.execute(spec)
        return self._execution

    def result(self, timeout: float | None = None) -> ExecutionResult | None:
        res = self._inner.result(timeout)
        if res is None or res.status != "done":
            return res
        ex = (
            self._execution
            if self._execution is not None
            else getattr(self._inner, "execution", None)
        )
        missing = self._deliverable(res, ex if isinstance(ex, Execution) else None)
        if missing is None:
            return res
        return replace(res, status="down", reason=f"deliverable check failed: {missing}")


def scratch_file_deliverable(name: str) -> DeliverableCheck:
    """A deliverable check: the file ``name`` exists in the environment's scratch directory."""

    def check(_res: ExecutionResult, ex: Execution | None) -> str | None:
        if ex is None:
            return "no execution"
        return None if (Path(ex.scratch) / name).exists() else f"{name} missing in {ex.scratch}"

    return check
