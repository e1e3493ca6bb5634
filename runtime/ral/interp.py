"""The runtime state of one evaluation (a session run, or a worker) and its effects on the world:
external programs and file paths.

This is the state compiled code reaches through ``activation.it`` and natives receive as their
first argument; Σ (:class:`Native` entries) is handed in by whoever builds the evaluation, so
this module knows no native, no compiler and no parser (``use`` is run by
:func:`runtime.ral.compile.use_file`).

Under exec grants a head runs exactly the file its grant resolved when it was made
(:meth:`runtime.ral.grants.Grants.program`); the session's ``PATH`` is consulted only when every
program is allowed. External programs run with argv (never a shell), in the context's cwd and
env, in their own process group (``start_new_session``) so that cancelling kills the whole
group. The evaluator polls the cancel scope every :data:`runtime.cancel.POLL_INTERVAL` (10 ms)
while a program runs, which keeps the 100 ms cancellation bound with a 10x margin.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exarch_actors.runtime.cancel import POLL_INTERVAL, Cancelled, CancelScope
from exarch_actors.runtime.ral.context import Desk, DynamicContext, WorkerBackend
from exarch_actors.runtime.ral.errors import RalError
from exarch_actors.runtime.ral.values import Builtin, render
from exarch_actors.runtime.shell.confinement import refusal_note


@dataclass(frozen=True)
class Native:
    """A Σ entry: ``fn(runtime, args) -> value`` taking ``lo``..``hi`` arguments (None: any)."""

    fn: Callable[[Interp, list[Any]], Any]
    lo: int
    hi: int | None
    doc: str = ""

    def arity_text(self) -> str:
        if self.hi == self.lo:
            return "1 argument" if self.lo == 1 else f"{self.lo} arguments"
        if self.hi is None:
            return f"at least {self.lo} argument{'s' if self.lo != 1 else ''}"
        return f"{self.lo} to {self.hi} arguments"


class Interp:
    """Everything a compiled node reaches through ``activation.it``."""

    def __init__(
        self,
        *,
        ctx: DynamicContext,
        scope: CancelScope,
        sigma: dict[str, Native],
        workers: WorkerBackend | None = None,
        desk: Desk | None = None,
        session_vars: dict[str, Any] | None = None,
        define: Callable[[Interp, str, Any], None] | None = None,
        worker_scope: CancelScope | None = None,
        on_harvest: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.scope = scope
        self.sigma = sigma
        self.workers = workers
        self.desk = desk
        self.session_vars = session_vars
        self._define = define
        self.worker_scope = worker_scope or scope
        self.on_harvest = on_harvest
        self.stop = False
        self.depth = 0
        self.out: list[str] = []
        self.err: list[str] = []
        self.referenced: set[str] = set()
        self.defined: list[str] = []
        scope.on_cancel(self._trip)

    def begin(self, ctx: DynamicContext, sigma: dict[str, Native], session_vars: Any) -> None:
        """Start another session run on this Interp (its scope uncancelled: see
        runtime/ral/session.py): every per-run field afresh."""
        self.ctx = ctx
        self.sigma = sigma
        self.session_vars = session_vars
        self.depth = 0
        # ``stop`` is left alone: False unless a cancel reached the scope since the session saw
        # it uncancelled, and then the trip must stand
        if self.referenced:
            self.referenced = set()
        if self.defined:
            self.defined = []
        if self.out:  # (the session empties them after each result; not after an escape)
            self.out = []
        if self.err:
            self.err = []

    def _trip(self) -> None:
        self.stop = True

    def poll(self) -> None:
        if self.stop:
            check_cancel(self)

    # -- names ---------------------------------------------------------------------------
    def define(self, name: str, value: Any) -> None:
        """A top-level ``let`` in a session run: the one chokepoint for session bindings."""
        if self._define is None or self.session_vars is None:
            raise RalError("no session scope to bind in")
        self._define(self, name, value)

    def global_value(self, name: str, line: int, col: int) -> Any:
        if name in self.sigma:
            return Builtin(name)
        raise RalError(f"undefined variable {name}", line, col)

    # -- paths and files -----------------------------------------------------------------
    def path(self, p: Any, what: str) -> str:
        """The absolute, lexically normalised path a file builtin names (``a/link/..`` is ``a``).

        Not yet confined: open it only through :mod:`runtime.ral.confine` (``files.py``), which
        resolves links and refuses anything outside the granted roots at the moment of use."""
        if type(p) is not str:
            raise RalError(f"{what}: a path must be a string, not {render(p)}")
        refuse_nul(p, f"{what}: the path")
        full = os.path.normpath(os.path.join(self.ctx.cwd, os.path.expanduser(p)))
        return full

    # -- external programs ---------------------------------------------------------------
    def run_program(self, name: str, argv: list[Any], line: int, col: int) -> Any:
        ctx = self.ctx
        refuse_nul(name, "the program name", line, col)
        resolved: str | None
        if ctx.grants.exec is not None:  # the granted file itself; the session's PATH is moot
            resolved = ctx.grants.program(name, ctx.cwd)
            if resolved is None:
                raise RalError(f"not granted: exec {name}", line, col)
        elif "/" in name:
            cand = os.path.normpath(os.path.join(ctx.cwd, name))
            resolved = cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None
        else:
            resolved = shutil.which(name, path=ctx.env.get("PATH", os.defpath))
        if resolved is None:
            raise RalError(f"unknown command {name} (not a binding, builtin or program)", line, col)
        args: list[str | bytes] = [name]
        for a in argv:
            _add_arg(args, a)
        for i, a in enumerate(args[1:], 1):
            refuse_nul(a, f"{name}: argument {i}", line, col)
        if self.stop:
            check_cancel(self)
        try:
            proc = subprocess.Popen(
                args,
                executable=resolved,
                cwd=ctx.cwd,
                env=ctx.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            note = refusal_note(ctx.sandbox, e)
            raise RalError(f"{name}: {_reason(e)}{note}", line, col) from None
        except ValueError as e:  # a NUL in the cwd or the environment (a restored context)
            raise RalError(f"{name}: cannot start: {e}", line, col) from None
        try:
            while True:
                try:
                    out, err = proc.communicate(timeout=POLL_INTERVAL)
                    break
                except subprocess.TimeoutExpired:
                    if self.stop:
                        check_cancel(self)
        except BaseException:
            _kill_group(proc)
            raise
        if err:
            self.err.append(err.decode("utf-8", "replace"))
        rc = proc.returncode
        if rc != 0:
            how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            raise RalError(f"{name} {how}", line, col)
        if out.endswith(b"\n"):
            out = out[:-1]
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            return out


def check_cancel(it: Interp) -> None:
    """Raise :class:`Cancelled` for a tripped evaluation (callers test ``it.stop`` first, which
    keeps the hot loops free of a call)."""
    raise Cancelled(it.scope.reason or "cancelled")


def refuse_nul(s: str | bytes, what: str, line: int = 0, col: int = 0) -> None:
    """Refuse a NUL character where the OS takes a C string (an argument, a path, an env var).

    ral strings may hold NUL (a program's output, a file's text, a ``"..."`` literal with a raw
    NUL in it); the OS cannot: Python would raise ``ValueError: embedded null byte``.
    """
    if ("\0" in s) if isinstance(s, str) else (b"\0" in s):
        raise RalError(f"{what} contains a NUL character, which the OS cannot pass", line, col)


def _add_arg(args: list[str | bytes], a: Any) -> None:
    t = type(a)
    if t is str or t is bytes:
        args.append(a)
    elif t is list:  # a list passes each item as its own argument
        for x in a:
            args.append(x if type(x) in (str, bytes) else render(x))
    else:
        args.append(render(a))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()
    for s in (proc.stdout, proc.stderr):
        if s is not None:
            s.close()


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


__all__ = ["Cancelled", "Interp", "Native", "check_cancel", "refuse_nul"]
