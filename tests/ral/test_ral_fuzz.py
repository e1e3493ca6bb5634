"""The ral fuzz in CI: 10,000 generated examples through the lexer, parser and evaluator.

Each example runs in a fresh session with no exec grant and no file root, is cancelled after
:data:`BUDGET` seconds (a generated infinite computation ends like any cancelled run), and must
end in a typed outcome: a value that renders, prints as JSON and survives the codec, or a ral
error of kind syntax, elaboration, runtime or cancelled. Anything else escapes the run and fails
the test with the program's text. The two tests together cost ~19 s of CPU (measured on the
development machine under load: 1.8-2.3 ms per example, most of it Hypothesis's own
bookkeeping); ``benchmarks/ral_fuzz.py`` runs the same contract for as long as you like.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.ral_programs import GRAMMAR, TEXT, check, run_bounded

BUDGET = 0.5
"""Seconds after which a run is cancelled. Generated programs stay small (loops over at most a
few hundred items), so almost every example ends by itself in a few milliseconds."""

LIMIT = 5.0
"""Seconds within which every run must have returned. Cancellation is noticed within a
millisecond at the evaluator's poll points; the headroom is for a loaded machine, not for slow
examples: a hang, the thing this guards, never returns at all. The issue's figure is 2 s, which
``benchmarks/ral_fuzz.py`` asserts by default on a quiet machine."""

FUZZ = settings(
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.slow
@FUZZ
@given(GRAMMAR)
def test_grammar_shaped_programs_end_in_a_typed_outcome_in_time(source: str) -> None:
    check(run_bounded(source, _cwd(), BUDGET), LIMIT)


@pytest.mark.slow
@FUZZ
@given(TEXT)
def test_hostile_text_ends_in_a_typed_outcome_in_time(source: str) -> None:
    check(run_bounded(source, _cwd(), BUDGET), LIMIT)


def _cwd() -> str:
    """A directory the runs may name but not touch (no file root is granted)."""
    return str(Path(__file__).resolve().parent)
