"""Grants only narrow: a meet never allows what either side refuses, and a child's grants (the
fleet policy applied to its parent's) are never wider than its parent's, the command line's or
any matching scenario table. Hypothesis over small pools so nesting and overlap are common."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.errors import GrantUnresolvable
from exarch_actors.runtime.ral.grants import ExecGrant, GrantPolicy, Grants

PROGRAMS = [
    ExecGrant("cat", "/usr/bin/cat", "/usr/bin/cat"),
    ExecGrant("cat", "/bin/cat", "/usr/bin/cat"),  # another path to the same file
    ExecGrant("cat", "/opt/bin/cat", "/opt/bin/cat"),  # same name, another file: never with ^
    ExecGrant("ls", "/usr/bin/ls", "/usr/bin/ls"),
    ExecGrant("sh", "/bin/sh", "/usr/bin/dash"),
    ExecGrant("py", "/venv/bin/py", "/usr/bin/python3"),
]
ROOTS = ["/r", "/r/a", "/r/a/b", "/r/c", "/s", "/rr"]
HEADS = ["cat", "ls", "sh", "py", "rm", "/usr/bin/cat", "/opt/bin/cat", "/usr/bin/dash", "./x"]
REAL = {g.path: g.real for g in PROGRAMS}
PATHS = ["/", "/r", "/r/a/x", "/r/a/b/y", "/r/c/z", "/r/d", "/rr/q", "/s", "/s/t", "/t"]
NAMES = ["trunk", "worker-1", "worker-2", "kid", "kid-branch"]
PATTERNS = ["*", "trunk", "worker-*", "kid*", "kid", "nobody"]


def _one_file_per_name(programs: frozenset[ExecGrant]) -> bool:
    return all(
        len({g.real for g in programs if g.name == n}) == 1 for n in {g.name for g in programs}
    )


def _grants() -> st.SearchStrategy[Grants]:
    exec_ = st.none() | st.frozensets(st.sampled_from(PROGRAMS)).filter(_one_file_per_name)
    roots = st.none() | st.lists(st.sampled_from(ROOTS), unique=True).map(tuple)
    # _trusted: these are already-resolved parts (no lookups, no realpath of made-up paths)
    return st.builds(Grants._trusted, exec_, roots)


def _policies() -> st.SearchStrategy[GrantPolicy]:
    tables = st.lists(st.tuples(st.sampled_from(PATTERNS), _grants()), max_size=4).map(tuple)
    return st.builds(GrantPolicy, _grants(), tables)


def runs(g: Grants, head: str) -> str | None:
    """The real file ``head`` would run ("any" when unrestricted), or None when refused."""
    if g.exec is None:
        return "any"
    path = g.program(head, "/")
    return None if path is None else REAL[path]


def narrower(child: Grants, parent: Grants) -> bool:
    """Everything ``child`` allows, ``parent`` allows too, and runs the same file."""
    for head in HEADS:
        c = runs(child, head)
        if c is None:
            continue
        p = runs(parent, head)
        if p is None or (p != "any" and c != p):
            return False
    return all(parent.contains(path) for path in PATHS if child.contains(path))


@given(_grants(), _grants())
def test_a_meet_allows_nothing_either_side_refuses(a: Grants, b: Grants) -> None:
    m = a.meet(b)
    assert narrower(m, a) and narrower(m, b)


@given(_grants(), _grants())
def test_a_meet_allows_whatever_both_sides_allow_for_paths(a: Grants, b: Grants) -> None:
    m = a.meet(b)
    for path in PATHS:
        assert m.contains(path) == (a.contains(path) and b.contains(path))


@given(_grants())
def test_meeting_the_unrestricted_grants_changes_nothing(g: Grants) -> None:
    assert g.meet(Grants.ALL) == g and Grants.ALL.meet(g) == g


@given(_policies(), _grants(), st.sampled_from(NAMES))
def test_a_child_is_never_wider_than_its_parent_the_base_or_a_matching_table(
    policy: GrantPolicy, parent: Grants, name: str
) -> None:
    child = policy.for_agent(name, parent)
    assert narrower(child, parent)
    assert narrower(child, policy.base)
    for pattern, table in policy.agents:
        if pattern == name or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            assert narrower(child, table)


@given(_policies(), st.lists(st.sampled_from(NAMES), min_size=1, max_size=5))
def test_grants_only_narrow_down_a_chain_of_forks(policy: GrantPolicy, chain: list[str]) -> None:
    g = policy.for_agent(chain[0])
    for name in chain[1:]:
        child = policy.for_agent(name, g)
        assert narrower(child, g)
        g = child


def test_two_files_under_one_name_are_refused_even_in_hand_built_grants() -> None:
    with pytest.raises(GrantUnresolvable, match="is already granted as cat"):
        Grants._trusted([PROGRAMS[0], PROGRAMS[2]], None)


@given(_policies())
def test_a_policy_survives_its_run_json_round_trip(policy: GrantPolicy) -> None:
    assert GrantPolicy.from_dict(policy.to_dict()) == policy
