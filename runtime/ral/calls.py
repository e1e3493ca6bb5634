"""Calling at run time: activation records, closure and native calls, indexing.

An :class:`Activation` holds the variables of one scope while it runs, and mirrors an
elaboration scope (:class:`runtime.ral.compile.Scope`) one to one: the session activation (its
``vars`` *is* ρ), one per closure call (captured bindings + parameters; its parent is ``None``,
so a closure body can reach only what it captured, Σ and PATH), and one per execution of an
if/for/try body that binds names. Compiled code reaches the evaluation's state through
``activation.it`` (:class:`runtime.ral.interp.Interp`).

Invariants:
- a call nests at most :data:`MAX_DEPTH` deep; one deeper is the ral error ``recursion limit``;
- a native's Python failure (``ValueError``, ``OSError``, a codec refusal, ``MemoryError``, ...)
  leaves as a :class:`RalError` at the call site, never as a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.ral.errors import RalError
from exarch_actors.runtime.ral.interp import Interp
from exarch_actors.runtime.ral.values import Builtin, Closure, render, type_name

Ev = Callable[["Activation"], Any]
"""A compiled node: evaluates it in an activation."""

MAX_DEPTH = 1000
"""Deepest ral call nesting before the ral error ``recursion limit``.

Measured: one ral call level costs 7 Python frames here (2855 levels fit in 20000); 1000 levels
stay far inside the
interpreter recursion limit the session raises to (20000) and inside a thread's stack.
"""


class Activation:
    """The variables of one running scope, its enclosing activation, and the evaluation."""

    __slots__ = ("it", "parent", "vars")

    def __init__(self, vars: dict[str, Any], parent: Activation | None, it: Interp) -> None:
        self.vars = vars
        self.parent = parent
        self.it = it


class ReturnSignal(Exception):
    """``return EXPR``: unwinds to the innermost closure call (or the end of the run/file)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class BlockCode:
    """A compiled closure literal, shared by every closure made from that node (it implements
    :class:`runtime.ral.values.CompiledBody`)."""

    __slots__ = ("captures", "col", "line", "occ", "params", "run", "source")

    def __init__(
        self,
        params: tuple[str, ...],
        run: Ev,
        captures: tuple[tuple[str, Ev], ...],
        source: str,
        line: int,
        col: int,
        occ: frozenset[str],
    ) -> None:
        self.params = params
        self.run = run
        self.captures = captures
        self.source = source
        self.line = line
        self.col = col
        self.occ = occ


def call_closure(it: Interp, c: Closure, argv: list[Any], line: int, col: int, who: str) -> Any:
    code = c.body
    params = code.params
    if len(argv) != len(params):
        raise RalError(f"{who}: expected {_nargs(len(params))}, got {len(argv)}", line, col)
    vs = dict(c.captured)
    if c.rec_name is not None:
        vs[c.rec_name] = c
    if params:
        vs.update(zip(params, argv))
    it.depth += 1
    try:
        if it.depth > MAX_DEPTH:
            raise RalError(f"recursion limit: calls nested deeper than {MAX_DEPTH}", line, col)
        return code.run(Activation(vs, None, it))
    except ReturnSignal as r:
        return r.value
    finally:
        it.depth -= 1


def _nargs(n: int) -> str:
    return "1 argument" if n == 1 else f"{n} arguments"


_NATIVE_ERRORS = (ArithmeticError, ValueError, TypeError, LookupError, OSError)


def call_native(it: Interp, name: str, argv: list[Any], line: int, col: int) -> Any:
    nat = it.sigma[name]
    n = len(argv)
    if n < nat.lo or (nat.hi is not None and n > nat.hi):
        raise RalError(f"{name}: expected {nat.arity_text()}, got {n}", line, col)
    try:
        return nat.fn(it, argv)
    except RalError as e:
        if not e.line:
            e.line, e.col = line, col
        raise
    except RecursionError:
        raise RalError("recursion limit", line, col) from None
    except MemoryError:  # a native leaves no half-done interpreter state behind
        raise RalError(f"out of memory: {name} (the shell's memory limit)", line, col) from None
    except (*_NATIVE_ERRORS, ExarchError) as e:  # e.g. a value the codec refuses to send
        raise RalError(f"{name}: {e}", line, col) from None


def apply(it: Interp, v: Any, argv: list[Any], line: int, col: int, who: str = "") -> Any:
    t = type(v)
    if t is Closure:
        return call_closure(it, v, argv, line, col, who or "closure")
    if t is Builtin:
        if v.name not in it.sigma:
            raise RalError(f"builtin {v.name} is not available here", line, col)
        return call_native(it, v.name, argv, line, col)
    if not argv:
        return v
    what = f"{who} is a {type_name(v)}" if who else f"a {type_name(v)}"
    raise RalError(f"{what}, not a command", line, col)


def index_value(t: Any, k: Any, line: int, col: int) -> Any:
    tt = type(t)
    if tt is list:
        if type(k) is not int:
            raise RalError(f"a list index must be an int, not a {type_name(k)}", line, col)
        if not -len(t) <= k < len(t):
            raise RalError(f"index {k} out of range for a list of {len(t)}", line, col)
        return t[k]
    if tt is dict:
        key = k if type(k) is str else render(k)
        if key not in t:
            raise RalError(f"no key {key!r} in map", line, col)
        return t[key]
    raise RalError(f"cannot index a {type_name(t)}", line, col)
