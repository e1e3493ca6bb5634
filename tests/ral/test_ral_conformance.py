"""One test (or more) per rule of the ral core (docs/language.md), and the examples that must
hold."""

from __future__ import annotations

import os
from typing import Any

import pytest

from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.ral.values import UNIT, Variant, render


def ok(s: Session, src: str) -> Any:
    r = s.run(src)
    assert r.error is None, r.error
    return r.value


# -- examples that must hold -------------------------------------------------------------------

EXAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("let x = 41; add $x 1", {"value": 42}),
    ("let f = { |a, b| add $a $b }; f 2 3", {"value": 5}),
    ('let x = 41; let s = "v=$x"; echo $s', {"stdout": "v=41\n"}),
    ("let m = [a: 1, b: [2, 3]]; get $m b", {"value": [2, 3]}),
    ("let xs = []; for i in (range 3) { echo $i }", {"stdout": "0\n1\n2\n"}),
    ('let big = "x"; let g = { echo $big }; let big = "y"; g', {"stdout": "x\n"}),
    (
        "let rec fact = { |n| if (lt $n 2) { 1 } else { mul $n (fact (sub $n 1)) } }; fact 20",
        {"value": 2432902008176640000},
    ),
]


@pytest.mark.parametrize(("src", "want"), EXAMPLES)
def test_every_ral_md_example_holds(session: Session, src: str, want: dict[str, Any]) -> None:
    r = session.run(src)
    assert r.error is None
    if "value" in want:
        assert r.value == want["value"]
    if "stdout" in want:
        assert r.stdout == want["stdout"]


def test_an_unbound_variable_is_refused_before_running_at_its_line_and_column(
    session: Session,
) -> None:
    r = session.run("echo $nope")
    assert r.error is not None
    assert (r.error.line, r.error.col, r.error.message) == (1, 6, "undefined variable nope")
    assert r.error.kind == "elaboration" and not r.compiled and r.referenced == frozenset()


def test_try_catches_division_by_zero_and_binds_its_message(session: Session) -> None:
    v = ok(session, "try { div 1 0 } catch e { get $e message }")
    assert "division by zero" in v


# -- Lexical ------------------------------------------------------------------------------------


def test_a_comment_runs_to_end_of_line_but_not_inside_quotes(session: Session) -> None:
    r = session.run("echo a # b c\necho \"# kept\" '# kept too'")
    assert r.stdout == "a\n# kept # kept too\n"


def test_newlines_and_semicolons_separate_phrases_and_blank_phrases_are_ignored(
    session: Session,
) -> None:
    assert ok(session, ";;\n\nlet a = 1;;\n;\nadd $a 1;\n\n") == 2


def test_bare_words_read_as_numbers_booleans_unit_or_strings(session: Session) -> None:
    assert ok(session, "-12") == -12
    assert ok(session, "3.5") == 3.5
    assert ok(session, "true") is True and ok(session, "false") is False
    assert ok(session, "unit") is UNIT
    assert ok(session, "type ls") == "string"
    assert session.run("echo ls -la /tmp").stdout == "ls -la /tmp\n"


def test_double_quotes_interpolate_and_understand_the_five_escapes(session: Session) -> None:
    v = ok(session, 'let n = 7; "a${n}b $n \\n\\t\\\\\\"\\$n"')
    assert v == 'a7b 7 \n\t\\"$n'


def test_single_quotes_are_literal(session: Session) -> None:
    assert ok(session, "let n = 1; '$n \\n ${n}'") == "$n \\n ${n}"


def test_variables_index_lists_and_maps_with_no_space_before_the_bracket(
    session: Session,
) -> None:
    ok(session, "let xs = [10, 20, 30]; let m = [a: 1, \"b c\": [5, 6]]; let k = 'a'")
    assert ok(session, "$xs[0]") == 10
    assert ok(session, "$xs[-1]") == 30
    assert ok(session, "$m[a]") == 1
    assert ok(session, "$m[$k]") == 1
    assert ok(session, '$m["b c"][1]') == 6


# -- Values -------------------------------------------------------------------------------------


def test_ints_are_arbitrary_precision(session: Session) -> None:
    assert ok(session, "mul 99999999999999999999 99999999999999999999") == (10**20 - 1) ** 2


def test_maps_keep_insertion_order_and_the_empty_map_is_written_colon(session: Session) -> None:
    v = ok(session, '[z: 1, a: 2, "b c": 3]')
    assert list(v) == ["z", "a", "b c"]
    assert ok(session, "[:]") == {} and ok(session, "[]") == []
    assert render(ok(session, "[:]")) == "[:]"


def test_a_variant_has_a_tag_and_one_payload_and_renders_as_a_call(session: Session) -> None:
    v = ok(session, "variant ok 3")
    assert v == Variant("ok", 3) and render(v) == "ok(3)"


