"""The per-shell limits as values: sizes on the command line, validation, and the run.json form."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.shell.limits import (
    DEFAULT_MAX_BINDING_BYTES,
    DEFAULT_MAX_WORKERS,
    DEFAULT_SHELL_MEMORY,
    BadLimit,
    GiB,
    MiB,
    ShellLimits,
    format_size,
    parse_size,
)

UNITS = {"": 1, "K": 1 << 10, "M": MiB, "G": GiB}


@given(
    n=st.integers(min_value=0, max_value=1 << 20),
    unit=st.sampled_from(sorted(UNITS)),
    suffix=st.sampled_from(["", "B", "iB"]),
    lower=st.booleans(),
)
def test_a_size_is_a_number_with_an_optional_binary_unit_in_any_case(
    n: int, unit: str, suffix: str, lower: bool
) -> None:
    if not unit and suffix == "iB":
        suffix = ""  # "12iB" is not a size
    text = f"{n}{unit}{suffix}"
    assert parse_size(text.lower() if lower else text) == n * UNITS[unit]


@pytest.mark.parametrize("text", ["", "lots", "-1", "1.5G", "2 GB extra", "0x10", "1P", "12iB"])
def test_anything_else_is_refused_as_not_a_size(text: str) -> None:
    with pytest.raises(BadLimit, match="not a size"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=1 << 44))
def test_a_formatted_size_parses_back_to_the_same_bytes(n: int) -> None:
    shown = format_size(n)
    assert parse_size(shown.replace(" bytes", "").replace(" ", "")) == n


def test_the_defaults_are_2_gib_64_workers_and_256_mib() -> None:
    limits = ShellLimits()
    assert limits.memory_bytes == DEFAULT_SHELL_MEMORY == 2 * GiB
    assert limits.max_workers == DEFAULT_MAX_WORKERS == 64
    assert limits.max_binding_bytes == DEFAULT_MAX_BINDING_BYTES == 256 * MiB


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_bytes": 32 * MiB}, "below the 64 MiB a shell host needs"),
        ({"max_workers": 0}, "max workers must be at least 1"),
        ({"max_binding_bytes": 0}, "max binding bytes must be at least 1"),
    ],
)
def test_a_limit_that_cannot_work_is_refused_with_what_is_wrong(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadLimit, match=message):
        ShellLimits(**kwargs)


@given(
    memory=st.none() | st.integers(min_value=64 * MiB, max_value=1 << 40),
    workers=st.integers(min_value=1, max_value=10_000),
    binding=st.integers(min_value=1, max_value=1 << 40),
)
def test_limits_survive_the_run_json_round_trip(
    memory: int | None, workers: int, binding: int
) -> None:
    limits = ShellLimits(memory, workers, binding)
    assert ShellLimits.from_json(limits.to_json()) == limits


def test_a_run_json_without_limits_resumes_under_the_defaults() -> None:
    assert ShellLimits.from_json(None) == ShellLimits()
    assert ShellLimits.from_json({"maxWorkers": 3}) == ShellLimits(max_workers=3)
