"""msgpack encoding of ral values.

Native msgpack carries bool, int (64-bit), float (always float64), str, bytes (bin), list
(array) and map (str keys, order kept). Extension types carry the rest:

| code | value | payload |
| --- | --- | --- |
| 1 | unit | empty |
| 2 | variant | ``[tag, payload]`` |
| 3 | closure | ``[source, params, captured, rec_name, line, col]`` |
| 4 | worker handle | the id, UTF-8 |
| 5 | int beyond 64 bits | two's-complement big-endian bytes |
| 6 | builtin (a native read as a value, ``$add``) | its name, UTF-8 |

A closure travels as its source span and its captured bindings; decoding re-parses and
re-elaborates the span (cached per shape, so a snapshot with many closures made from the same
block parses it once). A builtin travels as its name and is looked up in Σ again when it is
applied, so it decodes to the same native. Any malformed input raises :class:`CodecError`.

Depth. A value nested more than :data:`MAX_VALUE_NESTING` levels deep (lists, maps and
variants count one level each, a closure two: itself and the map of what it captured) is
refused both ways with ``value nested too deeply``: encoding refuses it before writing a byte,
and decoding refuses such bytes (a hostile or corrupt snapshot) instead of crashing. Neither
direction recurses in Python: a variant's or closure's payload is its own msgpack blob, and the
walks that lower values to msgpack data and raise decoded data back to values keep explicit
stacks. (The recursive decoder this replaces called ``unpackb`` once per nested variant, each
call holding a 40 KB parse stack on the C stack: 300 nested variants killed the process with
SIGSEGV.)

Size. A value that shares structure (``[$a, $a]``) can be exponentially larger written out
than in memory; one over :data:`runtime.ral.values.MAX_EXPANDED_ITEMS` items written out is
refused with :class:`runtime.ral.errors.ValueTooLarge` before any byte is written
(:func:`runtime.ral.values.refuse_oversized`), and the Python walk that lowers variants and
closures calls the run's cancellation check (:func:`runtime.ral.values.cancellable_walks`).
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from typing import Any

import msgpack

from exarch_actors.runtime.ral.compile import Elaborator, Scope
from exarch_actors.runtime.ral.errors import CodecError, RalSyntaxError
from exarch_actors.runtime.ral.parser import parse_block
from exarch_actors.runtime.ral.values import (
    UNIT,
    WALK_POLL_EVERY,
    Builtin,
    Closure,
    Unit,
    Variant,
    WorkerHandle,
    refuse_oversized,
    walk_check,
)

EXT_UNIT = 1
EXT_VARIANT = 2
EXT_CLOSURE = 3
EXT_WORKER = 4
EXT_BIGINT = 5
EXT_BUILTIN = 6

MAX_VALUE_NESTING = 1024
"""Deepest value the codec carries, in levels (a list, map or variant: one; a closure: two).

Far beyond data anyone writes by hand, and exactly msgpack's own limits: its unpacker has a
fixed 1024-level stack (``StackError`` beyond), and its packer accepts 1025 levels, which
:func:`_pack_plain` turns into 1024 by packing ``[v]``. tests/ral/test_ral_hardening.py pins
both, so a msgpack release that moves them is noticed.
"""

TOO_DEEP = f"value nested too deeply (over {MAX_VALUE_NESTING} levels)"

_PACK: dict[str, Any] = {
    "use_bin_type": True,
    "strict_types": True,
    "unicode_errors": "surrogatepass",
}
"""msgpack packing options. ``surrogatepass``: a ral string may hold a lone surrogate (an
environment variable or a file name that was not UTF-8 decodes to one, by Python's
``surrogateescape``); it round-trips exactly instead of failing to encode."""

_UNPACK: dict[str, Any] = {
    "raw": False,
    "strict_map_key": True,
    "use_list": True,
    "unicode_errors": "surrogatepass",
}

_CODE_CACHE_SIZE = 512
_code_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

_NESTED = frozenset((list, dict, Variant, Closure))
"""Value types that hold other values (each is one level of nesting)."""


# -- encoding --------------------------------------------------------------------------------


def _default(v: Any) -> Any:
    """msgpack's hook for the leaf types it does not know; never called for a nested type."""
    t = type(v)
    if t is Unit:
        return msgpack.ExtType(EXT_UNIT, b"")
    if t is WorkerHandle:
        return msgpack.ExtType(EXT_WORKER, v.id.encode("utf-8"))
    if t is Builtin:
        return msgpack.ExtType(EXT_BUILTIN, v.name.encode("utf-8"))
    if t is int:
        n = (v.bit_length() + 8) // 8
        return msgpack.ExtType(EXT_BIGINT, v.to_bytes(n, "big", signed=True))
    raise CodecError(f"not a ral value: {t.__name__}")