def test_a_worker_handle_is_a_value(session: Session) -> None:
    assert ok(session, "type (spawn { 1 })") == "worker"


# -- Phrases ------------------------------------------------------------------------------------


def test_top_level_let_binds_a_session_name_and_rebinding_replaces_it(session: Session) -> None:
    ok(session, "let a = 1")
    ok(session, "let a = 2")
    assert session.get("a") == 2 and session.session_names() == ["a"]


def test_let_inside_a_block_is_local_to_it(session: Session) -> None:
    ok(session, "if true { let inner = 1 }; let f = { let alsoinner = 2; $alsoinner }; f")
    assert "inner" not in session.session_names()
    assert "alsoinner" not in session.session_names()
    assert session.run("echo $inner").error is not None


def test_let_rhs_may_be_a_whole_command(session: Session) -> None:
    assert ok(session, "let n = add 1 2; $n") == 3


def test_let_rec_makes_the_name_visible_in_its_own_body(session: Session) -> None:
    assert ok(
        session, "let rec ev = { |n| if (eq $n 0) { true } else { not (ev (sub $n 1)) } }; ev 10"
    )


def test_a_command_head_may_be_a_word_a_variable_a_block_or_a_paren(session: Session) -> None:
    ok(session, "let f = { |x| mul $x 2 }")
    assert ok(session, "f 2") == 4
    assert ok(session, "$f 3") == 6
    assert ok(session, "{ |x| add $x 1 } 4") == 5
    assert ok(session, "(get [g: $f] g) 5") == 10


def test_an_atom_alone_evaluates_to_itself_and_a_block_alone_is_not_run(session: Session) -> None:
    r = session.run("{ echo ran }")
    assert r.stdout == "" and render(r.value).startswith("<closure")
    assert ok(session, "[1, 2]") == [1, 2]


def test_if_treats_only_false_and_unit_as_false(session: Session) -> None:
    for c, want in [("false", "n"), ("unit", "n"), ("0", "y"), ('""', "y"), ("[]", "y")]:
        assert ok(session, f"if {c} {{ 'y' }} else {{ 'n' }}") == want


def test_else_if_chains_and_a_missing_else_yields_unit(session: Session) -> None:
    src = "let v = 5; if (lt $v 3) { 'small' } else if (lt $v 10) { 'mid' } else { 'big' }"
    assert ok(session, src) == "mid"
    assert ok(session, "if false { 1 }") is UNIT


def test_for_iterates_a_list_or_a_maps_keys_and_yields_unit(session: Session) -> None:
    r = session.run("for k in [a: 1, b: 2] { echo $k }")
    assert r.stdout == "a\nb\n" and r.value is UNIT


def test_try_binds_message_line_and_col(session: Session) -> None:
    v = ok(session, "try {\n  fail boom\n} catch e { $e }")
    assert v == {"message": "boom", "line": 2, "col": 3}


def test_use_yields_the_files_last_value_and_its_lets_stay_out_of_the_session(
    session: Session, tmp_path: Any
) -> None:
    lib = tmp_path / "lib.ral"
    lib.write_text("let helper = 40\nlet inc = { |x| add $x 1 }\n[inc: $inc, base: $helper]\n")
    ok(session, f"let lib = use {lib}")
    assert ok(session, "$lib[inc] 1") == 2
    assert set(session.session_names()) == {"lib"}


def test_return_leaves_the_innermost_closure(session: Session) -> None:
    src = "let f = { |n| for i in (range 10) { if (eq $i $n) { return $i } }; unit }; f 3"
    assert ok(session, src) == 3


def test_parens_evaluate_a_phrase_in_argument_position(session: Session) -> None:
    assert session.run("echo (add 1 2)").stdout == "3\n"


def test_commands_may_span_lines_inside_brackets_and_parens(session: Session) -> None:
    assert ok(session, "let xs = [\n  1,\n  2,\n]\nlen $xs") == 2
    assert ok(session, "add (mul\n  2\n  3) 1") == 7


# -- Closures -----------------------------------------------------------------------------------


def test_a_bare_head_bound_to_a_non_closure_with_no_args_yields_the_value(
    session: Session,
) -> None:
    ok(session, "let n = 5")
    assert ok(session, "n") == 5
    r = session.run("n 1")
    assert r.error is not None and "not a command" in r.error.message


# -- Resolving a bare head ----------------------------------------------------------------------


def test_a_local_binding_shadows_a_session_binding_which_shadows_a_native(
    session: Session,
) -> None:
    ok(session, "let len = { |x| 'session' }")
    assert ok(session, "len abc") == "session"
    assert ok(session, "let g = { |len| len }; g 7") == 7
    session.unset("len")
    assert ok(session, "len abc") == 3


