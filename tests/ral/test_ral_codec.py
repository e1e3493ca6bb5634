"""Every value encodes with msgpack and decodes to an equal value."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.ral.codec import decode_text, decode_value, encode_text, encode_value
from exarch_actors.runtime.ral.errors import CodecError
from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.ral.values import (
    UNIT,
    Builtin,
    Closure,
    Variant,
    WorkerHandle,
    values_equal,
)

_session = Session(faults=False)
_CLOSURE_SOURCES = [
    "let c = { |a, b| add $a $b }",
    "let k = 7; let c = { |x| mul $x $k }",
    "let rec c = { |n| if (lt $n 1) { 0 } else { c (sub $n 1) } }",
    "let inner = { 'hi' }; let c = { |x| [got: $x, f: $inner] }",
]


def _closure(i: int) -> Closure:
    r = _session.run(_CLOSURE_SOURCES[i])
    assert r.error is None
    c = _session.get("c")
    assert isinstance(c, Closure)
    return c


scalars = st.one_of(
    st.just(UNIT),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.binary(),
    st.builds(WorkerHandle, st.text(min_size=1, max_size=8)),
    st.sampled_from(["echo", "add", "view-text", "agent"]).map(Builtin),
    st.integers(0, len(_CLOSURE_SOURCES) - 1).map(_closure),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.text(max_size=6), inner, max_size=5),
        st.builds(Variant, st.text(min_size=1, max_size=6), inner),
    ),
    max_leaves=25,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(values)
def test_any_value_round_trips_to_an_equal_value(v: Any) -> None:
    assert values_equal(decode_value(encode_value(v)), v)


@settings(max_examples=150, deadline=None)
@given(values)
def test_any_value_round_trips_through_its_text_form_with_its_type(v: Any) -> None:
    text = encode_text(v)
    assert text is not None and text.isascii()
    back = decode_text(text)
    assert values_equal(back, v) and type(back) is type(v)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_any_text_decodes_to_a_value_or_raises_codec_error(text: str) -> None:
    try:
        decode_text(text)
    except CodecError:
        pass


def test_a_non_value_has_no_text_form() -> None:
    assert encode_text(object()) is None


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_codec_error(b: bytes) -> None:
    try:
        decode_value(b)
    except CodecError:
        pass


def test_equality_is_tag_exact() -> None:
    assert not values_equal(True, 1) and not values_equal(1, 1.0) and not values_equal("1", 1)
    assert values_equal([1, [UNIT]], [1, [UNIT]]) and not values_equal(
        {"a": 1, "b": 2}, {"b": 2, "a": 1}
    )


def test_a_decoded_closure_runs_with_its_captured_bindings(session: Session) -> None:
    session.run("let k = 10; let rec f = { |n| if (lt $n 1) { $k } else { f (sub $n 1) } }")
    blob = encode_value(session.get("f"))
    fresh = Session(faults=False)
    try:
        fresh.restore({"g": decode_value(blob)}, fresh.context)
        assert fresh.run("g 3").value == 10
    finally:
        fresh.close()


def test_a_decoded_closure_keeps_error_positions_of_its_original_source(session: Session) -> None:
    session.run("let f = {\n  div 1 0\n}")
    g = decode_value(encode_value(session.get("f")))
    fresh = Session(faults=False)
    try:
        fresh.restore({"g": g}, fresh.context)
        r = fresh.run("g")
        assert r.error is not None and (r.error.line, r.error.col) == (2, 3)
    finally:
        fresh.close()


def test_a_builtin_encodes_by_name_and_a_non_value_cannot_be_encoded() -> None:
    assert decode_value(encode_value(Builtin("echo"))) == Builtin("echo")
    with pytest.raises(CodecError):
        encode_value([1, object()])


def test_foreign_msgpack_data_is_refused() -> None:
    with pytest.raises(CodecError):
        decode_value(msgpack.packb(None))
    with pytest.raises(CodecError):
        decode_value(msgpack.packb({1: 2}))
    with pytest.raises(CodecError):
        decode_value(
            msgpack.packb(msgpack.ExtType(3, msgpack.packb(["{ oops", [], {}, None, 1, 1])))
        )
    with pytest.raises(CodecError):
        decode_value(b"\xc1")


def test_value_size_is_the_encoded_length() -> None:
    from exarch_actors.runtime.ral.codec import value_size

    assert value_size("x" * 100) == len(encode_value("x" * 100))
