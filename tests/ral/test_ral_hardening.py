"""Hostile input meets typed ral errors: lexer time, deep values, NUL bytes, builtins as values,
model-written regular expressions. Each test failed (or hung, or crashed) before its fix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.cli.ral import json_text
from exarch_actors.runtime.ral.codec import MAX_VALUE_NESTING, TOO_DEEP, decode_value, encode_value
from exarch_actors.runtime.ral.context import DynamicContext, Grants
from exarch_actors.runtime.ral.errors import CodecError, RalSyntaxError
from exarch_actors.runtime.ral.lexer import tokenize
from exarch_actors.runtime.ral.natives import NATIVES
from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.ral.values import UNIT, Builtin, Variant, render, values_equal

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", "ral", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )


def _cli_bytes(stdin: bytes, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI under a strict UTF-8 locale (where Python's stdio refuses undecodable bytes)."""
    return subprocess.run(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", "ral", *args],
        input=stdin,
        capture_output=True,
        timeout=50,
        cwd=ROOT,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict", **env},
    )


def _nest_lists(n: int) -> Any:
    v: Any = []
    for _ in range(n - 1):
        v = [v]
    return v


def _nest_variants(n: int) -> Any:
    v: Any = UNIT
    for _ in range(n):
        v = Variant("a", v)
    return v


# -- the lexer -------------------------------------------------------------------------------


def test_an_unterminated_string_of_100_kb_is_a_syntax_error_at_its_quote() -> None:
    with pytest.raises(RalSyntaxError) as e:
        tokenize('"' + "a" * 100_000)
    assert (e.value.line, e.value.col, e.value.message) == (1, 1, 'unterminated "..." string')


def test_the_cli_refuses_an_unterminated_string_of_40_letters_with_exit_status_2() -> None:
    p = _cli("-c", '"' + "a" * 40)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == 'error: 1:1 unterminated "..." string'


_MOTIFS = ['"', "'", "\\", "\\\n", "#", "$", "${", "a", "1", " ", "\t", "\n", "{", "}", "[", "]"]
_MOTIFS += ["(", ")", "|", ";", ",", ":", '\\"', "ab c", "\0", "é", "$x", "${x}"]


