"""Closure capture, copy-on-write session scope, the define chokepoint and the linear harvest."""

from __future__ import annotations

from typing import Any

from exarch_actors.runtime.ral.compile import STATS
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.ral.values import Closure


def _closure(session: Session, name: str) -> Closure:
    c = session.get(name)
    assert isinstance(c, Closure)
    return c


def test_a_closure_keeps_exactly_the_outer_bindings_its_body_mentions(session: Session) -> None:
    session.run("let big = 'x'; let other = 2; let helper = { |y| $y }; let p = 1")
    session.run("let f = { |p| helper (add $p $other) }")
    f = session.get("f")
    assert isinstance(f, Closure)
    assert set(f.captured) == {"helper", "other"}  # not big, not the shadowed parameter p


def test_a_closure_captures_nothing_for_natives_or_unbound_program_heads(
    session: Session,
) -> None:
    session.run("let f = { echo (ls-not-a-prog) }")
    assert _closure(session, "f").captured == {}


def test_nested_closures_capture_through_their_enclosing_closure(session: Session) -> None:
    session.run("let a = 1; let mk = { { $a } }; let inner = (mk)")
    assert set(_closure(session, "mk").captured) == {"a"}
    assert _closure(session, "inner").captured == {"a": 1}


def test_rebinding_a_session_name_never_changes_an_existing_closure(session: Session) -> None:
    session.run("let v = 1; let f = { $v }")
    session.run("let v = 2")
    assert session.run("f").value == 1


def test_unsetting_a_session_name_leaves_a_closure_that_captured_it_working(
    session: Session,
) -> None:
    session.run("let big = 'payload'; let f = { $big }")
    session.unset("big")
    assert session.run("f").value == "payload"
    r = session.run("echo $big")
    assert r.error is not None and r.error.message == "undefined variable big"


def test_restore_replaces_the_scope_and_context_without_touching_closures(
    session: Session, tmp_path: Any
) -> None:
    session.run("let v = 1; let f = { $v }")
    saved = session.bindings()
    session.run("let v = 9; let w = 3")
    session.restore(saved, DynamicContext(cwd=str(tmp_path)))
    assert session.session_names() == ["v", "f"]
    assert session.run("pwd").value == str(tmp_path)
    assert session.run("add (f) $v").value == 2


def test_bindings_is_a_copy(session: Session) -> None:
    session.run("let a = 1")
    b = session.bindings()
    b["a"] = 99
    assert session.get("a") == 1


def test_define_hook_fires_only_for_top_level_lets_in_order() -> None:
    seen: list[tuple[str, Any]] = []
    s = Session(define_hook=lambda n, v: seen.append((n, v)), faults=False)
    try:
        r = s.run(
            "let a = 1; let rec f = { |n| let inner = 2; $n }; f 3\n"
            "if true { let blocklocal = 4 }; let a = 5"
        )
        assert r.error is None
        assert [n for n, _ in seen] == ["a", "f", "a"]
        assert r.defined == ("a", "f", "a")
    finally:
        s.close()


def test_use_bodies_never_reach_the_define_hook(tmp_path: Any) -> None:
    seen: list[str] = []
    (tmp_path / "m.ral").write_text("let hidden = 1\n$hidden\n")
    s = Session(define_hook=lambda n, v: seen.append(n), faults=False)
    try:
        assert s.run(f"let got = use {tmp_path}/m.ral").value is not None
        assert seen == ["got"] and s.session_names() == ["got"]
    finally:
        s.close()


def test_use_adds_its_compile_harvest_to_the_runs_referenced_names(tmp_path: Any) -> None:
    (tmp_path / "m.ral").write_text("let q = 1\nfrom-the-file $q\n")
    harvested: list[frozenset[str]] = []
    s = Session(harvest_hook=harvested.append, faults=False)
    try:
        r = s.run(f"try {{ use {tmp_path}/m.ral }} catch e {{ 0 }}")
        assert {"from-the-file", "q", "use"} - {"use"} <= r.referenced
        assert harvested[0] == frozenset()  # the run's own text names no variables or heads
        assert {"from-the-file", "q"} <= harvested[1]
    finally:
        s.close()


def test_a_refused_run_references_nothing_and_calls_no_hook() -> None:
    harvested: list[frozenset[str]] = []
    s = Session(harvest_hook=harvested.append, faults=False)
    try:
        r = s.run("echo $missing")
        assert r.referenced == frozenset() and harvested == [] and not r.compiled
    finally:
        s.close()


def _program(n: int) -> str:
    lines = ["let acc = 0"]
    for i in range(n - 1):
        lines.append(
            f"let acc = add $acc {i}" if i % 2 else f"let f{i % 7} = {{ |x| echo $x $acc }}"
        )
    return "\n".join(lines)


def test_elaboration_visits_grow_linearly_with_program_size(session: Session) -> None:
    counts = []
    for n in (100, 1000, 10000):
        before = STATS.visits
        assert session.run(_program(n)).error is None
        counts.append((STATS.visits - before) / n)
    assert max(counts) / min(counts) < 1.1, counts


def test_calling_a_stored_closure_never_walks_its_body_again(session: Session) -> None:
    body = "; ".join(f"let v{i} = add {i} 1" for i in range(500))
    session.run(f"let big = {{ {body}; $v499 }}")
    before = STATS.visits
    r = session.run("big")
    assert r.value == 500
    assert STATS.visits - before <= 3  # the head word, the phrase and the harvest
    assert r.referenced == frozenset({"big"})
