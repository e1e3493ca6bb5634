"""A session reuses a compiled program only where compiling again would give the same program:
the same text against the same bound names and the same Σ names (runtime/ral/session.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.ral.compile import STATS
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.session import COMPILE_CACHE, Session


def _visits(session: Session, source: str) -> tuple[Any, int]:
    before = STATS.visits
    r = session.run(source)
    return r, STATS.visits - before


class _Desk:
    def __init__(self, verbs: set[str]) -> None:
        self.advertised = verbs

    def verbs(self) -> frozenset[str]:
        return frozenset(self.advertised)

    def call(self, verb: str, args: list[Any]) -> Any:
        return f"{verb} answered"


def test_the_same_source_is_compiled_once_and_runs_each_time(session: Session) -> None:
    session.run("let n = 1")
    first, compiled = _visits(session, "add $n 1")
    again, recompiled = _visits(session, "add $n 1")
    assert compiled > 0 and recompiled == 0
    assert first.value == again.value == 2
    assert again.referenced == first.referenced and "n" in again.referenced


def test_rebinding_an_existing_name_keeps_the_compiled_program(session: Session) -> None:
    session.run("let x = 1")
    _visits(session, "let x = add $x 1")
    r, recompiled = _visits(session, "let x = add $x 1")
    assert recompiled == 0
    assert session.get("x") == 3 and r.defined == ("x",)


def test_a_name_unset_after_a_compile_is_unbound_again(session: Session) -> None:
    session.run("let gone = 1")
    assert session.run("echo $gone").error is None
    session.unset("gone")
    r = session.run("echo $gone")
    assert r.error is not None and r.error.kind == "elaboration"


def test_a_restore_without_a_name_makes_it_unbound_again(session: Session) -> None:
    session.run("let a = 1; let b = 2")
    assert session.run("add $a $b").value == 3
    session.restore({"a": 5}, DynamicContext())
    r = session.run("add $a $b")
    assert r.error is not None and r.error.kind == "elaboration"
    assert session.run("add $a 1").value == 6


def test_a_new_name_recompiles_a_program_that_resolved_it_elsewhere() -> None:
    s = Session()
    try:
        s.run("let f = { |v| $v }")
        assert s.run("f 1").value == 1
        s.run("let v = 7")  # a new session name: programs compiled before it are dropped
        assert s.run("f 1").value == 1
        assert s.run("echo $v").stdout == "7\n"
    finally:
        s.close()


def test_a_desk_verb_withdrawn_after_a_compile_is_unbound_again() -> None:
    desk = _Desk({"peek"})
    s = Session(desk=desk)
    try:
        assert s.run("$peek").error is None
        desk.advertised = set()
        r = s.run("$peek")
        assert r.error is not None and r.error.kind == "elaboration"
        desk.advertised = {"peek"}
        assert s.run("peek").value == "peek answered"
    finally:
        s.close()


def test_the_cache_keeps_at_most_its_bound_of_programs(session: Session) -> None:
    for i in range(COMPILE_CACHE + 10):
        session.run(f"add {i} 1")
    assert len(session._compiled) == COMPILE_CACHE
    _r, recompiled = _visits(session, "add 0 1")  # the oldest fell out
    assert recompiled > 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["let", "unset", "run"]), st.sampled_from(["a", "b", "c"])),
        max_size=12,
    )
)
def test_a_cached_run_answers_as_a_fresh_session_would(steps: list[tuple[str, str]]) -> None:
    """Any interleaving of binds, unsets and runs: the run's outcome (value or error kind) is
    what a session that never cached anything answers."""
    cached, fresh = Session(), Session()
    try:
        for op, name in steps:
            if op == "let":
                cached.run(f"let {name} = 1")
            elif op == "unset":
                try:
                    cached.unset(name)
                except KeyError:
                    pass
            program = "add $a 1"  # the same text every time: the cache's case
            fresh.restore(cached.bindings(), DynamicContext())
            fresh._compiled.clear()
            got, want = cached.run(program), fresh.run(program)
            assert (got.value, got.error and got.error.kind) == (
                want.value,
                want.error and want.error.kind,
            )
    finally:
        cached.close()
        fresh.close()