def _lex_seconds(text: str) -> float:
    t = time.perf_counter()
    try:
        tokenize(text)
    except RalSyntaxError:
        pass
    return time.perf_counter() - t


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from(_MOTIFS), min_size=1, max_size=12),
    st.integers(min_value=1, max_value=100_000),
)
def test_lexing_any_text_up_to_100_kb_costs_no_more_than_a_plain_text_of_that_size(
    motifs: list[str], size: int
) -> None:
    """Linear time, checked as a ratio against a plain text of the same length lexed just
    before, so load slows both sides alike. A backtracking rule is exponential (40 characters
    never returned) or quadratic (minutes at 100 KB): either misses a 20x bound by orders of
    magnitude, while a linear lexer stays within 3x."""
    unit = "".join(motifs)
    text = (unit * (size // len(unit) + 1))[:size]
    plain = ("ab " * (size // 3 + 1))[:size]  # the most tokens per byte of any benign text
    baseline = _lex_seconds(plain)
    assert _lex_seconds(text) <= 20 * baseline + 0.5


@pytest.mark.parametrize(
    "word",
    ["1" * 50_000 + "x", "1" * 50_000 + ".", "-" + "1" * 30_000 + "." + "1" * 30_000 + "e"],
)
def test_long_number_like_words_parse_in_one_pass(session: Session, word: str) -> None:
    r = session.run(f"type {word}")
    assert r.error is None and r.value == "string"


def test_a_lone_surrogate_in_the_source_is_a_syntax_error_at_its_position() -> None:
    """Found by the fuzz: ``''\\ud800`` (a JSON tool call may carry one) made a string no UTF-8
    frame or file can hold."""
    with pytest.raises(RalSyntaxError) as e:
        tokenize("echo ok\n  '\ud800'")
    assert (e.value.line, e.value.col) == (2, 4)
    assert e.value.message == "invalid character U+D800 (a lone surrogate)"


def test_a_script_on_stdin_that_is_not_utf8_is_refused_at_the_bad_byte() -> None:
    p = _cli_bytes(b"echo ok\necho \xff\n")
    assert p.returncode == 2
    assert p.stderr == b"error: 2:6 invalid character U+DCFF (a lone surrogate)\n"


# -- deep values -----------------------------------------------------------------------------

DEEP = "fold { |acc, x| [$acc] } [] (range 19999)"  # 20000 levels


def test_a_value_20000_levels_deep_renders_and_compares(session: Session) -> None:
    r = session.run(f"let a = {DEEP}; let b = {DEEP}; [(eq $a $b), (eq $a [$b]), (str $a)]")
    assert r.error is None, r.error
    assert isinstance(r.value, list)
    same, differ, text = r.value
    assert (same, differ) == (True, False)
    assert text == "[" * 20000 + "]" * 20000
    assert render(r.value).startswith('[true, false, "[[[')


def test_eq_of_two_separately_built_values_that_share_structure_takes_linear_time(
    session: Session,
) -> None:
    """Each value has 2**60 leaves but 61 distinct lists; comparing leaf by leaf never ends."""
    double = "fold { |acc, x| [$acc, $acc] } [1] (range 60)"
    r = session.run(f"let a = {double}; let b = {double}; [(eq $a $b), (eq $a [$b, $b])]")
    assert r.error is None and r.value == [True, False]


def test_the_cli_prints_a_20000_levels_deep_value_as_text_and_as_json() -> None:
    plain = _cli("-c", DEEP)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert plain.stdout == "[" * 20000 + "]" * 20000 + "\n"
    js = _cli("--json", "-c", DEEP)
    assert js.returncode == 0, js.stderr[-2000:]
    assert js.stdout == '{"value": ' + "[" * 20000 + "]" * 20000 + ', "stdout": "", ' + (
        '"stderr": "", "error": null}\n'
    )


def test_json_text_of_a_deep_variant_chain_nests_tag_and_payload() -> None:
    assert json_text(_nest_variants(2)) == (
        '{"tag": "a", "payload": {"tag": "a", "payload": null}}'
    )
    assert json_text(_nest_variants(50_000)).count('"payload"') == 50_000


@pytest.mark.parametrize("make", [_nest_lists, _nest_variants], ids=["lists", "variants"])
def test_a_value_at_the_nesting_limit_round_trips_and_one_level_more_is_refused(make: Any) -> None:
    at_limit = make(MAX_VALUE_NESTING)
    assert values_equal(decode_value(encode_value(at_limit)), at_limit)
    with pytest.raises(CodecError, match="value nested too deeply"):
        encode_value(make(MAX_VALUE_NESTING + 1))


def test_msgpack_nesting_limits_are_the_ones_the_fast_encoder_relies_on() -> None:
    """The plain-data encoder packs ``[v]`` and lets msgpack refuse depth 1025; the decoder
    lets msgpack refuse a blob deeper than 1024. A msgpack release that moves either shows
    here first."""
    msgpack.packb(_nest_lists(1025))
    with pytest.raises(ValueError):
        msgpack.packb(_nest_lists(1026))
    msgpack.unpackb(b"\x91" * 1023 + b"\x90")
    with pytest.raises(msgpack.StackError):
        msgpack.unpackb(b"\x91" * 1024 + b"\x90")


def _hostile_variant_chain(n: int) -> bytes:
    """n variants each wrapping the next, packed by hand as an attacker would (no encoder)."""
    payload = msgpack.packb(["a", msgpack.ExtType(1, b"")])
    for _ in range(n - 1):
        payload = msgpack.packb(["a", msgpack.ExtType(2, payload)])
    return msgpack.packb(msgpack.ExtType(2, payload))


def test_decoding_300_nested_variants_gives_them_back() -> None:
    """Before: one C-level unpack per variant, 40 KB of C stack each: SIGSEGV at 300."""
    assert values_equal(decode_value(_hostile_variant_chain(300)), _nest_variants(300))


@pytest.mark.parametrize("depth", [MAX_VALUE_NESTING + 1, 30_000])
def test_decoding_a_hostile_chain_of_nested_variants_is_a_typed_refusal(depth: int) -> None:
    with pytest.raises(CodecError, match="value nested too deeply"):
        decode_value(_hostile_variant_chain(depth))


def test_decoding_hostile_deep_arrays_is_a_typed_refusal() -> None:
    with pytest.raises(CodecError, match="value nested too deeply"):
        decode_value(b"\x91" * 5000 + b"\x90")


def test_a_closure_counts_two_levels_itself_and_what_it_captured(session: Session) -> None:
    r = session.run(f"let d = fold {{ |acc, x| [$acc] }} [] (range {MAX_VALUE_NESTING - 3})")
    assert r.error is None
    session.run("let c = { $d }")
    c = session.get("c")
    assert values_equal(decode_value(encode_value(c)), c)
    session.run("let d2 = [$d]; let c2 = { $d2 }")
    with pytest.raises(CodecError, match=re.escape(TOO_DEEP)):
        encode_value(session.get("c2"))


# -- NUL -------------------------------------------------------------------------------------

NUL_MESSAGE = "contains a NUL character, which the OS cannot pass"


@pytest.mark.parametrize(
    "script",
    [
        'printf "%s" "a\0b"',  # a raw NUL inside a literal
        "printf '%s' (printf 'a\\000b')",  # a program's output
        "printf '%s' [x, (printf 'a\\000b')]",  # inside a list argument
    ],
)
def test_a_nul_in_a_program_argument_is_a_ral_error(session: Session, script: str) -> None:
    r = session.run(script)
    assert r.error is not None and r.error.kind == "runtime"
    assert r.error.message.startswith("printf: argument ") and NUL_MESSAGE in r.error.message


def test_a_nul_read_from_a_file_reaches_an_argument_as_a_ral_error(
    session: Session, tmp_path: Path
) -> None:
    f = tmp_path / "nul.bin"
    f.write_bytes(b"a\0b")
    r = session.run(f"let s = read-text {f}; printf %s $s")
    assert r.error is not None and r.error.message == f"printf: argument 2 {NUL_MESSAGE}"


def test_the_cli_reports_a_nul_argument_as_a_ral_error_not_a_traceback() -> None:
    p = _cli(stdin='printf "%s" "a\0b"')
    assert p.returncode == 1
    assert p.stderr == f"error: 1:1 printf: argument 2 {NUL_MESSAGE}\n"


@pytest.mark.parametrize(
    "script",
    [
        'view-text "x\0y"',
        'read-text "x\0y"',
        'write-text "x\0y" data',
        'edit-replace "x\0y" a b',
        'edit-hash "x\0y"',
        'explore-dir "x\0y"',
        'grep-files a "x\0y"',
        'cd "x\0y"',
        'use "x\0y"',
    ],
)
def test_a_nul_in_a_path_is_a_ral_error_naming_the_builtin(tmp_path: Path, script: str) -> None:
    for roots in (None, (str(tmp_path),)):
        ctx = DynamicContext(cwd=str(tmp_path), grants=Grants(None, roots))
        s = Session(faults=False, context=ctx)
        try:
            r = s.run(script)
        finally:
            s.close()
        head = script.split()[0]
        assert r.error is not None and r.error.kind == "runtime", (script, r.error)
        assert r.error.message == f"{head}: the path {NUL_MESSAGE}"


def test_setenv_refuses_a_nul_in_the_value_and_the_environment_stays_usable(
    session: Session,
) -> None:
    r = session.run('setenv K "a\0b"')
    assert r.error is not None and r.error.message == f"setenv: the value of K {NUL_MESSAGE}"
    assert session.run("sh -c 'echo ok'").value == "ok"
    r = session.run('setenv "K\0" v')
    assert r.error is not None and "bad name" in r.error.message


def test_a_nul_in_the_restored_working_directory_is_a_ral_error_when_a_program_starts() -> None:
    s = Session(faults=False)
    try:
        s.restore({}, DynamicContext(cwd="/tmp/a\0b"))
        r = s.run("ls")
        assert r.error is not None and r.error.message.startswith("ls: cannot start:")
    finally:
        s.close()


def test_a_string_holding_a_lone_surrogate_round_trips_through_the_codec() -> None:
    """An environment variable or file name that is not UTF-8 decodes to lone surrogates."""
    v = ["a\udcffb", {"k\udcfe": "\ud800"}]
    assert values_equal(decode_value(encode_value(v)), v)


def test_the_cli_writes_back_the_bytes_of_an_environment_variable_that_is_not_utf8() -> None:
    plain = _cli_bytes(b"", "-c", "env X", X="a\udcffb")
    assert plain.returncode == 0 and plain.stdout == b"a\xffb\n", plain.stderr
    js = _cli_bytes(b"", "--json", "-c", "env X", X="a\udcffb")
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout)["value"] == "a\udcffb"  # valid JSON: the byte as an escape


# -- builtins as values ----------------------------------------------------------------------


def test_a_builtin_bound_to_a_name_survives_encoding_as_the_same_native(session: Session) -> None:
    session.run("let b = $add; let m = [f: $map, g: (variant v $len)]")
    fresh = Session(faults=False)
    try:
        fresh.restore(
            {n: decode_value(encode_value(session.get(n))) for n in ("b", "m")}, fresh.context
        )
        r = fresh.run("[(b 1 2), ($m[f] { |x| mul $x 2 } [1, 2])]")
        assert r.error is None and r.value == [3, [2, 4]]
    finally:
        fresh.close()


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.sampled_from(sorted(NATIVES)).map(Builtin) | st.integers() | st.text(max_size=4),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(max_size=4), inner, max_size=4)
            | st.builds(Variant, st.text(min_size=1, max_size=4), inner)
        ),
        max_leaves=12,
    )
)
def test_any_value_holding_builtins_round_trips_to_an_equal_value(v: Any) -> None:
    assert values_equal(decode_value(encode_value(v)), v)


