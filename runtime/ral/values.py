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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.ral.compile import BlockCode


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


class Closure:
    """A block value: its source span, parameters, compiled body and captured bindings.

    ``body`` is the compiled block shared by every closure made from the same source node; it is
    cached, never encoded (the codec carries ``source`` and re-parses it).
    """

    __slots__ = ("body", "captured", "col", "line", "params", "rec_name", "source")

    def __init__(
        self,
        body: BlockCode,
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


def values_equal(a: Any, b: Any) -> bool:
    """Tag-exact structural equality (a NaN equals a NaN so that encoding round-trips)."""
    ta, tb = type(a), type(b)
    if ta is not tb:
        return False
    if ta is list:
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if ta is dict:
        if len(a) != len(b) or list(a) != list(b):
            return False
        return all(values_equal(a[k], b[k]) for k in a)
    if ta is float:
        return bool(a == b or (math.isnan(a) and math.isnan(b)))
    if ta is Variant:
        return bool(a.tag == b.tag and values_equal(a.payload, b.payload))
    if ta is Closure:
        if a is b:
            return True
        return (
            a.source == b.source
            and a.params == b.params
            and a.rec_name == b.rec_name
            and values_equal(a.captured, b.captured)
        )
    return bool(a == b)


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


def render(v: Any, *, nested: bool = False) -> str:
    """The display form: ``ok(3)``, ``[1, 2, 3]``, ``[a: 1]``, ``[:]``.

    A top-level string renders as itself; a string inside a list, map or variant is quoted so the
    structure stays readable.
    """
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
    if t is list:
        return "[" + ", ".join(render(x, nested=True) for x in v) + "]"
    if t is dict:
        if not v:
            return "[:]"
        return (
            "[" + ", ".join(f"{_key_text(k)}: {render(x, nested=True)}" for k, x in v.items()) + "]"
        )
    if t is Variant:
        return f"{v.tag}({render(v.payload, nested=True)})"
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


def value_size(v: Any) -> int:
    """Bytes of ``v``'s msgpack encoding (what the large-binding notice measures)."""
    from runtime.ral.codec import encode_value

    return len(encode_value(v))
