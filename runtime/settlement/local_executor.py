"""The local-process executor: one environment = one OS process in its own process group plus one
scratch directory, implementing every surface of :mod:`runtime.settlement.executor`.

Invariants:
- Teardown kills the whole process group, so a shell's worker processes go with it; a process
  that ended abnormally outside our teardown is ``gone`` (scratch kept as evidence), one alive
  after SIGKILL or with an undeletable scratch is ``alive-undeletable``.
- :meth:`LocalProcessExecutor.cancel` answers ``accepted`` only on an acknowledgement (the process
  was observed to end within :data:`CANCEL_ACK_TIMEOUT`); a signal sent with no observed effect
  is ``unknown``, never ``accepted``.
- A pid is never signalled unless it is still the process this executor started (or, on
  ``adopt``, the one whose psutil create time matches): pid reuse cannot redirect a kill.
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
from collections.abc import Callable
from pathlib import Path

import psutil

from exarch_actors.runtime.cancel import POLL_INTERVAL
from exarch_actors.runtime.settlement.executor import (
    Accounting,
    CancelAck,
    EnvironmentState,
    Execution,
    ExecutionResult,
    ExecutionSpec,
    ExecutorMisuse,
    Grace,
    InFlight,
    Observation,
    PreSpawnRefusal,
    Receipt,
)
from exarch_actors.runtime.state.private import private_dirs

__all__ = ["CANCEL_ACK_TIMEOUT", "KILL_REAP_TIMEOUT", "LocalProcessExecutor"]

KILL_REAP_TIMEOUT = 5.0
"""Seconds to wait for a SIGKILLed process to disappear before calling it undeletable (a process
in uninterruptible sleep can outlive SIGKILL; 5 s is over two orders above the < 20 ms measured
here from SIGKILL to reaped for ``sleep`` and ``python``)."""

CANCEL_ACK_TIMEOUT = 0.5
"""Seconds :meth:`LocalProcessExecutor.cancel` waits to observe the process end after SIGTERM
before answering ``unknown``."""


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
                private_dirs(self._scratch_root)
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
