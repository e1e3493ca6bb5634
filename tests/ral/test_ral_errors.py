"""Bad input gets a clear ral error with line:col, and the session stays usable afterwards."""

from __future__ import annotations

import pytest

from exarch_actors.runtime.ral.errors import MidRunRefused
from exarch_actors.runtime.ral.session import Session
from tests.support.waiting import HANG_GUARD, wait_for

BAD: list[tuple[str, str, str, tuple[int, int]]] = [
    # (source, kind, message fragment, (line, col))
    ("echo (add 1", "syntax", "unclosed (", (1, 6)),
    ("echo ]", "syntax", "unexpected ]", (1, 6)),
    ('echo "abc', "syntax", "unterminated", (1, 6)),
    ("echo 'abc", "syntax", "unterminated", (1, 6)),
    ("let = 3", "syntax", "name after let", (1, 5)),
    ("let x=3", "syntax", "spaces around =", (1, 5)),
    ("let rec f = 3", "syntax", "let rec needs a block", (1, 13)),
    ("[a: 1, 2]", "syntax", "mixes list items and map entries", (1, 8)),
    ("{ |a, a| 1 }", "syntax", "duplicate parameter", (1, 7)),
    ("if true", "syntax", "expected {", (1, 8)),
    ("try { 1 }", "syntax", "expected catch", (1, 10)),
    ("echo $", "syntax", "expected a variable name", (1, 6)),
    ("echo " + "9" * 5000, "syntax", "too large", (1, 6)),
    ("[" * 500 + "]" * 500, "syntax", "nesting deeper", (1, 201)),
    ("echo $nope", "elaboration", "undefined variable nope", (1, 6)),
    ("42 1", "elaboration", "42 is not a command", (1, 1)),
    ("add 1", "runtime", "add: expected 2 arguments, got 1", (1, 1)),
    ("let f = { |a| $a }; f 1 2", "runtime", "f: expected 1 argument, got 2", (1, 21)),
    ("add 1 x", "runtime", "add: expected a number", (1, 1)),
    ("add true 1", "runtime", "expected a number, got bool", (1, 1)),
    ("lt 1 a", "runtime", "cannot compare int with string", (1, 1)),
    ("div 1 0", "runtime", "division by zero", (1, 1)),
    ("mod 1 0", "runtime", "division by zero", (1, 1)),
    ("echo\n  (div 1 0)", "runtime", "division by zero", (2, 4)),
    ("no-such-program-abc", "runtime", "unknown command no-such-program-abc", (1, 1)),
    ("let xs = [1]; $xs[5]", "runtime", "index 5 out of range", (1, 18)),
    ("let m = [a: 1]; $m[b]", "runtime", "no key 'b'", (1, 19)),
    ("for x in 5 { 1 }", "runtime", "cannot iterate a int", (1, 1)),
    ("int abc", "runtime", "not an integer", (1, 1)),
    ("range 100000000", "runtime", "over the limit", (1, 1)),
    ("let rec f = { |n| f $n }; f 1", "runtime", "recursion limit", (1, 19)),
    ("let rec f = { |n| add 1 (f $n) }; f 1", "runtime", "recursion limit", (1, 26)),
    ("fold { |a, i| mul $a $a } 2 (range 30)", "runtime", "too large", (1, 15)),
    ("await 3", "runtime", "expected a worker handle", (1, 1)),
    ("spawn { |x| 1 }", "runtime", "no parameters", (1, 1)),
    ("use /no/such/file.ral", "runtime", "cannot read", (1, 1)),
    ("fail 'custom message'", "runtime", "custom message", (1, 1)),
    ("(add 1 2) 3", "runtime", "a int, not a command", (1, 1)),
    ("get 5 a", "runtime", "cannot index a int", (1, 1)),
]


@pytest.mark.parametrize(("src", "kind", "fragment", "pos"), BAD)
def test_bad_input_is_a_clear_error_and_the_session_stays_usable(
    session: Session, src: str, kind: str, fragment: str, pos: tuple[int, int]
) -> None:
    session.run("let keep = 41")
    r = session.run(src)
    assert r.error is not None, r
    assert r.error.kind == kind, r.error
    assert fragment in r.error.message, r.error
    assert (r.error.line, r.error.col) == pos, r.error
    assert not session.running
    after = session.run("add $keep 1")
    assert after.error is None and after.value == 42


def test_a_runtime_error_keeps_the_bindings_made_before_it(session: Session) -> None:
    r = session.run("let a = 1; div 1 0; let b = 2")
    assert r.error is not None and r.defined == ("a",)
    assert session.session_names() == ["a"]


def test_recursion_limit_is_catchable_and_the_session_recovers(session: Session) -> None:
    r = session.run("let rec f = { |n| f $n }; try { f 1 } catch e { $e[message] }")
    assert r.error is None and "recursion limit" in str(r.value)
    assert (
        session.run("let rec g = { |n| if (lt $n 1) { 0 } else { g (sub $n 1) } }; g 500").value
        == 0
    )


def test_unset_and_restore_are_refused_while_a_run_is_in_flight() -> None:
    import threading

    s = Session(faults=False)
    try:
        t = threading.Thread(target=lambda: s.run("sleep 5"), daemon=True)
        t.start()
        wait_for(lambda: s.running, what="the run in flight")
        with pytest.raises(MidRunRefused):
            s.unset("x")
        with pytest.raises(MidRunRefused):
            s.restore({}, s.context)
        with pytest.raises(MidRunRefused):
            s.run("1")
        s.cancel()
        t.join(HANG_GUARD)
    finally:
        s.close()


def test_a_huge_string_literal_is_fine(session: Session) -> None:
    big = "y" * 1_000_000
    assert session.run(f"len '{big}'").value == 1_000_000


def test_a_big_int_renders_without_crashing(session: Session) -> None:
    r = session.run("let x = 10; for i in (range 15) { let x = mul $x $x }; str $x")
    assert r.error is None and isinstance(r.value, str)