class _NeedsLowering(Exception):
    """Raised by the fast path when it meets a variant or a closure."""


def _plain_default(v: Any) -> Any:
    if type(v) is Variant or type(v) is Closure:
        raise _NeedsLowering
    return _default(v)


def _pack_plain(v: Any) -> bytes:
    """The fast path: a value with no variant or closure in it, packed by msgpack alone.

    Packing ``[v]`` and dropping the one-byte array header (``0x91``) makes msgpack's own
    nesting limit (1025 levels for ``[v]``) refuse exactly the values deeper than
    :data:`MAX_VALUE_NESTING`, so no Python walk is needed to check the depth. Measured with a
    list of 100 000 small maps: 0.05 s this way, 0.3 s with a Python walk first.
    """
    return msgpack.packb([v], default=_plain_default, **_PACK)[1:]


_local = threading.local()


def _pack(v: Any) -> bytes:
    """``packb`` through one reusable ``Packer`` per thread: packing a variant's payload is
    0.5 µs this way and 3.3 µs through ``packb``, which builds a new ``Packer`` per call. (A
    ``Packer`` clears its buffer when a pack fails, so a refusal leaves it clean.)"""
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(default=_default, **_PACK)
    return packer.pack(v)


class _Lowering:
    """One container being lowered: its items, how far we got, and the lowered items so far.

    ``out`` stays ``None`` while every item lowered to itself, so a container with no variant
    or closure below it is handed to msgpack as it is, never copied.
    """

    __slots__ = ("i", "items", "level", "out", "v")

    def __init__(self, v: Any, level: int) -> None:
        if level > MAX_VALUE_NESTING:
            raise CodecError(TOO_DEEP)
        t = type(v)
        if t is list:
            self.items: list[Any] = v
        elif t is dict:
            _check_keys(v)
            self.items = list(v.values())
        elif t is Variant:
            self.items = [v.payload]
        else:
            self.items = list(v.captured.values())
            level += 1  # the captured map is a level of its own in the closure's payload
            if level > MAX_VALUE_NESTING:
                raise CodecError(TOO_DEEP)
        self.v = v
        self.level = level
        self.i = 0
        self.out: list[Any] | None = None

    def finish(self) -> Any:
        """The msgpack data for this container, from its lowered items."""
        v, out = self.v, self.out
        t = type(v)
        if t is list:
            return v if out is None else out
        if t is dict:
            return v if out is None else dict(zip(v, out))
        if t is Variant:
            return _variant_ext(v.tag, v.payload if out is None else out[0])
        captured = v.captured if out is None else dict(zip(v.captured, out))
        body = [v.source, list(v.params), captured, v.rec_name, v.line, v.col]
        return msgpack.ExtType(EXT_CLOSURE, _pack(body))


def _variant_ext(tag: str, lowered_payload: Any) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_VARIANT, _pack([tag, lowered_payload]))


def _lower(root: Any) -> Any:
    """``root`` as msgpack data: variants and closures become extension types, bottom-up, each
    payload packed once its own items are lowered; too-deep values and non-string map keys are
    refused on the way.

    Iterative (a stack of :class:`_Lowering`). Flat lists and variants of a leaf are lowered
    where they stand, without a frame of their own; a list with nothing nested in it is passed
    over at C speed (one ``set(map(type, ...))``).
    """
    if type(root) not in _NESTED:
        return root
    check = walk_check()
    frames = 0
    stack = [_Lowering(root, 1)]
    while True:
        frames += 1
        if check is not None and not frames % WALK_POLL_EVERY:
            check()
        f = stack[-1]
        items, i, n, out = f.items, f.i, len(f.items), f.out
        inline = f.level < MAX_VALUE_NESTING  # may an item be a container without a frame?
        while i < n:
            x = items[i]
            tx = type(x)
            if tx in _NESTED:
                if not inline:
                    break
                if tx is Variant and type(x.payload) not in _NESTED:
                    x = _variant_ext(x.tag, x.payload)
                    if out is None:
                        out = f.out = items[:i]
                elif not (tx is list and _NESTED.isdisjoint(set(map(type, x)))):
                    break
            if out is not None:
                out.append(x)
            i += 1
        f.i = i
        if i < n:
            stack.append(_Lowering(items[i], f.level + 1))
            continue
        lowered = f.finish()
        stack.pop()
        if not stack:
            return lowered
        parent = stack[-1]
        if parent.out is None and lowered is not parent.items[parent.i]:
            parent.out = parent.items[: parent.i]
        if parent.out is not None:
            parent.out.append(lowered)
        parent.i += 1


