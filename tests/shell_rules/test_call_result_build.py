"""The per-call records built without per-field setattr equal the ones their constructors build.

``CallResult.of``/``CallResult.answered`` and the session's ``_run_result`` skip the frozen
dataclass's ``object.__setattr__`` per field (a trivial round trip's cost); what they make must
be the same value, field for field, and a bad field is refused as the constructor refuses it.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.actors.call_result import CallResult
from exarch_actors.runtime.ral.session import ErrorInfo, RunResult, _run_result

_text = st.text(max_size=8)
_names = st.frozensets(st.sampled_from(["a", "b", "c"]))


@given(
    value=_text,
    stdout=_text,
    error=st.none() | _text,
    referenced=_names,
    defined=st.lists(st.sampled_from(["a", "b"]), max_size=2).map(tuple),
    compiled=st.booleans(),
    rolled_back=st.booleans(),
    epoch=st.integers(0, 10**6),
    host_pid=st.none() | st.integers(1, 10**6),
)
def test_call_result_of_is_the_value_the_constructor_makes(**fields: object) -> None:
    made, want = CallResult.of(**fields), CallResult(**fields)  # type: ignore[arg-type]
    assert made == want and repr(made) == repr(want) and hash(made) == hash(want)
    assert dataclasses.asdict(made) == dataclasses.asdict(want)


@given(value=_text, epoch=st.integers(0, 10**6), pid=st.integers(1, 10**6), at=st.floats(0, 1e9))
def test_an_answered_call_is_the_value_the_constructor_makes(
    value: str, epoch: int, pid: int, at: float
) -> None:
    made = CallResult.answered(value, epoch, pid, at)
    assert made == CallResult(value=value, epoch=epoch, host_pid=pid, host_started_at=at)


def test_call_result_of_refuses_an_unknown_or_missing_field_as_the_constructor_does() -> None:
    with pytest.raises(TypeError, match="bogus"):
        CallResult.of(value="1", bogus=2)
    with pytest.raises(TypeError, match="value"):
        CallResult.of(epoch=1)


def test_a_call_result_built_fast_stays_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CallResult.answered("1", 1, 2, 3.0).value = "2"  # type: ignore[misc]


@given(
    value=st.integers() | _text,
    out=_text,
    error=st.none() | st.builds(ErrorInfo, _text, st.integers(0, 9), st.integers(0, 9), _text),
    referenced=_names,
    compiled=st.booleans(),
    shown=_text,
)
def test_a_run_result_built_fast_is_the_value_the_constructor_makes(
    value: object,
    out: str,
    error: ErrorInfo | None,
    referenced: frozenset[str],
    compiled: bool,
    shown: str,
) -> None:
    args = (value, out, "", error, referenced, compiled, ("a",), shown)
    made, want = _run_result(*args), RunResult(*args)  # type: ignore[arg-type]
    assert made == want and repr(made) == repr(want)
    assert set(vars(made)) == {f.name for f in dataclasses.fields(RunResult)}