def test_a_decoded_builtin_that_this_shell_lacks_is_a_ral_error_when_applied() -> None:
    s = Session(faults=False)
    try:
        s.restore({"v": decode_value(encode_value(Builtin("agent")))}, s.context)
        r = s.run("$v x")
        assert r.error is not None and r.error.message == "builtin agent is not available here"
    finally:
        s.close()


def test_an_empty_builtin_name_does_not_decode() -> None:
    with pytest.raises(CodecError):
        decode_value(msgpack.packb(msgpack.ExtType(6, b"")))


# -- model-written regular expressions ---------------------------------------------------------


def test_grep_files_with_a_backtracking_pattern_over_a_long_line_answers(
    session: Session, tmp_path: Path
) -> None:
    """``(a*)*b`` over 22 letters took 1.6 s in Python's ``re``; over 5000 it never ends."""
    f = tmp_path / "long.txt"
    f.write_text("a" * 5000 + "\n" + "a" * 10 + "b\n")
    r = session.run(f"grep-files '(a*)*b' {f}")
    assert r.error is None and r.value == f"{f}:2:{'a' * 10}b"


def test_grep_files_refuses_a_pattern_re2_cannot_run_with_a_ral_error(
    session: Session, tmp_path: Path
) -> None:
    r = session.run(f"grep-files '(a)\\1' {tmp_path}")
    assert r.error is not None
    assert r.error.message == "grep-files: bad pattern: invalid escape sequence: \\1"