def test_an_unbound_head_runs_a_program_on_path_with_argv_and_no_shell(session: Session) -> None:
    assert ok(session, "printf '%s|' 'a b' '$HOME;*'") == "a b|$HOME;*|"


def test_a_programs_value_is_stdout_minus_one_trailing_newline(session: Session) -> None:
    assert ok(session, "printf 'x\\n\\n'") == "x\n"


def test_a_programs_stderr_goes_to_the_runs_stderr(session: Session) -> None:
    r = session.run("sh -c 'echo oops >&2'")
    assert r.error is None and r.stderr == "oops\n"


def test_a_non_zero_exit_is_a_catchable_error_naming_program_and_code(session: Session) -> None:
    r = session.run("sh -c 'exit 3'")
    assert r.error is not None and r.error.message == "sh exited with code 3"
    v = ok(session, "try { /bin/sh -c 'exit 1' } catch e { $e[message] }")
    assert v == "/bin/sh exited with code 1"


def test_a_program_outside_the_grants_is_not_granted(session: Session) -> None:
    from exarch_actors.runtime.ral.context import Grants

    session.context.grants = Grants.granting(exec=["printf"])
    assert ok(session, "printf ok") == "ok"
    r = session.run("ls")
    assert r.error is not None and r.error.message == "not granted: exec ls"


def test_an_unknown_program_is_a_ral_error_with_position(session: Session) -> None:
    r = session.run("\n  no-such-program-xyz 1")
    assert r.error is not None and (r.error.line, r.error.col) == (2, 3)
    assert "unknown command no-such-program-xyz" in r.error.message


# -- Elaboration --------------------------------------------------------------------------------


def test_a_syntax_error_refuses_the_whole_run_before_any_phrase_runs(session: Session) -> None:
    r = session.run('echo first\nlet x = "unterminated')
    assert r.error is not None and r.error.kind == "syntax" and r.stdout == ""
    assert not r.compiled and (r.error.line, r.error.col) == (2, 9)


def test_an_undefined_variable_deep_in_a_later_block_refuses_everything(
    session: Session,
) -> None:
    r = session.run("echo first\nlet f = { if true { echo $ghost } }")
    assert r.error is not None and r.stdout == "" and r.error.message == "undefined variable ghost"
    assert (r.error.line, r.error.col) == (2, 26)


def test_an_unbound_bare_head_is_not_an_elaboration_error(session: Session) -> None:
    r = session.run("let f = { not-a-program-xyz }")
    assert r.error is None


def test_referenced_names_are_every_variable_and_head_including_inside_blocks(
    session: Session,
) -> None:
    r = session.run("let a = 1; let f = { |p| echo $a (inner-prog $p) }; maybe-prog")
    assert r.referenced == frozenset({"echo", "a", "inner-prog", "p", "maybe-prog"})


# -- Natives ------------------------------------------------------------------------------------

NATIVE_CASES: list[tuple[str, Any]] = [
    ("add 2 3", 5),
    ("sub 2 3", -1),
    ("mul 4 2.5", 10.0),
    ("div 7 2", 3),
    ("div 7.0 2", 3.5),
    ("mod 7 3", 1),
    ("eq [1, [a: 2]] [1, [a: 2]]", True),
    ("eq 1 1.0", False),
    ("eq true 1", False),
    ("ne a b", True),
    ("lt 1 2", True),
    ("le 2 2", True),
    ("gt b a", True),
    ("ge 1 2", False),
    ("not unit", True),
    ("and true 1", True),
    ("or false unit", False),
    ("len héllo", 5),
    ("len [1, 2]", 2),
    ("get [a: 1] b 9", 9),
    ("keys [a: 1, b: 2]", ["a", "b"]),
    ("values [a: 1, b: 2]", [1, 2]),
    ("append [1] 2 3", [1, 2, 3]),
    ("range 2 8 3", [2, 5]),
    ("str [1, x]", '[1, "x"]'),
    ("int ' 42 '", 42),
    ("int 3.9", 3),
    ("split 'a b  c'", ["a", "b", "c"]),
    ("split a:b :", ["a", "b"]),
    ("join [1, 2, 3] -", "1-2-3"),
    ("lines 'a\nb\n'", ["a", "b"]),
    ("contains hello ell", True),
    ("contains [1, 2] 2", True),
    ("contains [a: 1] a", True),
    ("variant none", Variant("none", UNIT)),
    ("env NO_SUCH_VAR_XYZ", UNIT),
    ("map { |x| mul $x $x } [1, 2, 3]", [1, 4, 9]),
    ("filter { |x| gt $x 1 } [1, 2, 3]", [2, 3]),
    ("fold { |a, x| add $a $x } 0 [1, 2, 3]", 6),
    ("type 1.5", "float"),
    ("concat a 1 b", "a1b"),
    ("concat [1] [2]", [1, 2]),
    ("put [a: 1] b 2", {"a": 1, "b": 2}),
    ("reverse [1, 2]", [2, 1]),
    ("sort [3, 1, 2]", [1, 2, 3]),
    ("trim '  x  '", "x"),
    ("replace aXbX X -", "a-b-"),
    ("float 2", 2.0),
]