def encode_value(v: Any) -> bytes:
    """msgpack bytes of a ral value; :class:`CodecError` for non-values and too-deep values,
    :class:`ValueTooLarge` (a ``CodecError``) for values too large written out."""
    if type(v) in _NESTED:
        refuse_oversized(v)
    try:
        return _pack_plain(v)
    except (_NeedsLowering, ValueError, TypeError, OverflowError):
        pass  # a variant or closure inside, or too deep: the slow path says which
    try:
        return _pack(_lower(v))
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError) as e:
        raise CodecError(f"cannot encode value: {e}") from None


def encode_text(v: Any) -> str | None:
    """:func:`encode_value` as base64 text, for a JSON record that must give the value back
    with its type (a reply in an event log or the spawn journal: its rendered text turned a
    child's ``16`` into ``"16"`` after ``resume``); None for what cannot be encoded (the record
    then keeps only the rendered text)."""
    try:
        return base64.b64encode(encode_value(v)).decode("ascii")
    except CodecError:
        return None


def decode_text(text: str) -> Any:
    """The value :func:`encode_text` wrote; :class:`CodecError` for anything else."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise CodecError("not base64 text") from None
    return decode_value(raw)


def value_size(v: Any) -> int:
    """Bytes of ``v``'s msgpack encoding (what the large-binding notice measures)."""
    return len(encode_value(v))


# -- decoding --------------------------------------------------------------------------------


