"""park_mode as the table in runtime/fleet/park.py: every row, and the precedence between rows."""

from __future__ import annotations

import itertools

import pytest

from exarch_actors.runtime.fleet.park import Construction, ParkMode, park_mode, returns_for

Q, H, E, C, W, U = (
    ParkMode.QUIESCE,
    ParkMode.HELD,
    ParkMode.ENGAGED,
    ParkMode.HELD_BY_CHILDREN,
    ParkMode.HELD_BY_WORKERS,
    ParkMode.UNTIL_CANCELLED,
)

# interactive, returns, has_parent, listed, engaged, live_descendants, schedules_armed -> mode
TABLE = [
    # row 1: conversing and reaped by /clear or /close -> Quiesce, whatever else holds
    (True, False, False, False, False, True, True, Q),
    (True, False, True, False, True, True, True, Q),
    # row 2: conversing and listed -> Held, ahead of children and schedules
    (True, False, False, True, False, False, False, H),
    (True, False, True, True, True, True, True, H),
    # row 3: parented returning agent with a human exchange -> Engaged, ahead of children
    (False, True, True, True, True, False, False, E),
    (True, True, True, True, True, True, True, E),
    (False, True, True, False, True, True, True, E),
    # Engaged needs a parent: a headless trunk with an exchange falls through
    (False, True, False, True, True, False, False, Q),
    # row 4: live descendants hold it
    (False, True, True, True, False, True, False, C),
    (False, True, False, True, False, True, True, C),
    # row 5: a live self-schedule holds it until cancelled
    (False, True, True, True, False, False, True, U),
    (False, True, False, True, False, False, True, U),
    # row 6: otherwise quiesce (the one-shot contract)
    (False, True, False, True, False, False, False, Q),
    (False, True, True, True, False, False, False, Q),
    (True, True, True, True, False, False, False, Q),
]


@pytest.mark.parametrize(
    "interactive,returns,has_parent,listed,engaged,live_descendants,schedules_armed,expected", TABLE
)
def test_park_mode_follows_the_seed_table_row_by_row(
    interactive: bool,
    returns: bool,
    has_parent: bool,
    listed: bool,
    engaged: bool,
    live_descendants: bool,
    schedules_armed: bool,
    expected: ParkMode,
) -> None:
    assert (
        park_mode(
            interactive=interactive,
            returns=returns,
            has_parent=has_parent,
            listed=listed,
            engaged=engaged,
            live_descendants=live_descendants,
            schedules_armed=schedules_armed,
        )
        is expected
    )


def _reference(i: bool, r: bool, p: bool, li: bool, e: bool, d: bool, s: bool, w: bool) -> ParkMode:
    conversing = i and not r
    rows = [
        (conversing and not li, Q),
        (conversing, H),
        (p and r and e, E),
        (d, C),
        (w, W),
        (s, U),
        (True, Q),
    ]
    return next(mode for cond, mode in rows if cond)


def test_every_one_of_the_256_input_combinations_takes_the_first_matching_row() -> None:
    for combo in itertools.product([False, True], repeat=8):
        i, r, p, li, e, d, s, w = combo
        got = park_mode(
            interactive=i,
            returns=r,
            has_parent=p,
            listed=li,
            engaged=e,
            live_descendants=d,
            schedules_armed=s,
            live_workers=w,
        )
        assert got is _reference(*combo), combo


def test_running_workers_hold_an_agent_that_would_otherwise_quiesce() -> None:
    # a headless trunk and a settled-children sub-agent: the one-shot contract, unless workers
    # it spawned are still running (their results are surfaced into its inbox)
    for has_parent in (False, True):
        idle = dict(
            interactive=False,
            returns=True,
            has_parent=has_parent,
            listed=True,
            engaged=False,
            live_descendants=False,
        )
        assert park_mode(**idle, schedules_armed=False) is Q
        assert park_mode(**idle, schedules_armed=False, live_workers=True) is W
        assert park_mode(**idle, schedules_armed=True, live_workers=True) is W
        assert W.parks


def test_returns_is_fixed_by_construction_fork_true_branch_false_trunk_not_interactive() -> None:
    assert returns_for(Construction.FORK, interactive=True) is True
    assert returns_for(Construction.FORK, interactive=False) is True
    assert returns_for(Construction.BRANCH, interactive=True) is False
    assert returns_for(Construction.TRUNK, interactive=True) is False
    assert returns_for(Construction.TRUNK, interactive=False) is True
