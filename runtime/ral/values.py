"""ral values and their Python representation.

Invariants:
- unit is the singleton :data:`UNIT`; bool, int, float, str, bytes are the Python types;
  a list is a Python ``list`` that is never mutated in place once built; a map is a
  ``dict[str, Value]`` whose insertion order is the ral order.
- Equality is tag-exact (:func:`values_equal`): ``True != 1`` and ``1 != 1.0``, unlike Python.
- A :class:`Closure` keeps only what its body mentions (``captured``); a ``let rec`` closure
  refers to itself through ``rec_name`` rather than a cycle in ``captured``, so encoding and
  equality never loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Protocol


class Unit:
    """The type of :data:`UNIT`; there is exactly one instance."""

    __slots__ = ()
    _instance: Unit | None = None

    def __new__(cls) -> Unit:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNIT"

    def __reduce__(self) -> str:
        return "UNIT"


UNIT = Unit()


@dataclass(frozen=True, slots=True)
class Variant:
    """A tag and exactly one payload: ``variant ok 3`` renders ``ok(3)``."""

    tag: str
    payload: Any = UNIT


@dataclass(frozen=True, slots=True)
class WorkerHandle:
    """A detached worker, named by its backend-unique id."""

    id: str


@dataclass(frozen=True, slots=True)
class Builtin:
    """A native or desk verb read as a value (``$echo``). Never encodable."""

    name: str


class CompiledBody(Protocol):
    """What a closure holds of its compiled block (:class:`runtime.ral.calls.BlockCode`)."""

    @property
    def source(self) -> str: ...
    @property
    def params(self) -> tuple[str, ...]: ...
    @property
    def line(self) -> int: ...
    @property
    def col(self) -> int: ...
    @property
    def run(self) -> Callable[[Any], Any]:
        """Runs the body in an activation (:class:`runtime.ral.calls.Activation`)."""
        ...


class Closure:
    """A block value: its source span, parameters, compiled body and captured bindings.

    ``body`` is the compiled block shared by every closure made from the same source node; it is
    cached, never encoded (the codec carries ``source`` and re-parses it).
    """

    __slots__ = ("body", "captured", "col", "line", "params", "rec_name", "source")

    def __init__(
        self,
        body: CompiledBody,
        captured: dict[str, Any],
        rec_name: str | None = None,
    ) -> None:
        self.body = body
        self.source: str = body.source
        self.params: tuple[str, ...] = body.params
        self.line: int = body.line
        self.col: int = body.col
        self.captured = captured
        self.rec_name = rec_name

    def __repr__(self) -> str:
        return f"Closure({self.source!r}, captured={sorted(self.captured)!r})"


Value = (
    Unit
    | bool
    | int
    | float
    | str
    | bytes
    | list
    | dict
    | Variant
    | Closure
    | WorkerHandle
    | Builtin
)
"""Any ral value (lists and maps hold Values)."""


def type_name(v: Any) -> str:
    """The ral name of a value's type, used in error messages and by the ``type`` native."""
    t = type(v)
    if t is bool:
        return "bool"
    if t is int:
        return "int"
    if t is float:
        return "float"
    if t is str:
        return "string"
    if t is list:
        return "list"
    if t is dict:
        return "map"
    if t is Unit:
        return "unit"
    if t is bytes:
        return "bytes"
    if t is Variant:
        return "variant"
    if t is Closure:
        return "closure"
    if t is WorkerHandle:
        return "worker"
    if t is Builtin:
        return "builtin"
    return t.__name__


def truthy(v: Any) -> bool:
    """Only ``false`` and ``unit`` are false."""
    return not (v is False or v is UNIT)


_CONTAINERS = frozenset((list, dict, Variant, Closure))