class _Pending:
    """A variant or closure payload not yet decoded (decoding it here would recurse)."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        self.code = code
        self.data = data


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_UNIT:
        if data:
            raise CodecError("unit carries no payload")
        return UNIT
    if code in (EXT_VARIANT, EXT_CLOSURE):
        return _Pending(code, data)
    if code == EXT_WORKER:
        return WorkerHandle(data.decode("utf-8"))
    if code == EXT_BUILTIN:
        name = data.decode("utf-8")
        if not name:
            raise CodecError("a builtin needs a name")
        return Builtin(name)
    if code == EXT_BIGINT:
        if not data:
            raise CodecError("empty bigint")
        return int.from_bytes(data, "big", signed=True)
    raise CodecError(f"unknown extension type {code}")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, **_UNPACK)


def _unpack_top(data: bytes) -> tuple[Any, bool]:
    """The top-level blob, and whether it holds any pending variant or closure."""
    pending = False

    def hook(code: int, payload: bytes) -> Any:
        nonlocal pending
        v = _ext_hook(code, payload)
        if type(v) is _Pending:
            pending = True
        return v

    v = msgpack.unpackb(data, ext_hook=hook, **_UNPACK)
    return v, pending


def _check_plain(root: Any) -> Any:
    """Refuse nil and non-string keys in data with no pending payload (the common case).

    No level count is needed here: one msgpack blob nests at most as deep as its unpacker's
    stack allows (1024 levels, ``StackError`` beyond), which is :data:`MAX_VALUE_NESTING`.
    """
    if root is None:
        raise CodecError("nil is not a ral value")
    stack = [root]
    pop, push = stack.pop, stack.append
    while stack:
        v = pop()
        if type(v) is list:
            if len(v) > 8 and _RAISE.isdisjoint(set(map(type, v))):
                continue
            items: Any = v
        elif type(v) is dict:
            _check_keys(v)
            items = v.values()
        else:
            continue
        for x in items:
            t = type(x)
            if t is list or t is dict:
                push(x)
            elif x is None:
                raise CodecError("nil is not a ral value")
    return root


_RAISE = frozenset((list, dict, _Pending, type(None)))
"""Decoded types the raising walk must look at: containers, pending payloads and nil."""


def _payload(p: _Pending) -> list[Any]:
    body = _unpack(p.data)
    n = 2 if p.code == EXT_VARIANT else 6
    if type(body) is not list or len(body) != n:
        raise CodecError(f"bad {'variant' if n == 2 else 'closure'} payload")
    if n == 2 and type(body[0]) is not str:
        raise CodecError("variant tag must be a string")
    if n == 6 and type(body[2]) is not dict:
        raise CodecError("bad closure payload")
    return body


def _raise(root: Any) -> Any:
    """Decoded msgpack data as a ral value: pending payloads decoded, nil and bad keys refused.

    Iterative: the stack holds ``(node, holder, key, level)`` visits and ``(body, holder, key,
    -1)`` builds; a build is pushed under the visits of its payload's items, so it runs once
    they are raised, and then replaces the pending value in its holder's slot with the variant
    or closure.
    """
    box = [root]
    stack: list[tuple[Any, Any, Any, int]] = [(root, box, 0, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, holder, key, level = pop()
        if level < 0:  # a build: node is the raised body of the pending value in the slot
            holder[key] = _build(holder[key], node)
            continue
        if node is None:
            raise CodecError("nil is not a ral value")
        if level > MAX_VALUE_NESTING:
            raise CodecError(TOO_DEEP)
        t = type(node)
        if t is list:
            if len(node) > 8 and _RAISE.isdisjoint(set(map(type, node))):
                continue
            level += 1
            for i, x in enumerate(node):
                if type(x) in _RAISE:
                    push((x, node, i, level))
        elif t is dict:
            level += 1
            for k, x in node.items():
                if type(k) is not str:
                    raise CodecError("map keys must be strings")
                if type(x) in _RAISE:
                    push((x, node, k, level))
        elif t is _Pending:
            body = _payload(node)
            if node.code == EXT_VARIANT and type(body[1]) not in _RAISE:
                holder[key] = Variant(body[0], body[1])  # a variant of a leaf: built at once
                continue
            push((body, holder, key, -1))
            level += 1
            if node.code == EXT_VARIANT:
                push((body[1], body, 1, level))
            else:
                captured = body[2]
                _check_keys(captured)
                level += 1  # the captured map is a level of its own
                if level > MAX_VALUE_NESTING:
                    raise CodecError(TOO_DEEP)
                for k, x in captured.items():
                    if type(x) in _RAISE:
                        push((x, captured, k, level))
    return box[0]


def _check_keys(m: dict[Any, Any]) -> None:
    for k in m:
        if type(k) is not str:
            raise CodecError("map keys must be strings")


def _build(p: _Pending, body: list[Any]) -> Any:
    if p.code == EXT_VARIANT:
        return Variant(body[0], body[1])
    return _decode_closure(body)


def _decode_closure(body: list[Any]) -> Closure:
    source, params, captured, rec_name, line, col = body
    if (
        type(source) is not str
        or type(params) is not list
        or not all(type(p) is str for p in params)
        or (rec_name is not None and type(rec_name) is not str)
        or type(line) is not int
        or type(col) is not int
    ):
        raise CodecError("bad closure payload")
    key = (source, tuple(params), rec_name, line, col, frozenset(captured))
    code = _code_cache.get(key)
    if code is None:
        code = _compile_closure(source, tuple(params), rec_name, line, col, set(captured))
        _code_cache[key] = code
        if len(_code_cache) > _CODE_CACHE_SIZE:
            _code_cache.popitem(last=False)
    else:
        _code_cache.move_to_end(key)
    return Closure(code, captured, rec_name)


def _compile_closure(
    source: str, params: tuple[str, ...], rec_name: str | None, line: int, col: int, names: set[str]
) -> Any:
    try:
        node = parse_block(source, max(line, 1), max(col, 1))
    except RalSyntaxError as e:
        raise CodecError(f"closure source does not parse: {e}") from None
    if node.params != params:
        raise CodecError("closure parameters do not match its source")
    Elaborator(frozenset(), lenient=True).block(node, Scope("frame", names, None), rec_name)
    return node.code


def decode_value(b: bytes) -> Any:
    """The ral value encoded in ``b``; :class:`CodecError` on any malformed input."""
    if not isinstance(b, bytes | bytearray | memoryview):
        raise CodecError("expected bytes")
    try:
        v, pending = _unpack_top(bytes(b))
        return _raise(v) if pending else _check_plain(v)
    except CodecError:
        raise
    except msgpack.StackError:
        raise CodecError(TOO_DEEP) from None
    except RecursionError:  # a closure source nested deeper than this thread's stack allows
        raise CodecError("value nested too deeply") from None
    except Exception as e:  # msgpack raises a zoo: ExtraData, ValueError, TypeError, ...
        raise CodecError(f"cannot decode value: {type(e).__name__}: {e}") from None
