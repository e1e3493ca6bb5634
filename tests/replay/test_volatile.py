"""The volatile-part rules (runtime/replay/volatile.py): idempotent, inert on text without such
parts, and blind to exactly the part each rule names."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.replay.volatile import RULES, Normaliser, UnknownRule, rule_names

EVERY = Normaliser(
    frozenset(RULES),
    roots=("/srv/sessions/20240501T100000Z-abc123",),
    copies=("20240501T100000Z-abc123-0123456789",),
)

# Surrounding text that holds no volatile part: no digit, no slash, no "pid".
plain = st.text(st.characters(blacklist_categories=("Cs", "Nd")).filter(lambda c: c not in "/"))
plain = plain.filter(lambda s: "pid" not in s.lower())
sep = st.sampled_from([" ", "\n", ": ", "(", "=", "\t"])


@given(st.text())
def test_normalising_twice_changes_nothing_more(text: str) -> None:
    assert EVERY(EVERY(text)) == EVERY(text)


@given(plain)
def test_text_without_a_volatile_part_is_left_unchanged(text: str) -> None:
    assert EVERY(text) == text


moments = st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2200, 1, 1))


@given(plain, sep, moments, moments, sep, plain, st.sampled_from(["T", " "]))
def test_two_texts_that_differ_in_a_timestamp_only_compare_equal_under_time(
    head: str, a: str, t1: dt.datetime, t2: dt.datetime, b: str, tail: str, joint: str
) -> None:
    n = Normaliser(frozenset({"time"}))
    one = f"{head}{a}{t1.isoformat(sep=joint)}Z{b}{tail}"
    two = f"{head}{a}{t2.date().isoformat()}{b}{tail}"
    three = f"{head}{a}{t2.strftime('%H:%M:%S')}{b}{tail}"
    assert n(one) == n(two) == n(three)
    assert Normaliser()(one) == one, "without the rule a timestamp is compared as it is"


@given(
    plain,
    st.integers(1, 2**22),
    st.integers(1, 2**22),
    st.sampled_from(["pid ", "PID=", '"pid": ', "ppid:"]),
)
def test_two_texts_that_differ_in_a_pid_only_compare_equal_under_pid(
    head: str, p1: int, p2: int, spelled: str
) -> None:
    n = Normaliser(frozenset({"pid"}))
    assert n(f"{head} {spelled}{p1} done") == n(f"{head} {spelled}{p2} done")


@given(st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12))
def test_the_random_directory_under_tmp_is_blanked_and_what_follows_it_kept(name: str) -> None:
    n = Normaliser(frozenset({"tmp"}), tmp=("/tmp",))
    assert n(f"wrote /tmp/{name}/out.txt") == "wrote <tmp>/out.txt"
    assert n(f"wrote /home/tmp/{name}") == f"wrote /home/tmp/{name}", "only a temp root"


def test_a_session_root_reads_as_session_before_any_tmp_rule_sees_it() -> None:
    n = Normaliser(frozenset({"tmp"}), roots=("/tmp/pytest-7/run1/",), tmp=("/tmp",))
    assert n("/tmp/pytest-7/run1/scratch/kid/x") == "<session>/scratch/kid/x"


def test_a_ray_nodes_copy_of_the_session_reads_as_session_wherever_the_node_keeps_it() -> None:
    n = Normaliser(frozenset({"tmp"}), copies=("run1-0123456789",), tmp=("/tmp",))
    assert n("cwd /tmp/exr-x/node1-sessions/run1-0123456789/scratch/trunk") == (
        "cwd <session>/scratch/trunk"
    )
    assert n("/var/lib/exarch-node/run1-0123456789") == "<session>"
    assert n("/a/run1-0123456789x/f") == "/a/run1-0123456789x/f", "only the whole name"


def test_a_number_that_is_no_pid_date_or_time_is_kept_by_every_rule() -> None:
    assert EVERY("sum 499500 of 1000 numbers, version 1.2.3") == (
        "sum 499500 of 1000 numbers, version 1.2.3"
    )


def test_a_user_regex_blanks_its_matches() -> None:
    n = Normaliser(patterns=(r"req-[0-9a-f]+",))
    assert n("ok req-9f8e7d") == "ok <ignored>"


def test_all_names_every_rule_and_an_unknown_name_or_bad_regex_is_refused() -> None:
    assert rule_names(["all"]) == frozenset(RULES)
    with pytest.raises(UnknownRule, match="unknown volatile rule 'date'"):
        rule_names(["date"])
    with pytest.raises(UnknownRule, match="--ignore-regex"):
        Normaliser(patterns=("(",))
