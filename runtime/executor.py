"""Executors: the one interface through which a child's execution environment is provisioned,
observed and torn down — and the wrappers that decorate it without dropping any of it.

Invariants:
- The interface is two protocols: :class:`Executor` (required surfaces) and
  :class:`OptionalSurfaces`. An optional surface is *absent* (no attribute) when an executor does
  not implement it; absence is the one legitimate "not implemented" answer, so a wrapper must
  never turn a present surface into an absent one. :class:`DelegatingExecutor` guarantees this by
  construction: every attribute it does not define is looked up on the executor it wraps
  (``__getattr__``), so presence and absence both propagate through any depth of wrapping. The
  field report (seed 003) measured two allowlist wrappers silently dropping ``release_retained``,
  ``recover``, ``cancel`` and ``accounting``; there is no allowlist here to forget.
- A :class:`Receipt` says whether *this executor's own action* destroyed the environment
  (``destroyed``) and, separately, what the environment is now (``state``). "Gone" (it ended
  abnormally outside our teardown — the stopped-sandbox case) and "alive but undeletable" are both
  ``destroyed=False`` and differ in ``state``, so a slot can close on either while a sweeper still
  learns what is left to delete.
- :meth:`cancel` answers ``accepted`` only on an acknowledgement (the process was observed to
  end); a signal sent with no observed effect is ``unknown``, never ``accepted``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil

from runtime.cancel import POLL_INTERVAL, CancelScope
from runtime.errors import ExarchError

Grace = float | Literal["brutal-kill", "infinity"]
"""Seconds between SIGTERM and SIGKILL; ``"brutal-kill"`` = SIGKILL at once; ``"infinity"`` =
SIGTERM and wait for as long as it takes."""

KILL_REAP_TIMEOUT = 5.0
"""Seconds to wait for a SIGKILLed process to disappear before calling it undeletable (a process
in uninterruptible sleep can outlive SIGKILL; 5 s is over two orders above the < 20 ms measured
here from SIGKILL to reaped for ``sleep`` and ``python``)."""

CANCEL_ACK_TIMEOUT = 0.5
"""Seconds :meth:`LocalProcessExecutor.cancel` waits to observe the process end after SIGTERM
before answering ``unknown``."""


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
    """What an environment is after a teardown attempt — the typed distinction seed 003 asks for."""

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


# --------------------------------------------------------------------------- local processes


class LocalProcessExecutor:
    """One environment = one OS process (its own session/process group) + one scratch directory.

    Teardown kills the whole process group, so a shell's worker processes go with it.
    """

    def __init__(
        self,
        scratch_root: str | os.PathLike[str] | None = None,
        *,
        environment_id: str | None = None,
        release_grace: Grace = 1.0,
        in_flight_source: Callable[[], InFlight] | None = None,
    ) -> None:
        self._env_id = environment_id or f"local-{uuid.uuid4().hex[:12]}"
        self._scratch_root = Path(scratch_root) if scratch_root else Path(tempfile.gettempdir())
        self._release_grace = release_grace
        self._in_flight_source = in_flight_source
        self._lock = threading.RLock()
        self._popen: subprocess.Popen[bytes] | None = None
        self._ps: psutil.Process | None = None
        self._execution: Execution | None = None
        self._scratch: Path | None = None
        self._signalled = False  # this executor sent the signal that ended the process
        self._own_group = False  # the process leads its own process group (pgid == pid)
        self._destroyed: Receipt | None = None
        self._started = 0.0
        self._ended: float | None = None
        self._tokens_in: int | None = None
        self._tokens_out: int | None = None
        self._unmetered = 0

    # -- construction for resume

    @classmethod
    def adopt(
        cls,
        environment_id: str,
        pid: int,
        scratch: str,
        pid_started_at: float | None,
        *,
        node_id: str = "",
        release_grace: Grace = 1.0,
    ) -> LocalProcessExecutor:
        """An executor for an environment a dead control process started (not our child)."""
        ex = cls(Path(scratch).parent, environment_id=environment_id, release_grace=release_grace)
        ex._scratch = Path(scratch)
        ex._execution = Execution(environment_id, node_id, pid, scratch, pid_started_at)
        ex._ps = _same_process(pid, pid_started_at)
        ex._own_group = ex._ps is not None and _leads_group(pid)
        return ex

    # -- required surfaces

    @property
    def environment_id(self) -> str:
        return self._env_id

    @property
    def execution(self) -> Execution | None:
        return self._execution

    def execute(self, spec: ExecutionSpec) -> Execution:
        with self._lock:
            if self._execution is not None:
                raise ExecutorMisuse(f"{self._env_id} already executed; one environment per run")
            try:
                self._scratch_root.mkdir(parents=True, exist_ok=True)
                scratch = Path(tempfile.mkdtemp(prefix=f"{self._env_id}-", dir=self._scratch_root))
            except OSError as e:
                raise PreSpawnRefusal(self._env_id, f"scratch directory: {e}") from e
            try:
                if spec.starter is not None:
                    popen = spec.starter(scratch)
                elif spec.argv:
                    popen = subprocess.Popen(
                        list(spec.argv),
                        cwd=scratch,
                        env=dict(spec.env) if spec.env is not None else None,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                else:
                    raise PreSpawnRefusal(self._env_id, "spec has neither argv nor starter")
            except PreSpawnRefusal:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            except OSError as e:
                shutil.rmtree(scratch, ignore_errors=True)
                raise PreSpawnRefusal(self._env_id, f"start: {e}") from e
            self._popen = popen
            self._own_group = _leads_group(popen.pid)
            self._scratch = scratch
            self._started = time.monotonic()
            try:
                self._ps = psutil.Process(popen.pid)
                started_at: float | None = self._ps.create_time()
            except psutil.Error:
                started_at = None
            self._execution = Execution(
                self._env_id, spec.node_id, popen.pid, str(scratch), started_at
            )
            return self._execution

    def result(self, timeout: float | None = None) -> ExecutionResult | None:
        rc = self._wait(timeout)
        if rc is None:
            return None
        if rc == 0:
            return ExecutionResult("done", 0)
        how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        return ExecutionResult("down", rc, f"process ended with {how}")

    def teardown(self, grace: Grace) -> Receipt:
        with self._lock:
            if self._destroyed is not None:
                return self._destroyed
            ex = self._execution
            if ex is None:
                return Receipt(
                    True,
                    "never provisioned: nothing to destroy",
                    self._env_id,
                    EnvironmentState.NEVER_PROVISIONED,
                )
            rc = self._poll()
            if rc is not None and not self._signalled and rc != 0:
                self._kill_group(signal.SIGKILL)  # stragglers of a crashed leader
                return self._receipt(
                    False,
                    f"already gone: process {ex.pid} ended with {_describe(rc)} before teardown, "
                    "not by this executor; scratch kept as evidence",
                    EnvironmentState.GONE,
                )
            if rc is None:
                self._signalled = True
                if grace == "brutal-kill":
                    self._kill_group(signal.SIGKILL)
                    rc = self._wait(KILL_REAP_TIMEOUT)
                elif grace == "infinity":
                    self._kill_group(signal.SIGTERM)
                    rc = self._wait(None)
                else:
                    self._kill_group(signal.SIGTERM)
                    rc = self._wait(float(grace))
                    if rc is None:
                        self._kill_group(signal.SIGKILL)
                        rc = self._wait(KILL_REAP_TIMEOUT)
                if rc is None:
                    return self._receipt(
                        False,
                        f"process {ex.pid} alive after SIGKILL",
                        EnvironmentState.ALIVE_UNDELETABLE,
                    )
            self._kill_group(signal.SIGKILL)
            try:
                if self._scratch is not None and self._scratch.exists():
                    shutil.rmtree(self._scratch)
            except OSError as e:
                return self._receipt(
                    False,
                    f"process ended; scratch undeletable: {e}",
                    EnvironmentState.ALIVE_UNDELETABLE,
                )
            how = "completed" if not self._signalled else "terminated"
            self._destroyed = self._receipt(
                True,
                f"process {ex.pid} {how} ({_describe(rc)}); scratch removed",
                EnvironmentState.DESTROYED,
            )
            return self._destroyed

    # -- optional surfaces

    def release_retained(self) -> list[Receipt]:
        """Receipts for the retained environment; ``[]`` when nothing was ever provisioned."""
        with self._lock:
            if self._execution is None:
                return []
            return [self.teardown(self._release_grace)]

    def recover(self) -> Execution | None:
        """Reattach to the environment if its process is still the one we started; never start
        replacement work."""
        ex = self._execution
        if ex is None:
            return None
        return ex if self._poll() is None else None

    def cancel(self) -> CancelAck:
        with self._lock:
            if self._execution is None:
                return CancelAck("rejected", "nothing was provisioned, nothing to cancel")
            rc = self._poll()
            if rc is not None:
                return CancelAck("already-terminal", f"process had ended ({_describe(rc)})")
            self._signalled = True
            self._kill_group(signal.SIGTERM)
            rc = self._wait(CANCEL_ACK_TIMEOUT)
            if rc is None:
                return CancelAck(
                    "unknown", f"SIGTERM sent; no exit observed in {CANCEL_ACK_TIMEOUT}s"
                )
            return CancelAck("accepted", f"process ended after SIGTERM ({_describe(rc)})")

    def accounting(self) -> Accounting:
        wall = None
        if self._started:
            wall = (self._ended if self._ended is not None else time.monotonic()) - self._started
        return Accounting(self._tokens_in, self._tokens_out, self._unmetered, wall)

    def observe(self) -> Observation:
        if self._execution is None:
            return Observation("never-started")
        try:
            rc = self._poll()
        except Exception as e:  # observation failing is itself the answer
            return Observation("unknown", None, f"{type(e).__name__}: {e}")
        if rc is None:
            return Observation("running")
        return Observation("exited", rc, _describe(rc))

    def in_flight(self) -> InFlight:
        return self._in_flight_source() if self._in_flight_source is not None else InFlight()

    # -- accounting input

    def charge(self, tokens_in: int | None, tokens_out: int | None) -> None:
        """Record one turn's usage; ``None`` marks the turn unmetered (unknown, not zero)."""
        with self._lock:
            if tokens_in is None or tokens_out is None:
                self._unmetered += 1
                return
            self._tokens_in = (self._tokens_in or 0) + tokens_in
            self._tokens_out = (self._tokens_out or 0) + tokens_out

    # -- internals

    def _receipt(self, destroyed: bool, detail: str, state: EnvironmentState) -> Receipt:
        ex = self._execution
        return Receipt(
            destroyed,
            detail,
            self._env_id,
            state,
            ex.pid if ex else None,
            str(self._scratch) if self._scratch else None,
        )

    def _poll(self) -> int | None:
        if self._popen is not None:
            rc = self._popen.poll()
        elif self._ps is not None:
            rc = None if _alive(self._ps) else _foreign_rc(self._ps)
        else:
            rc = _GONE_RC  # adopted, and the pid is not the process we started
        if rc is not None and self._ended is None and self._started:
            self._ended = time.monotonic()
        return rc

    def _wait(self, timeout: float | None) -> int | None:
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
            return self._poll()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rc = self._poll()
            if rc is not None or (deadline is not None and time.monotonic() >= deadline):
                return rc
            time.sleep(POLL_INTERVAL)

    def _kill_group(self, sig: signal.Signals) -> None:
        ex = self._execution
        if ex is None or (self._popen is None and self._ps is None):
            return  # never signal a pid that is no longer the process we started
        if self._own_group:
            try:  # the group outlives a reaped leader while any worker of it lives
                os.killpg(ex.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            return
        try:
            if self._popen is not None:
                if self._popen.poll() is None:
                    self._popen.send_signal(sig)
            elif self._ps is not None and _alive(self._ps):
                self._ps.send_signal(sig)
        except (ProcessLookupError, psutil.Error):
            pass


_GONE_RC = -int(signal.SIGKILL)
"""Exit code reported for an adopted process that is gone: its real status went to its parent."""


def _same_process(pid: int, started_at: float | None) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        if started_at is not None and abs(p.create_time() - started_at) > 0.01:
            return None  # pid reused by another process: not ours to touch
        return p
    except psutil.Error:
        return None


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _foreign_rc(p: psutil.Process) -> int:
    try:
        rc = p.wait(0)  # reaps if it is our child; otherwise the status is not ours to read
        return rc if isinstance(rc, int) else _GONE_RC
    except (psutil.Error, ChildProcessError):
        return _GONE_RC


def _describe(rc: int) -> str:
    return f"signal {-rc}" if rc < 0 else f"exit code {rc}"


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
