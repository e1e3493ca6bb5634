"""Compaction policy (runtime.fleet.compaction): when it is due, when it is allowed, what
survives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.constants import COMPACT_THRESHOLD
from exarch_actors.runtime.fleet.compaction import (
    BYTES_PER_TOKEN_ESTIMATE,
    can_compact,
    compaction_due,
    suffix_start,
)


def test_due_when_used_tokens_enter_the_top_15_percent_of_a_known_window() -> None:
    assert not compaction_due(8499, 10_000, 0)
    assert compaction_due(8500, 10_000, 0)


def test_a_known_window_ignores_history_bytes() -> None:
    assert not compaction_due(100, 10_000, COMPACT_THRESHOLD * 10)


def test_unknown_window_falls_back_to_500_kib_of_history() -> None:
    assert COMPACT_THRESHOLD == 500 * 1024
    assert not compaction_due(None, None, COMPACT_THRESHOLD)
    assert compaction_due(None, None, COMPACT_THRESHOLD + 1)
    assert compaction_due(10**9, None, COMPACT_THRESHOLD + 1)
    assert not compaction_due(10**9, 0, 10)  # a zero window is unknown, not "always due"


def test_known_window_without_usage_estimates_tokens_from_history_bytes() -> None:
    assert not compaction_due(None, 8000, 10)
    assert not compaction_due(None, 8000, 6800 * BYTES_PER_TOKEN_ESTIMATE - 1)
    assert compaction_due(None, 8000, 6800 * BYTES_PER_TOKEN_ESTIMATE)  # 85% of the window
    assert compaction_due(None, 8000, COMPACT_THRESHOLD + 1)


@given(window=st.integers(1, 2_000_000), history=st.integers(0, 50 << 20))
def test_a_server_that_reports_no_usage_is_compacted_by_the_estimate_never_past_the_byte_fallback(
    window: int, history: int
) -> None:
    due = compaction_due(None, window, history)
    assert due == (history // BYTES_PER_TOKEN_ESTIMATE >= window * 0.85)
    if history > COMPACT_THRESHOLD and window * 0.85 <= COMPACT_THRESHOLD // 3:
        assert due  # a window small enough to matter is never outlived by the 500 KiB fallback


def test_compaction_is_allowed_only_with_no_pending_tool_results() -> None:
    assert can_compact(0)
    assert not can_compact(1)


def test_the_suffix_starts_at_a_user_role_event_that_fits_the_budget() -> None:
    kinds = ["user", "assistant", "tool_result", "assistant", "user", "assistant", "tool_result"]
    sizes = [10, 10, 10, 10, 10, 10, 10]
    assert suffix_start(kinds, sizes, budget=35) == 4
    assert suffix_start(kinds, sizes, budget=1000) == 4  # index 0 never: something is dropped
    assert suffix_start(kinds, sizes, budget=25) == 7  # nothing fits: summarise everything


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["user", "assistant", "tool_result", "nudge", "note"]),
            st.integers(1, 100),
        ),
        max_size=40,
    ),
    st.integers(0, 2000),
)
def test_the_suffix_never_starts_mid_batch_and_always_fits(
    events: list[tuple[str, int]], budget: int
) -> None:
    kinds = [k for k, _ in events]
    sizes = [s for _, s in events]
    i = suffix_start(kinds, sizes, budget)
    assert 1 <= i <= len(kinds) or (i == 0 and not kinds)
    if i < len(kinds):
        assert kinds[i] in ("user", "nudge", "steering")
        assert sum(sizes[i:]) <= budget