def values_equal(a: Any, b: Any) -> bool:
    """Tag-exact structural equality (a NaN equals a NaN so that encoding round-trips).

    Iterative, with an explicit stack of pairs: two values of any depth the evaluator can build
    compare without touching Python's recursion limit. Identical objects are equal at once
    (the relation is reflexive, NaN included), and a pair of containers is compared once
    however often it recurs, so values that share structure (``fold { |acc, x| [$acc, $acc] }``
    doubles its size each step) compare in time linear in the objects they are made of.
    """
    stack = [(a, b)]
    pop, extend = stack.pop, stack.extend
    seen: set[tuple[int, int]] = set()  # container pairs already queued (both stay alive)
    while stack:
        a, b = pop()
        if a is b:
            continue
        ta = type(a)
        if ta is not type(b):
            return False
        if ta in _CONTAINERS:
            pair = (id(a), id(b))
            if pair in seen:
                continue
            seen.add(pair)
        if ta is list:
            if len(a) != len(b):
                return False
            extend(zip(a, b))
        elif ta is dict:
            if len(a) != len(b) or list(a) != list(b):
                return False
            extend(zip(a.values(), b.values()))
        elif ta is float:
            if not (a == b or (math.isnan(a) and math.isnan(b))):
                return False
        elif ta is Variant:
            if a.tag != b.tag:
                return False
            stack.append((a.payload, b.payload))
        elif ta is Closure:
            if a.source != b.source or a.params != b.params or a.rec_name != b.rec_name:
                return False
            stack.append((a.captured, b.captured))
        elif a != b:
            return False
    return True


_BARE_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./")


def _int_text(v: int) -> str:
    try:
        return str(v)
    except ValueError:  # beyond Python's int->str digit limit (4300 digits)
        return f"<int of {v.bit_length()} bits>"


def _key_text(k: str) -> str:
    if k and all(c in _BARE_SAFE for c in k):
        return k
    return _quote(k)


def _quote(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    out = out.replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


_NESTED = frozenset((list, dict, Variant))
"""The types whose display form holds other values' display forms."""


def _leaf_text(v: Any, nested: bool) -> str:
    """The display form of a value that holds no other value."""
    t = type(v)
    if t is str:
        return _quote(v) if nested else v
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return _int_text(v)
    if t is float:
        return repr(v)
    if t is Unit:
        return "unit"
    if t is bytes:
        return f"<{len(v)} bytes>"
    if t is Closure:
        src = v.source if len(v.source) <= 60 else v.source[:57] + "..."
        return f"<closure {src}>"
    if t is WorkerHandle:
        return f"<worker {v.id}>"
    if t is Builtin:
        return f"<builtin {v.name}>"
    return repr(v)


Part = str | tuple[str, Iterator[tuple[str, Any]], str]
"""How :func:`write_nested` sees one value: its whole text (a leaf), or a container as (opening
text, an iterator of (separator, item) pairs, closing text)."""


def write_nested(v: Any, part: Callable[[Any], Part]) -> str:
    """The text of ``v`` and everything inside it, written depth-first with an explicit stack of
    open containers, so a value of any depth the evaluator can build is written without touching
    Python's recursion limit (``render`` and the CLI's JSON output are both this walk)."""
    first = part(v)
    if isinstance(first, str):
        return first
    out = [first[0]]
    stack = [(first[1], first[2])]
    while stack:
        items, closing = stack[-1]
        for sep, x in items:
            if sep:
                out.append(sep)
            p = part(x)
            if isinstance(p, str):
                out.append(p)
                continue
            out.append(p[0])
            stack.append((p[1], p[2]))
            break
        else:
            out.append(closing)
            stack.pop()
    return "".join(out)


def separators(sep: str = ", ") -> Iterator[str]:
    """``""`` then ``sep`` forever: the separator before each item of a container."""
    return chain(("",), repeat(sep))


def _render_part(v: Any) -> Part:
    t = type(v)
    if t is list:
        if _NESTED.isdisjoint(set(map(type, v))):  # flat: written at once
            return "[" + ", ".join([_leaf_text(x, True) for x in v]) + "]"
        return "[", zip(separators(), v), "]"
    if t is dict:
        if not v:
            return "[:]"
        pairs = zip(separators(), v, v.values())
        return "[", ((f"{s}{_key_text(k)}: ", x) for s, k, x in pairs), "]"
    if t is Variant:
        return f"{v.tag}(", iter((("", v.payload),)), ")"
    return _leaf_text(v, True)


def render(v: Any, *, nested: bool = False) -> str:
    """The display form: ``ok(3)``, ``[1, 2, 3]``, ``[a: 1]``, ``[:]``.

    A top-level string renders as itself; a string inside a list, map or variant is quoted so the
    structure stays readable. Any depth renders (:func:`write_nested`).
    """
    if type(v) not in _NESTED:
        return _leaf_text(v, nested)
    return write_nested(v, _render_part)
