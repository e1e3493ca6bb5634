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

A closure travels as its source span and its captured bindings; decoding re-parses and
re-elaborates the span (cached per shape, so a snapshot with many closures made from the same
block parses it once). Builtins never encode. Any malformed input raises :class:`CodecError`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgpack

from runtime.ral.errors import CodecError, RalSyntaxError
from runtime.ral.values import UNIT, Builtin, Closure, Unit, Variant, WorkerHandle

EXT_UNIT = 1
EXT_VARIANT = 2
EXT_CLOSURE = 3
EXT_WORKER = 4
EXT_BIGINT = 5

_CODE_CACHE_SIZE = 512
_code_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()


def _default(v: Any) -> Any:
    t = type(v)
    if t is Unit:
        return msgpack.ExtType(EXT_UNIT, b"")
    if t is Variant:
        return msgpack.ExtType(EXT_VARIANT, _pack([v.tag, v.payload]))
    if t is Closure:
        body = [v.source, list(v.params), v.captured, v.rec_name, v.line, v.col]
        return msgpack.ExtType(EXT_CLOSURE, _pack(body))
    if t is WorkerHandle:
        return msgpack.ExtType(EXT_WORKER, v.id.encode("utf-8"))
    if t is int:
        n = (v.bit_length() + 8) // 8
        return msgpack.ExtType(EXT_BIGINT, v.to_bytes(n, "big", signed=True))
    if t is Builtin:
        raise CodecError(f"a builtin ({v.name}) cannot be encoded")
    if t is dict:
        bad = next(k for k in v if type(k) is not str)
        raise CodecError(f"map keys must be strings, found {type(bad).__name__}")
    raise CodecError(f"not a ral value: {t.__name__}")


def _pack(v: Any) -> bytes:
    return msgpack.packb(v, default=_default, use_bin_type=True, strict_types=True)


def encode_value(v: Any) -> bytes:
    """msgpack bytes of a ral value; :class:`CodecError` for builtins or non-values."""
    try:
        return _pack(v)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError) as e:
        raise CodecError(f"cannot encode value: {e}") from None


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_UNIT:
        if data:
            raise CodecError("unit carries no payload")
        return UNIT
    if code == EXT_VARIANT:
        tag, payload = _unpack_list(data, 2, "variant")
        if type(tag) is not str:
            raise CodecError("variant tag must be a string")
        return Variant(tag, _check(payload))
    if code == EXT_CLOSURE:
        return _decode_closure(data)
    if code == EXT_WORKER:
        return WorkerHandle(data.decode("utf-8"))
    if code == EXT_BIGINT:
        if not data:
            raise CodecError("empty bigint")
        return int.from_bytes(data, "big", signed=True)
    raise CodecError(f"unknown extension type {code}")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True, use_list=True)


def _unpack_list(data: bytes, n: int, what: str) -> list[Any]:
    v = _unpack(data)
    if type(v) is not list or len(v) != n:
        raise CodecError(f"bad {what} payload")
    return v


def _check(v: Any) -> Any:
    """Refuse decoded data that is not a ral value (nil, non-string map keys)."""
    t = type(v)
    if t is list:
        for x in v:
            _check(x)
    elif t is dict:
        for k, x in v.items():
            if type(k) is not str:
                raise CodecError("map keys must be strings")
            _check(x)
    elif v is None:
        raise CodecError("nil is not a ral value")
    return v


def _decode_closure(data: bytes) -> Closure:
    source, params, captured, rec_name, line, col = _unpack_list(data, 6, "closure")
    if (
        type(source) is not str
        or type(params) is not list
        or not all(type(p) is str for p in params)
        or type(captured) is not dict
        or (rec_name is not None and type(rec_name) is not str)
        or type(line) is not int
        or type(col) is not int
    ):
        raise CodecError("bad closure payload")
    _check(captured)
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
    from runtime.ral.compile import Elaborator, Scope
    from runtime.ral.parser import parse_block

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
        return _check(_unpack(bytes(b)))
    except CodecError:
        raise
    except RecursionError:
        raise CodecError("value nested too deeply") from None
    except Exception as e:  # msgpack raises a zoo: ExtraData, ValueError, TypeError, ...
        raise CodecError(f"cannot decode value: {type(e).__name__}: {e}") from None
