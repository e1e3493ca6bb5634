"""The ral Session: one persistent shell scope (ρ), its dynamic context, and runs against it.

A run is parsed and elaborated first; a syntax error or an unbound ``$name`` refuses it before
any phrase runs (``compiled=False``, nothing referenced). Otherwise the run's referenced names
(the harvest of its text, plus any ``use`` compiled during it) are reported to
``harvest_hook`` and the phrases run under a child of :attr:`Session.root_scope` (the last
run's, while it is uncancelled).

Invariants:
- ``define_hook`` is called at exactly one chokepoint: a top-level ``let``/``let rec`` of a run,
  before the name is bound; a hook that raises a ral error refuses the binding (nothing bound).
- ρ is copy-on-write from every closure's point of view: closures copy what they capture, so
  ``unset``/``restore``/rebinding never changes an existing closure.
- ral errors and cancellation come back in :attr:`RunResult.error`; any other exception (an
  internal fault such as ``fault panic``) propagates so the host can treat it as a panic.
- After any outcome the session is usable: depth counters, the run scope and ``running`` are
  reset in ``finally``.
- A run's cancel scope and ``Interp`` are the previous run's when that run ended with its scope
  uncancelled (building them cost ~2.5 us of a ~10 us trivial run), else new ones. So a
  cancelled scope is never reused; and a cancel is applied under the session's lock only to the
  scope of the run in flight (:meth:`Session.cancel`), so one aimed at a run that has ended
  finds no run and can never reach the next run through the shared scope. Every per-run field
  of the ``Interp`` (output, depth, referenced and defined names, context, Σ) is set afresh at
  the start of each run.
- A compiled program is reused only where compiling again would give the same program: the
  compile of a source depends on its text, the *names* bound in ρ (an unbound ``$name`` is an
  elaboration error, and a name's depth is where it resolves) and the names Σ answers (natives,
  ``fault``, the desk's verbs now), never on a value. So the cache (:data:`COMPILE_CACHE`
  entries by source text) is dropped whenever ρ gains or loses a name or Σ's names change;
  rebinding an existing name keeps it. Compiled closures hold no run state (that lives in the
  ``Activation`` and ``Interp`` of each run).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.drills.fault_switch import faults_enabled
from exarch_actors.runtime.ral.calls import Activation, ReturnSignal
from exarch_actors.runtime.ral.compile import Overlay, Scope, compile_program, harvest, no_gc
from exarch_actors.runtime.ral.context import Desk, DynamicContext, Grants, WorkerBackend
from exarch_actors.runtime.ral.errors import (
    CodecError,
    DeskRefusal,
    InternalPanic,
    MidRunRefused,
    RalError,
    RalSyntaxError,
)
from exarch_actors.runtime.ral.interp import Interp, Native
from exarch_actors.runtime.ral.natives import NATIVES, build_sigma
from exarch_actors.runtime.ral.nodes import Node
from exarch_actors.runtime.ral.parser import parse
from exarch_actors.runtime.ral.values import UNIT, Value, install_walk_check, remove_walk_check
from exarch_actors.runtime.ral.workers import ThreadWorkers

COMPILE_CACHE = 64
"""Compiled programs kept per session, by source text (least recently used dropped). An agent
repeats its scripts; parse, elaborate and harvest of ``1`` cost ~8 us of a ~20 us run."""

COMPILE_CACHE_MAX_SOURCE = 16384
"""Sources longer than this (characters) are compiled every time: the cache bounds its memory."""

RECURSION_FLOOR = 20000
"""The Python recursion limit a session ensures: ral's own limit (1000 nested calls, 7 Python
frames each) must trip long before Python's."""


@dataclass(frozen=True)
class ErrorInfo:
    message: str
    line: int
    col: int
    kind: str  # "syntax" | "elaboration" | "runtime" | "cancelled"


@dataclass(frozen=True)
class RunResult:
    value: Value
    stdout: str
    stderr: str
    error: ErrorInfo | None
    referenced: frozenset[str]
    compiled: bool
    defined: tuple[str, ...]
    shown: str = ""
    """``show(value)`` when the run was given ``show``: made inside the run's cancel scope."""


def _run_result(
    value: Value,
    stdout: str,
    stderr: str,
    error: ErrorInfo | None,
    referenced: frozenset[str],
    compiled: bool,
    defined: tuple[str, ...],
    shown: str,
) -> RunResult:
    """``RunResult(...)``, the equal value, made without the frozen dataclass's
    ``object.__setattr__`` per field (~1.1 us against ~0.4 us, of a ~7 us trivial run)."""
    r = object.__new__(RunResult)
    r.__dict__.update(
        value=value,
        stdout=stdout,
        stderr=stderr,
        error=error,
        referenced=referenced,
        compiled=compiled,
        defined=defined,
        shown=shown,
    )
    return r


