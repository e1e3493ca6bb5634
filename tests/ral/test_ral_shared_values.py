"""Values that share structure: ``[$a, $a]`` holds ``$a`` twice, so a value can be exponentially
larger written out than in memory. Rendering, encoding and comparing such a value stay bounded:
an oversized one renders as a placeholder and is refused by the codec (``ValueTooLarge``), and a
cancel reaches a long rendering (docs/language.md, Values)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.ral.codec import decode_value, encode_value
from exarch_actors.runtime.ral.errors import CodecError, ValueTooLarge
from exarch_actors.runtime.ral.session import RunResult, Session
from exarch_actors.runtime.ral.values import (
    MAX_EXPANDED_ITEMS,
    Variant,
    expanded_size,
    refuse_oversized,
    render,
    values_equal,
)
from tests.support.ral_programs import rendering_after_marker
from tests.support.waiting import HANG_GUARD, wait_for

DOUBLED_60 = "fold { |a, x| [$a, $a] } [1] (range 60)"
"""61 distinct lists, 2**61 - 1 + 2**60 items written out."""

PLACEHOLDER = f"<value of over {MAX_EXPANDED_ITEMS} items>"


def _doubled(times: int) -> list[Any]:
    v: list[Any] = [1]
    for _ in range(times):
        v = [v, v]
    return v


def test_echo_of_a_value_that_doubled_itself_60_times_prints_a_placeholder(
    session: Session,
) -> None:
    r = session.run(f"let x = {DOUBLED_60}; echo $x; str $x")
    assert r.error is None, r.error
    assert r.stdout == PLACEHOLDER + "\n"
    assert r.value == PLACEHOLDER


def test_a_value_that_doubled_itself_60_times_as_the_result_renders_as_the_placeholder(
    session: Session,
) -> None:
    r = session.run(DOUBLED_60)
    assert r.error is None and render(r.value) == PLACEHOLDER


def test_the_codec_refuses_a_value_over_the_limit_written_out_with_value_too_large() -> None:
    with pytest.raises(ValueTooLarge, match="value too large: over") as refused:
        encode_value(_doubled(60))
    assert isinstance(refused.value, CodecError)
    with pytest.raises(ValueTooLarge):
        encode_value([Variant("ok", _doubled(60))])


def test_a_shared_value_under_the_limit_encodes_as_its_unshared_copy() -> None:
    v = _doubled(10)
    back = decode_value(encode_value(v))
    assert values_equal(back, v) and render(back) == render(v)
    assert expanded_size(back) == expanded_size(v) == 2**11 - 1 + 2**10


def test_a_closure_that_captured_a_value_over_the_limit_is_refused_by_the_codec(
    session: Session,
) -> None:
    r = session.run(f"let x = {DOUBLED_60}; {{ || len $x }}")
    assert r.error is None
    with pytest.raises(ValueTooLarge):
        encode_value(r.value)
    assert render(r.value) == "<closure { || len $x }>"  # its display form shows none of it
    refuse_oversized(r.value, closures=False)


def test_a_cancel_reaches_the_rendering_of_a_large_shared_value(
    session: Session, tmp_path: Path
) -> None:
    """2**23 leaves (under the limit) take seconds to render; the cancel lands mid-rendering
    (the marker is written once the value is built) and the run ends ``cancelled``: it used to
    finish the text first."""
    marker = tmp_path / "rendering"
    box: list[RunResult] = []
    script = rendering_after_marker(marker)
    t = threading.Thread(target=lambda: box.append(session.run(script)))
    t.start()
    try:
        wait_for(marker.exists, HANG_GUARD, "the rendering to start")
        session.cancel("interrupted")
    finally:
        t.join(HANG_GUARD)
    assert box and box[0].error is not None and box[0].error.kind == "cancelled"
    assert box[0].stdout == ""


# -- the size rule, over many shapes ------------------------------------------------------------

_LEAVES = st.one_of(st.integers(-3, 3), st.sampled_from(["", "a", "b c"]), st.booleans())


@st.composite
def shared_values(draw: st.DrawFn) -> Any:
    """A value built as ral builds one: each new container holds earlier values, any of them
    possibly more than once (so parts are shared)."""
    pool: list[Any] = [draw(_LEAVES)]
    for _ in range(draw(st.integers(1, 12))):
        picks = draw(st.lists(st.integers(0, len(pool) - 1), max_size=4))
        items = [pool[i] for i in picks]
        kind = draw(st.sampled_from(["list", "map", "variant"]))
        if kind == "list":
            pool.append(items)
        elif kind == "map":
            pool.append({f"k{i}": x for i, x in enumerate(items)})
        else:
            pool.append(Variant("t", items[0] if items else draw(_LEAVES)))
    return pool[-1]


def _unshared(v: Any) -> Any:
    """A copy in which no container occurs twice."""
    if type(v) is list:
        return [_unshared(x) for x in v]
    if type(v) is dict:
        return {k: _unshared(x) for k, x in v.items()}
    if type(v) is Variant:
        return Variant(v.tag, _unshared(v.payload))
    return v


def _count(v: Any) -> int:
    """Items written out, the plain recursive way."""
    if type(v) is list:
        return 1 + sum(_count(x) for x in v)
    if type(v) is dict:
        return 1 + sum(_count(x) for x in v.values())
    if type(v) is Variant:
        return 1 + _count(v.payload)
    return 1


@settings(max_examples=200, deadline=None)
@given(shared_values())
def test_expanded_size_counts_a_shared_part_each_time_it_occurs(v: Any) -> None:
    copy = _unshared(v)
    assert expanded_size(v) == expanded_size(copy) == _count(copy)
    with pytest.raises(ValueTooLarge):
        expanded_size(v, _count(copy) - 1)


@settings(max_examples=200, deadline=None)
@given(shared_values())
def test_a_shared_value_renders_encodes_and_compares_as_its_unshared_copy(v: Any) -> None:
    copy = _unshared(v)
    assert render(v) == render(copy)
    assert encode_value(v) == encode_value(copy)
    assert values_equal(v, copy)
