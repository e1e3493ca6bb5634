"""ral values and their Python representation.

Invariants:
- unit is the singleton :data:`UNIT`; bool, int, float, str, bytes are the Python types;
  a list is a Python ``list`` that is never mutated in place once built; a map is a
  ``dict[str, Value]`` whose insertion order is the ral order.
- Equality is tag-exact (:func:`values_equal`): ``True != 1`` and ``1 != 1.0``, unlike Python.
- A :class:`Closure` keeps only what its body mentions (``captured``); a ``let rec`` closure
  refers to itself through ``rec_name`` rather than a cycle in ``captured``, so encoding and
  equality never loop.
- Values share structure (``[$a, $a]`` holds ``$a`` twice), so a value's size written out can
  be exponential in the objects it is made of. Every walk over a value is bounded: equality and
  :func:`expanded_size` visit each distinct container once; rendering shows a value larger than
  :data:`MAX_EXPANDED_ITEMS` written out as :class:`Oversized` (the codec refuses to encode it,
  :class:`runtime.ral.errors.ValueTooLarge`); and the walks whose length is the written-out size
  (rendering, the codec's lowering) call the cancellation check installed by
  :func:`cancellable_walks` every :data:`WALK_POLL_EVERY` steps.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain, compress, repeat
from typing import Any, Protocol

from exarch_actors.runtime.ral.errors import ValueTooLarge
from exarch_actors.runtime.shell.limits import DEFAULT_MAX_BINDING_BYTES


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
"""The types whose encoding holds other values' encodings."""

_NESTED = frozenset((list, dict, Variant))
"""The types whose display form holds other values' display forms."""


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


MAX_EXPANDED_ITEMS = DEFAULT_MAX_BINDING_BYTES
"""Most items (containers and leaves, a shared part counted each time it occurs) a value may hold
written out to be rendered or encoded: 256 Mi, the default binding limit in bytes
(``runtime/shell/limits.py``), since each item encodes to at least one byte such a value could never
be
bound, and its text would be at least three times as long. A tree of that many items does not fit
in the shells' default 2 GiB either; only shared structure reaches it."""

WALK_POLL_EVERY = 1 << 14
"""Steps of a rendering or lowering walk between two cancellation checks: 16 Ki steps of a
rendering take ~10 ms (measured: 2**16 shared leaves, ~200 Ki steps, render in 130 ms on a loaded
2-core machine), a tenth of docs/language.md's 100 ms cancellation bound, for one call per 16 Ki."""

_walk_check: ContextVar[Callable[[], None] | None] = ContextVar("ral_walk_check", default=None)


class cancellable_walks:
    """Within this block, on this thread, the walks over a value whose length is its size written
    out call ``check`` (which raises :class:`runtime.cancel.Cancelled` once the evaluation is
    cancelled) every :data:`WALK_POLL_EVERY` steps. A run and a worker install their
    evaluation's check for their whole length, so a render or an encode inside a native, an
    interpolation or a binding's define hook is cancellable like any phrase. (A class, not a
    generator: entered once per run, where a ``contextmanager`` cost ~1 us of a trivial one.)"""

    __slots__ = ("_check", "_token")

    def __init__(self, check: Callable[[], None]) -> None:
        self._check = check

    def __enter__(self) -> None:
        self._token = _walk_check.set(self._check)

    def __exit__(self, *exc: object) -> None:
        _walk_check.reset(self._token)


install_walk_check = _walk_check.set
""":class:`cancellable_walks`'s entry as a plain call: installs ``check`` and returns the token
that :data:`remove_walk_check` takes (a session run, entered once per call, saves the object and
its two method calls)."""

remove_walk_check = _walk_check.reset
"""Removes the check :data:`install_walk_check` installed (its token)."""


def walk_check() -> Callable[[], None] | None:
    """The cancellation check installed by :func:`cancellable_walks` on this thread, if any."""
    return _walk_check.get()


