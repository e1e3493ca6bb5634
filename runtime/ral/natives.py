"""Σ: the natives every session has (never session bindings), plus ``fault`` and desk verbs.

Each native takes the runtime and its evaluated arguments and returns a value or raises
:class:`RalError`; arity is checked by the caller from the table, and positions are filled in at
the call site. Arithmetic is tag-exact: ``true`` is not a number; int with int stays int (``div``
floors), anything with a float is a float.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.ral import confine
from exarch_actors.runtime.ral.calls import apply
from exarch_actors.runtime.ral.context import Desk
from exarch_actors.runtime.ral.errors import DeskRefusal, InternalPanic, RalError
from exarch_actors.runtime.ral.files import FILE_NATIVES, refusals
from exarch_actors.runtime.ral.interp import Interp, Native, check_cancel, refuse_nul
from exarch_actors.runtime.ral.values import (
    UNIT,
    Closure,
    Variant,
    WorkerHandle,
    render,
    truthy,
    type_name,
    values_equal,
)

MAX_INT_BITS = 1 << 22
"""Largest int an arithmetic native may produce (4 Mi bits, ~1.26 M digits): beyond it a runaway
``mul`` loop would exhaust memory before any poll point could cancel it."""

MAX_RANGE = 10_000_000
"""Largest list ``range`` builds (~80 MB of pointers)."""

RANGE_CHUNK = 1 << 16
"""Items ``range`` builds between two cancellation polls. Building all 10,000,000 at once is
one uninterruptible call of ~0.3 s idle and over 1 s on a loaded 2-core machine (measured: a
cancel landing in ``for i in (range 10000000)`` took 370-680 ms, against docs/language.md's 100 ms);
65,536 items take ~2 ms idle."""

Fn = Callable[[Interp, list[Any]], Any]
NATIVES: dict[str, Native] = {}


def native(name: str, lo: int, hi: int | None = -1, doc: str = "") -> Callable[[Fn], Fn]:
    def reg(fn: Fn) -> Fn:
        NATIVES[name] = Native(fn, lo, lo if hi == -1 else hi, doc)
        return fn

    return reg


def _num(v: Any, who: str) -> int | float:
    t = type(v)
    if t is int or t is float:
        return v
    raise RalError(f"{who}: expected a number, got {type_name(v)} {render(v, nested=True)}")


def _int(v: Any, who: str) -> int:
    if type(v) is not int:
        raise RalError(f"{who}: expected an int, got {type_name(v)} {render(v, nested=True)}")
    return v


def _str(v: Any, who: str) -> str:
    if type(v) is not str:
        raise RalError(f"{who}: expected a string, got {type_name(v)} {render(v, nested=True)}")
    return v


def _list(v: Any, who: str) -> list[Any]:
    if type(v) is not list:
        raise RalError(f"{who}: expected a list, got {type_name(v)} {render(v, nested=True)}")
    return v


def _map(v: Any, who: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise RalError(f"{who}: expected a map, got {type_name(v)} {render(v, nested=True)}")
    return v


def text(v: Any) -> str:
    return v if type(v) is str else render(v)


def _big(r: Any) -> Any:
    if type(r) is int and r.bit_length() > MAX_INT_BITS:
        raise RalError(f"integer result too large (over {MAX_INT_BITS} bits)")
    return r


# -- output --------------------------------------------------------------------------------


@native("echo", 0, None, "write the arguments, space-separated, and a newline to stdout")
def _echo(it: Interp, a: list[Any]) -> Any:
    it.out.append(" ".join(map(text, a)) + "\n")
    return UNIT


# -- arithmetic and comparison -------------------------------------------------------------


@native("add", 2)
def _add(it: Interp, a: list[Any]) -> Any:
    return _big(_num(a[0], "add") + _num(a[1], "add"))


@native("sub", 2)
def _sub(it: Interp, a: list[Any]) -> Any:
    return _big(_num(a[0], "sub") - _num(a[1], "sub"))


@native("mul", 2)
def _mul(it: Interp, a: list[Any]) -> Any:
    x, y = _num(a[0], "mul"), _num(a[1], "mul")
    if type(x) is int and type(y) is int and x.bit_length() + y.bit_length() > MAX_INT_BITS + 1:
        raise RalError(f"integer result too large (over {MAX_INT_BITS} bits)")
    return x * y


@native("div", 2, doc="int / int floors; a float operand gives a float")
def _div(it: Interp, a: list[Any]) -> Any:
    x, y = _num(a[0], "div"), _num(a[1], "div")
    if y == 0:
        raise RalError("division by zero")
    if type(x) is int and type(y) is int:
        return x // y
    return x / y


@native("mod", 2)
def _mod(it: Interp, a: list[Any]) -> Any:
    x, y = _num(a[0], "mod"), _num(a[1], "mod")
    if y == 0:
        raise RalError("division by zero (mod)")
    return x % y


@native("eq", 2)
def _eq(it: Interp, a: list[Any]) -> Any:
    return values_equal(a[0], a[1])


@native("ne", 2)
def _ne(it: Interp, a: list[Any]) -> Any:
    return not values_equal(a[0], a[1])


def _ordered(who: str, x: Any, y: Any) -> tuple[Any, Any]:
    tx, ty = type(x), type(y)
    if (tx is int or tx is float) and (ty is int or ty is float):
        return x, y
    if tx is str and ty is str:
        return x, y
    raise RalError(f"{who}: cannot compare {type_name(x)} with {type_name(y)}")


@native("lt", 2)
def _lt(it: Interp, a: list[Any]) -> Any:
    x, y = _ordered("lt", a[0], a[1])
    return x < y


@native("le", 2)
def _le(it: Interp, a: list[Any]) -> Any:
    x, y = _ordered("le", a[0], a[1])
    return x <= y


@native("gt", 2)
def _gt(it: Interp, a: list[Any]) -> Any:
    x, y = _ordered("gt", a[0], a[1])
    return x > y


@native("ge", 2)
def _ge(it: Interp, a: list[Any]) -> Any:
    x, y = _ordered("ge", a[0], a[1])
    return x >= y


@native("not", 1)
def _not(it: Interp, a: list[Any]) -> Any:
    return not truthy(a[0])


@native("and", 2, None, "true when every argument is true (only false and unit are false)")
def _and(it: Interp, a: list[Any]) -> Any:
    return all(truthy(x) for x in a)


@native("or", 2, None)
def _or(it: Interp, a: list[Any]) -> Any:
    return any(truthy(x) for x in a)


# -- collections and strings ---------------------------------------------------------------


@native("len", 1)
def _len(it: Interp, a: list[Any]) -> Any:
    v = a[0]
    if type(v) in (str, list, dict, bytes):
        return len(v)
    raise RalError(f"len: a {type_name(v)} has no length")


@native("get", 2, 3, "get MAP KEY [DEFAULT] / get LIST INDEX [DEFAULT]")
def _get(it: Interp, a: list[Any]) -> Any:
    c, k = a[0], a[1]
    if type(c) is dict:
        key = text(k)
        if key in c:
            return c[key]
        if len(a) == 3:
            return a[2]
        raise RalError(f"get: no key {key!r} in map")
    if type(c) is list:
        i = _int(k, "get")
        if -len(c) <= i < len(c):
            return c[i]
        if len(a) == 3:
            return a[2]
        raise RalError(f"get: index {i} out of range for a list of {len(c)}")
    raise RalError(f"get: cannot index a {type_name(c)}")


@native("keys", 1)
def _keys(it: Interp, a: list[Any]) -> Any:
    return list(_map(a[0], "keys"))


@native("values", 1)
def _values(it: Interp, a: list[Any]) -> Any:
    return list(_map(a[0], "values").values())


@native("append", 2, None, "append LIST V ... -> a new list")
def _append(it: Interp, a: list[Any]) -> Any:
    return [*_list(a[0], "append"), *a[1:]]


@native("put", 3, doc="put MAP KEY VALUE -> a new map")
def _put(it: Interp, a: list[Any]) -> Any:
    m = dict(_map(a[0], "put"))
    m[text(a[1])] = a[2]
    return m


@native("range", 1, 3, "range N | range FROM TO | range FROM TO STEP (TO excluded)")
def _range(it: Interp, a: list[Any]) -> Any:
    xs = [_int(x, "range") for x in a]
    r = range(*xs)
    if len(r) > MAX_RANGE:
        raise RalError(f"range: {len(r)} items is over the limit of {MAX_RANGE}")
    out: list[int] = []
    for start in range(0, len(r), RANGE_CHUNK):
        it.poll()
        out.extend(r[start : start + RANGE_CHUNK])
    return out


@native("str", 1)
def _strf(it: Interp, a: list[Any]) -> Any:
    return text(a[0])


@native("int", 1)
def _intf(it: Interp, a: list[Any]) -> Any:
    v = a[0]
    t = type(v)
    if t is int:
        return v
    if t is float:
        if v != v or v in (float("inf"), float("-inf")):
            raise RalError(f"int: cannot convert {render(v)}")
        return int(v)
    if t is str:
        try:
            return int(v.strip())
        except ValueError:
            raise RalError(f"int: not an integer: {v[:80]!r}") from None
    raise RalError(f"int: cannot convert a {type_name(v)}")


@native("float", 1)
def _floatf(it: Interp, a: list[Any]) -> Any:
    v = a[0]
    if type(v) in (int, float):
        return float(v)
    if type(v) is str:
        try:
            return float(v.strip())
        except ValueError:
            raise RalError(f"float: not a number: {v[:80]!r}") from None
    raise RalError(f"float: cannot convert a {type_name(v)}")


@native("split", 1, 2, "split S [SEP] (no SEP: on runs of whitespace)")
def _split(it: Interp, a: list[Any]) -> Any:
    s = _str(a[0], "split")
    if len(a) == 1:
        return s.split()
    sep = _str(a[1], "split")
    if not sep:
        raise RalError("split: empty separator")
    return s.split(sep)


@native("join", 1, 2, "join LIST [SEP] (default SEP: empty)")
def _join(it: Interp, a: list[Any]) -> Any:
    sep = _str(a[1], "join") if len(a) == 2 else ""
    return sep.join(text(x) for x in _list(a[0], "join"))


@native("lines", 1)
def _lines(it: Interp, a: list[Any]) -> Any:
    s = _str(a[0], "lines")
    if not s:
        return []
    parts = s.split("\n")
    if parts[-1] == "":
        parts.pop()
    return [p[:-1] if p.endswith("\r") else p for p in parts]


@native("contains", 2, doc="substring of a string, element of a list, key of a map")
def _contains(it: Interp, a: list[Any]) -> Any:
    c, x = a[0], a[1]
    if type(c) is str:
        return _str(x, "contains") in c
    if type(c) is list:
        return any(values_equal(y, x) for y in c)
    if type(c) is dict:
        return text(x) in c
    raise RalError(f"contains: cannot search a {type_name(c)}")


@native("variant", 1, 2, "variant TAG [PAYLOAD] (payload defaults to unit)")
def _variant(it: Interp, a: list[Any]) -> Any:
    return Variant(_str(a[0], "variant"), a[1] if len(a) == 2 else UNIT)


@native("concat", 0, None, "lists: one list; otherwise: one string")
def _concat(it: Interp, a: list[Any]) -> Any:
    if a and all(type(x) is list for x in a):
        return [y for x in a for y in x]
    return "".join(text(x) for x in a)


@native("type", 1)
def _type(it: Interp, a: list[Any]) -> Any:
    return type_name(a[0])


@native("fail", 1, doc="raise a ral error with this message (catchable with try)")
def _fail(it: Interp, a: list[Any]) -> Any:
    raise RalError(text(a[0]))


@native("reverse", 1)
def _reverse(it: Interp, a: list[Any]) -> Any:
    v = a[0]
    if type(v) is str:
        return v[::-1]
    return _list(v, "reverse")[::-1]


@native("sort", 1, doc="a list of numbers or of strings, ascending")
def _sort(it: Interp, a: list[Any]) -> Any:
    xs = _list(a[0], "sort")
    if all(type(x) in (int, float) for x in xs) or all(type(x) is str for x in xs):
        return sorted(xs)
    raise RalError("sort: the list must hold only numbers or only strings")


@native("trim", 1)
def _trim(it: Interp, a: list[Any]) -> Any:
    return _str(a[0], "trim").strip()


@native("replace", 3, doc="replace S OLD NEW: every occurrence")
def _replace(it: Interp, a: list[Any]) -> Any:
    old = _str(a[1], "replace")
    if not old:
        raise RalError("replace: empty OLD")
    return _str(a[0], "replace").replace(old, _str(a[2], "replace"))


# -- higher order ----------------------------------------------------------------------------


@native("map", 2, doc="map F LIST -> [F x for each x]")
def _mapf(it: Interp, a: list[Any]) -> Any:
    f = a[0]
    out = []
    for x in _list(a[1], "map"):
        if it.stop:
            check_cancel(it)
        out.append(apply(it, f, [x], 0, 0, "map"))
    return out


@native("filter", 2, doc="filter F LIST -> the items for which F is true")
def _filter(it: Interp, a: list[Any]) -> Any:
    f = a[0]
    out = []
    for x in _list(a[1], "filter"):
        if it.stop:
            check_cancel(it)
        if truthy(apply(it, f, [x], 0, 0, "filter")):
            out.append(x)
    return out


@native("fold", 3, doc="fold F INIT LIST -> F (... (F INIT x0) ...) xn")
def _fold(it: Interp, a: list[Any]) -> Any:
    f, acc = a[0], a[1]
    for x in _list(a[2], "fold"):
        if it.stop:
            check_cancel(it)
        acc = apply(it, f, [acc, x], 0, 0, "fold")
    return acc


# -- dynamic context -------------------------------------------------------------------------


@native("cd", 0, 1, "cd [DIR] (no DIR: $HOME); confined to the granted roots")
def _cd(it: Interp, a: list[Any]) -> Any:
    target = text(a[0]) if a else it.ctx.env.get("HOME", "/")
    full = it.path(target, "cd")
    with refusals("cd", target, "enter"):
        try:
            confine.real_dir(full, it.ctx.grants.roots)
        except (FileNotFoundError, NotADirectoryError):
            raise RalError(f"cd: no such directory: {target}") from None
    it.ctx.cwd = full
    return UNIT


@native("pwd", 0)
def _pwd(it: Interp, a: list[Any]) -> Any:
    return it.ctx.cwd


@native("env", 0, 1, "env NAME -> its value, or unit when unset; env -> a map of all")
def _env(it: Interp, a: list[Any]) -> Any:
    if not a:
        return dict(it.ctx.env)
    return it.ctx.env.get(text(a[0]), UNIT)


@native("setenv", 2, doc="setenv NAME VALUE (VALUE unit removes NAME)")
def _setenv(it: Interp, a: list[Any]) -> Any:
    k = _str(a[0], "setenv")
    if not k or "=" in k or "\0" in k:
        raise RalError(f"setenv: bad name {k!r}")
    if a[1] is UNIT:
        it.ctx.env.pop(k, None)
    else:
        v = text(a[1])
        refuse_nul(v, f"setenv: the value of {k}")
        it.ctx.env[k] = v
    return UNIT


@native("sleep", 1, doc="sleep SECONDS (cancellable)")
def _sleep(it: Interp, a: list[Any]) -> Any:
    secs = _num(a[0], "sleep")
    if secs < 0:
        raise RalError("sleep: negative duration")
    if it.scope.wait(secs):
        check_cancel(it)
    return UNIT


# -- workers -----------------------------------------------------------------------------------


@native("spawn", 1, doc="spawn { ... } -> a worker handle, at once")
def _spawn(it: Interp, a: list[Any]) -> Any:
    c = a[0]
    if type(c) is not Closure or c.params:
        raise RalError("spawn: expected a block with no parameters")
    if it.workers is None:
        raise RalError("spawn: this shell has no workers")
    return it.workers.spawn(c, it.ctx.copy(), it.worker_scope.child())


def _handle(v: Any, who: str) -> WorkerHandle:
    if type(v) is not WorkerHandle:
        raise RalError(f"{who}: expected a worker handle, got {type_name(v)}")
    return v


@native("await", 1, doc="await HANDLE -> the worker's value (re-raises its error)")
def _await(it: Interp, a: list[Any]) -> Any:
    h = _handle(a[0], "await")
    if it.workers is None:
        raise RalError("await: this shell has no workers")
    try:
        return it.workers.await_(h, it.scope)
    finally:
        take = getattr(it.workers, "take_output", None)
        if take is not None:
            out, err = take(h)
            if out:
                it.out.append(out)
            if err:
                it.err.append(err)


@native("settled", 1, doc="settled HANDLE -> true once the worker has finished (claims nothing)")
def _settled(it: Interp, a: list[Any]) -> Any:
    h = _handle(a[0], "settled")
    if it.workers is None:
        raise RalError("settled: this shell has no workers")
    return it.workers.settled(h)


@native("cancel", 1, doc="cancel HANDLE: stop a worker")
def _cancel(it: Interp, a: list[Any]) -> Any:
    h = _handle(a[0], "cancel")
    if it.workers is None:
        raise RalError("cancel: this shell has no workers")
    it.workers.cancel(h)
    return UNIT


NATIVES.update(FILE_NATIVES)


# -- faults and the desk -------------------------------------------------------------------------


def _fault(it: Interp, a: list[Any]) -> Any:
    kind = text(a[0])
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "panic":
        raise InternalPanic("fault panic: injected internal error")
    if kind == "hang":
        while not it.scope.wait(1.0):
            pass
        check_cancel(it)
    if kind == "spin":
        # A CPU-bound C-level call that never releases the GIL (exponential backtracking in the
        # regex engine, ~2^64 steps): no poll point, no other thread of the process runs, so
        # only a kill stops it -- the shape of a runaway native.
        import re

        re.match(r"(a+)+$", "a" * 64 + "b")
    raise RalError(f"fault: unknown kind {kind!r} (crash, panic, hang or spin)")


FAULT = Native(_fault, 1, 1, "fault crash|panic|hang|spin (only with EXARCH_FAULTS=1)")


def desk_native(desk: Desk, verb: str) -> Native:
    def call(it: Interp, a: list[Any]) -> Any:
        try:
            return desk.call(verb, list(a))
        except DeskRefusal as e:
            raise RalError(e.message) from None
        except RalError:
            raise
        except ExarchError as e:
            raise RalError(str(e)) from None

    return Native(call, 0, None, f"agent verb {verb} (answered by the desk)")


def build_sigma(desk: Desk | None, faults: bool) -> dict[str, Native]:
    """Σ for one run: natives, ``fault`` when enabled, and the verbs the desk advertises now."""
    sigma = dict(NATIVES)
    if faults:
        sigma["fault"] = FAULT
    if desk is not None:
        for verb in desk.verbs():
            sigma[verb] = desk_native(desk, verb)
    return sigma