@pytest.mark.parametrize(("src", "want"), NATIVE_CASES)
def test_native_gives_its_documented_value(session: Session, src: str, want: Any) -> None:
    v = ok(session, src)
    assert type(v) is type(want) and v == want


def test_echo_writes_space_separated_arguments_and_a_newline(session: Session) -> None:
    r = session.run("echo a 1 [x: 2]")
    assert r.stdout == "a 1 [x: 2]\n" and r.value is UNIT


def test_cd_and_pwd_and_setenv_and_env_persist_between_runs(
    session: Session, tmp_path: Any
) -> None:
    ok(session, f"cd {tmp_path}; setenv RAL_T hello")
    assert ok(session, "pwd") == str(tmp_path)
    assert ok(session, "env RAL_T") == "hello"
    assert ok(session, "sh -c 'echo $RAL_T; pwd'") == f"hello\n{tmp_path}"


def test_sleep_waits_roughly_that_long(session: Session) -> None:
    import time

    t = time.monotonic()
    ok(session, "sleep 0.05")
    assert time.monotonic() - t >= 0.05


def test_spawn_await_yields_the_workers_value_and_reraises_its_error(session: Session) -> None:
    assert ok(session, "let h = spawn { add 1 2 }; await $h") == 3
    r = session.run("let h = spawn { fail inner }; await $h")
    assert r.error is not None and r.error.message == "inner"


def test_cancel_stops_a_worker_and_await_reports_it(session: Session) -> None:
    r = session.run("let h = spawn { sleep 10 }; cancel $h; await $h")
    assert r.error is not None and "cancelled" in r.error.message


def test_settled_is_false_while_a_worker_runs_true_once_it_finished_and_claims_nothing(
    session: Session,
) -> None:
    assert ok(session, "let slow = spawn { sleep 10 }; settled $slow") is False
    ok(session, "let quick = spawn { add 40 2 }")
    ok(session, "let rec until = { |h| if (settled $h) { 'done' } else { sleep 0.01; until $h } }")
    assert ok(session, "until $quick; until $quick") == "done"
    assert ok(session, "await $quick") == 42, "settled claimed nothing"
    ok(session, "cancel $slow; until $slow")
    r = session.run("settled $quick")
    assert r.error is not None and "no worker" in r.error.message, "await claimed it"
    r = session.run("settled 3")
    assert r.error is not None and "expected a worker handle" in r.error.message


def test_a_worker_closure_sees_only_its_captures(session: Session) -> None:
    assert ok(session, "let base = 10; await (spawn { add $base 5 })") == 15


# -- Agent verbs ---------------------------------------------------------------------------------


class _Desk:
    def __init__(self, verbs: frozenset[str]) -> None:
        self._verbs = verbs
        self.calls: list[tuple[str, list[Any]]] = []

    def verbs(self) -> frozenset[str]:
        return self._verbs

    def call(self, verb: str, args: list[Any]) -> Any:
        from exarch_actors.runtime.ral.errors import DeskRefusal

        self.calls.append((verb, args))
        if verb == "agent":
            raise DeskRefusal("spawn fuel exhausted")
        return {"verb": verb}


def test_agent_verbs_resolve_to_the_desk_only_when_it_advertises_them() -> None:
    desk = _Desk(frozenset({"message", "agent", "pin"}))
    s = Session(desk=desk, faults=False)
    try:
        assert s.run("message bob hi").value == {"verb": "message"}
        assert desk.calls == [("message", ["bob", "hi"])]
        r = s.run("agent kid 'do it'")
        assert r.error is not None and r.error.message == "spawn fuel exhausted"
        r = s.run("reply 3")  # not advertised: an unbound name, so a (missing) program
        assert r.error is not None and "unknown command reply" in r.error.message
        assert s.is_sigma("pin") and not s.is_sigma("reply")
    finally:
        s.close()


def test_fault_exists_only_when_faults_are_enabled() -> None:
    from exarch_actors.runtime.ral.errors import InternalPanic

    off = Session(faults=False)
    on = Session(faults=True)
    try:
        assert not off.is_sigma("fault") and on.is_sigma("fault")
        with pytest.raises(InternalPanic):
            on.run("fault panic")
        assert on.run("add 1 1").value == 2 and not on.running
    finally:
        off.close()
        on.close()


def test_the_default_fault_switch_reads_exarch_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXARCH_FAULTS", "1")
    s = Session()
    try:
        assert s.is_sigma("fault")
    finally:
        s.close()
    assert os.environ["EXARCH_FAULTS"] == "1"