def expanded_size(root: Any, limit: int = MAX_EXPANDED_ITEMS, *, closures: bool = True) -> int:
    """How many items ``root`` holds written out -- itself, and each item of each container, a
    part that occurs n times counted n times -- or :class:`ValueTooLarge` once that passes
    ``limit``. ``closures=False`` counts a closure as one item (its display form shows none of
    what it captured).

    Linear in the distinct containers (each one's size is remembered by identity; a flat
    container is counted by its length at C speed), so a value that doubled itself 60 times costs
    61 steps, not 2**61; and iterative, so any depth is counted.
    """
    containers = _CONTAINERS if closures else _NESTED
    if type(root) not in containers:
        return 1
    size: dict[int, int] = {}  # id -> items written out; 0 while its nested items are counted
    stack: list[tuple[Any, list[Any] | None, int]] = [(root, None, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        v, inner, leaves = pop()
        if inner is not None:  # every nested item is counted now: finish v
            total = 1 + leaves + sum([size[id(x)] for x in inner])
            if total > limit:
                raise ValueTooLarge(_too_large(limit))
            size[id(v)] = total
            continue
        if id(v) in size:
            continue
        items = _items(v)
        if containers.isdisjoint(set(map(type, items))):
            size[id(v)] = 1 + len(items)
            continue
        inner = [x for x in items if type(x) in containers]
        size[id(v)] = 0
        push((v, inner, len(items) - len(inner)))
        for x in inner:
            if id(x) not in size:
                xs = _items(x)
                if containers.isdisjoint(set(map(type, xs))):  # flat: counted here, no visit
                    size[id(x)] = 1 + len(xs)
                else:
                    push((x, None, 0))
    if size[id(root)] > limit:
        raise ValueTooLarge(_too_large(limit))
    return size[id(root)]


def _too_large(limit: int) -> str:
    return f"value too large: over {limit} items written out (a part held n times counts n times)"


def refuse_oversized(root: Any, limit: int = MAX_EXPANDED_ITEMS, *, closures: bool = True) -> None:
    """:class:`ValueTooLarge` if ``root`` written out holds more than ``limit`` items.

    Only a value in which some container is reached twice can be larger written out than in
    memory, so a breadth-first scan at C speed (``gc.get_referents`` a level at a time) looks for
    one first, and :func:`expanded_size` counts only a value that shares. The scan is the price
    of never hanging on ``[$a, $a]``; measured (one run, a loaded 2-core machine): a list of
    10 M ints, scan 0.17 s against msgpack's 0.21 s; 100 000 small maps, scan 0.05 s against
    0.02 s (the exact count would take 0.5 s).
    """
    if _shares(root, _CONTAINERS if closures else _NESTED):
        expanded_size(root, limit, closures=closures)


def _shares(root: Any, containers: frozenset[type]) -> bool:
    """Is some container of ``root`` reached twice (through lists, maps, variants' payloads
    and, if closures are in ``containers``, the maps closures captured)?"""
    if type(root) not in containers:
        return False
    wanted = containers.__contains__
    level = [root]
    seen: set[int] = set()
    reached = 0
    while level:
        reached += len(level)
        seen.update(map(id, level))
        if len(seen) < reached:
            return True
        # a list, map, variant or closure refers to exactly its items, values, payload or
        # captured map among the containers (a closure's other slots are never containers)
        referents = level[0] if len(level) == 1 and type(level[0]) is list else None
        if referents is None:
            referents = gc.get_referents(*level)
        if containers.isdisjoint(set(map(type, referents))):  # the cheapest pass: 17 ns/item
            return False
        level = list(compress(referents, map(wanted, map(type, referents))))
    return False


def _items(v: Any) -> Any:
    """The values a container holds (a closure: what it captured)."""
    t = type(v)
    if t is list:
        return v
    if t is dict:
        return v.values()
    if t is Variant:
        return (v.payload,)
    return v.captured.values()


@dataclass(frozen=True, slots=True)
class Oversized:
    """What a value larger than ``limit`` items written out renders as (``<value of over ...
    items>``), as ``<int of N bits>`` stands in for an int too long to show: its text would take
    time and memory exponential in the program that built it."""

    limit: int

    def __repr__(self) -> str:
        return f"<value of over {self.limit} items>"


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


_CHECK_SIZE_AFTER = 1 << 16
"""Items a rendering writes before it measures the whole value (:func:`expanded_size`): a
value written in fewer steps is small, and never pays for the measure."""


def write_nested(v: Any, part: Callable[[Any], Part]) -> str:
    """The text of ``v`` and everything inside it, written depth-first with an explicit stack of
    open containers, so a value of any depth the evaluator can build is written without touching
    Python's recursion limit (``render`` and the CLI's JSON output are both this walk).

    Bounded: past :data:`_CHECK_SIZE_AFTER` items the value is measured once, and one larger
    than :data:`MAX_EXPANDED_ITEMS` written out is written as ``part(Oversized(...))`` instead;
    every :data:`WALK_POLL_EVERY` items the cancellation check of :func:`cancellable_walks` runs.
    """
    first = part(v)
    if isinstance(first, str):
        return first
    check = _walk_check.get()
    out = [first[0]]
    stack = [(first[1], first[2])]
    steps = 0
    while stack:
        items, closing = stack[-1]
        for sep, x in items:
            steps += 1
            if not steps % WALK_POLL_EVERY:
                if check is not None:
                    check()
                if steps == _CHECK_SIZE_AFTER and _oversized(v):  # once
                    p = part(Oversized(MAX_EXPANDED_ITEMS))
                    return p if isinstance(p, str) else repr(Oversized(MAX_EXPANDED_ITEMS))
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


def _oversized(v: Any) -> bool:
    try:
        refuse_oversized(v, closures=False)
    except ValueTooLarge:
        return True
    return False


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
    t = type(v)
    if t is str and not nested:  # the commonest values, without _leaf_text's frame
        return v
    if t is int:
        return _int_text(v)
    if t not in _NESTED:
        return _leaf_text(v, nested)
    return write_nested(v, _render_part)