_ABSENT = object()
_NO_VERBS: frozenset[str] = frozenset()


def _ensure_recursion_limit() -> None:
    if sys.getrecursionlimit() < RECURSION_FLOOR:
        sys.setrecursionlimit(RECURSION_FLOOR)


class Session:
    """A persistent ral shell. One run at a time; :meth:`cancel` may be called from any thread."""

    def __init__(
        self,
        *,
        context: DynamicContext | None = None,
        desk: Desk | None = None,
        workers: WorkerBackend | None = None,
        faults: bool | None = None,
        define_hook: Callable[[str, Value], None] | None = None,
        harvest_hook: Callable[[frozenset[str]], None] | None = None,
        root_scope: CancelScope | None = None,
    ) -> None:
        _ensure_recursion_limit()
        self.context = context if context is not None else DynamicContext()
        self.desk = desk
        self.faults = faults if faults is not None else faults_enabled()
        self.workers: WorkerBackend = (
            workers if workers is not None else ThreadWorkers(desk=desk, faults=self.faults)
        )
        self.define_hook = define_hook
        self.harvest_hook = harvest_hook
        self.root_scope = root_scope if root_scope is not None else CancelScope()
        self._rho: dict[str, Value] = {}
        self._run_scope: CancelScope | None = None
        self._interp: Interp | None = None
        """The last run's Interp (and its scope), reused while its scope is uncancelled."""
        self._lock = threading.Lock()
        self.running = False
        self._compiled: OrderedDict[str, tuple[list[Node], list[Any], frozenset[str]]] = (
            OrderedDict()
        )
        self._sigma_key: tuple[bool, frozenset[str]] | None = None
        self._sigma: dict[str, Native] = {}
        self._sigma_names: frozenset[str] = frozenset()
        self._sigma_verbs: object = None
        self._sigma_faults: object = None

    # -- running -------------------------------------------------------------------------
    def run(self, source: str, show: Callable[[Value], str] | None = None) -> RunResult:
        """``show``: how the result is displayed (``values.render``), applied to the value
        *inside* the run's cancel scope, so a cancel reaches a long rendering at its next walk
        check like any phrase -- rendered after the run, a value just under the size limit
        could only be stopped by killing its host."""
        with self._lock:
            if self.running:
                raise MidRunRefused("a run is already in flight on this session")
            self.running = True
        try:
            return self._run(source, show)
        finally:
            with self._lock:
                self.running = False
                self._run_scope = None

    def _current_sigma(self) -> dict[str, Native]:
        """Σ for this run, rebuilt only when its names change (which drops the compile cache)."""
        desk = self.desk
        if desk is None and self._sigma_verbs is _NO_VERBS and self.faults is self._sigma_faults:
            return self._sigma  # no desk: only ``faults`` could change Σ's names
        verbs = desk.verbs() if desk is not None else _NO_VERBS
        if (
            verbs is self._sigma_verbs
            and self.faults is self._sigma_faults
            and type(verbs) is frozenset
        ):
            return self._sigma  # the same immutable verbs: Σ's names cannot have changed
        self._sigma_verbs, self._sigma_faults = verbs, self.faults
        key = (self.faults, frozenset(verbs))
        if key != self._sigma_key:
            self._sigma = build_sigma(desk, self.faults)
            self._sigma_names = frozenset(self._sigma)
            self._sigma_key = key
            self._compiled.clear()
        return self._sigma

    def _compile(self, source: str) -> tuple[list[Node], list[Any], frozenset[str]]:
        cache = self._compiled
        got = cache.get(source)
        if got is not None:
            cache.move_to_end(source)
            return got
        with no_gc():
            phrases = parse(source)
            evs = compile_program(
                phrases, Scope("session", Overlay(self._rho.keys()), None), self._sigma_names
            )
        got = (phrases, evs, harvest(phrases))
        if len(source) <= COMPILE_CACHE_MAX_SOURCE:
            cache[source] = got
            if len(cache) > COMPILE_CACHE:
                cache.popitem(last=False)
        return got

    def _run(self, source: str, show: Callable[[Value], str] | None = None) -> RunResult:
        sigma = self._current_sigma()
        try:
            got = self._compiled.get(source)  # after _current_sigma: it may drop the cache
            if got is not None:
                self._compiled.move_to_end(source)
            else:
                got = self._compile(source)
            phrases, evs, referenced = got
        except RalSyntaxError as e:
            return RunResult(
                UNIT, "", "", ErrorInfo(e.message, e.line, e.col, e.kind), frozenset(), False, ()
            )
        except RecursionError:
            info = ErrorInfo("program nested too deeply", 1, 1, "syntax")
            return RunResult(UNIT, "", "", info, frozenset(), False, ())
        if self.harvest_hook is not None:
            self.harvest_hook(referenced)
        with self._lock:
            it = self._interp
            if it is None or it.scope._done:  # a cancelled run's scope is never reused
                it = self._interp = Interp(
                    ctx=self.context,
                    scope=self.root_scope.child(),
                    sigma=sigma,
                    workers=self.workers,
                    desk=self.desk,
                    session_vars=self._rho,
                    define=self._define,
                    worker_scope=self.root_scope,
                    on_harvest=self.harvest_hook,
                )
            else:
                it.begin(self.context, sigma, self._rho)
            scope = self._run_scope = it.scope
        act = Activation(self._rho, None, it)
        value: Any = UNIT
        error: ErrorInfo | None = None
        line, col = 1, 1
        shown: str | None = None
        walks = install_walk_check(it.poll)  # cancellable_walks, without its object
        try:
            try:
                for ev, node in zip(evs, phrases):
                    line, col = node.line, node.col
                    if it.stop:
                        it.poll()
                    value = ev(act)
            except ReturnSignal as r:
                value = r.value
            if show is not None:
                shown = show(value)
        except RalError as e:
            value = UNIT
            error = ErrorInfo(e.message, e.line or line, e.col or col, "runtime")
        except Cancelled:
            value = UNIT
            error = ErrorInfo("cancelled", line, col, "cancelled")
        except RecursionError:
            value = UNIT
            error = ErrorInfo("recursion limit", line, col, "runtime")
        finally:
            remove_walk_check(walks)
            if scope._done:  # tripped: neither this scope nor this Interp is reused
                self._interp = None
        if shown is None:  # an error's value (unit), or no show: nothing long to walk
            shown = show(value) if show is not None else ""
        result = _run_result(
            value,
            "".join(it.out),
            "".join(it.err),
            error,
            referenced | frozenset(it.referenced) if it.referenced else referenced,
            True,
            tuple(it.defined),
            shown,
        )
        if it.out:  # not kept alive until the next run
            it.out = []
        if it.err:
            it.err = []
        return result

    def _define(self, it: Interp, name: str, value: Value) -> None:
        if self.define_hook is not None:  # first: a hook that refuses (RalError) binds nothing
            self.define_hook(name, value)
        if name not in self._rho:
            self._compiled.clear()  # a new name: compiles that saw it unbound are stale
        self._rho[name] = value
        it.defined.append(name)

    def cancel(self, reason: str = "cancelled") -> None:
        """Trip the run in flight (no-op between runs). Thread-safe.

        Under the session's lock: the scope read is the run's in flight at the moment it is
        tripped, never a finished run's scope handed on to the next run (see the invariants)."""
        with self._lock:
            scope = self._run_scope
            if scope is not None:
                scope.cancel(reason)

    # -- the session scope ---------------------------------------------------------------
    def session_names(self) -> list[str]:
        return list(self._rho)

    def is_sigma(self, name: str) -> bool:
        if name in NATIVES:
            return True
        if name == "fault" and self.faults:
            return True
        return self.desk is not None and name in self.desk.verbs()

    def get(self, name: str) -> Value:
        return self._rho[name]

    def bindings(self) -> dict[str, Value]:
        return dict(self._rho)

    def unset(self, name: str) -> None:
        """Remove a session name (value and elaboration seed); refused mid-run."""
        with self._lock:
            if self.running:
                raise MidRunRefused(f"cannot unset {name} while a run is in flight")
            if self._rho.pop(name, _ABSENT) is not _ABSENT:
                self._compiled.clear()

    def restore(self, bindings: dict[str, Value], context: DynamicContext) -> None:
        """Replace ρ and the dynamic context (snapshot rollback); refused mid-run."""
        with self._lock:
            if self.running:
                raise MidRunRefused("cannot restore while a run is in flight")
            self._rho = dict(bindings)
            self._compiled.clear()
            self.context = context

    def close(self) -> None:
        """Cancel the root scope (every worker) and stop the default thread workers."""
        self.root_scope.cancel("session closed")
        shutdown = getattr(self.workers, "shutdown", None)
        if shutdown is not None:
            shutdown()


__all__ = [
    "CodecError",
    "DeskRefusal",
    "DynamicContext",
    "ErrorInfo",
    "Grants",
    "InternalPanic",
    "MidRunRefused",
    "RunResult",
    "Session",
]
