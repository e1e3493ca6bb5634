"""The supervisor's restart rule (OTP restart intensity): at most 3 restarts in 60 s per agent,
then ``down`` with the cause. The clock is injected, so every timeline here is exact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.fleet.supervision import (
    MAX_RESTARTS,
    RESTART_WINDOW,
    Action,
    RestartIntensity,
)


def test_three_crashes_in_a_minute_restart_and_the_fourth_settles_down_with_its_cause() -> None:
    rule = RestartIntensity()
    decisions = [rule.crashed(t, f"crash {t}") for t in (0.0, 10.0, 20.0, 30.0)]
    assert [d.action for d in decisions] == [Action.RESTART] * 3 + [Action.DOWN]
    assert decisions[-1].cause == "crash 30.0"
    assert rule.down is decisions[-1]
    assert "crashed past its restart intensity: crash 30.0" in decisions[-1].detail


def test_a_crash_once_the_oldest_restart_left_the_window_restarts_again() -> None:
    rule = RestartIntensity()
    for t in (0.0, 10.0, 20.0):
        assert rule.crashed(t, "x").action is Action.RESTART
    assert rule.crashed(60.0, "x").action is Action.RESTART  # the restart at 0 s is 60 s old
    assert rule.crashed(61.0, "x").action is Action.DOWN  # 10, 20, 60 lie within 61 - 60


def test_a_down_agent_stays_down_with_the_original_cause_whatever_comes_later() -> None:
    rule = RestartIntensity(max_restarts=0)
    first = rule.crashed(0.0, "poisoned snapshot")
    assert first.action is Action.DOWN
    assert rule.crashed(1_000.0, "later") is first


def test_a_rule_with_no_window_is_refused() -> None:
    with pytest.raises(ValueError):
        RestartIntensity(window=0)


timelines = st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), max_size=40).map(
    sorted
)


@given(timelines, st.integers(min_value=0, max_value=5), st.floats(min_value=0.5, max_value=120))
def test_no_window_ever_holds_more_restarts_than_the_intensity_and_refusals_are_justified(
    crashes: list[float], intensity: int, window: float
) -> None:
    rule = RestartIntensity(max_restarts=intensity, window=window)
    restarts: list[float] = []
    down_at: float | None = None
    for t in crashes:
        d = rule.crashed(t, f"at {t}")
        if d.action is Action.RESTART:
            assert down_at is None, "restarted after settling down"
            restarts.append(t)
        elif down_at is None:
            down_at = t
            # refused only because `intensity` restarts already lie in the window before it
            assert len([r for r in restarts if r > t - window]) >= intensity
    for start in restarts:
        assert len([r for r in restarts if start <= r < start + window]) <= intensity


def test_the_defaults_are_three_restarts_in_sixty_seconds() -> None:
    assert (MAX_RESTARTS, RESTART_WINDOW) == (3, 60.0)
