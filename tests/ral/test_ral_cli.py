"""`exarch-actors ral`: -c, FILE, stdin, --json, grants and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from exarch_actors.cli.ral import needs_more, ral_command

MAIN = "from exarch_actors.cli.main import main; main()"


def _json(*args: str) -> tuple[int, dict[str, object]]:
    r = CliRunner().invoke(ral_command, ["--json", *args])
    return r.exit_code, json.loads(r.output)


@pytest.mark.parametrize(
    ("src", "value"),
    [
        ("let x = 41; add $x 1", 42),
        ("[a: 1, b: [true, unit]]", {"a": 1, "b": [True, None]}),
        ("variant ok 3", {"tag": "ok", "payload": 3}),
        ("echo hi", None),
        ("{ 1 }", "<closure { 1 }>"),
    ],
)
def test_json_prints_one_object_with_the_value_as_json(src: str, value: object) -> None:
    code, out = _json("-c", src)
    assert code == 0 and out["value"] == value and out["error"] is None
    assert set(out) == {"value", "stdout", "stderr", "error"}


def test_exit_codes_are_0_ok_1_ral_error_2_refused() -> None:
    assert _json("-c", "1")[0] == 0
    code, out = _json("-c", "div 1 0")
    assert code == 1 and out["error"] == {"message": "division by zero", "line": 1, "col": 1}
    code, out = _json("-c", "echo $nope")
    assert code == 2 and out["error"] == {"message": "undefined variable nope", "line": 1, "col": 6}


def test_plain_output_passes_stdout_then_prints_the_value() -> None:
    r = CliRunner().invoke(ral_command, ["-c", "echo hi; [1, 2]"])
    assert r.exit_code == 0 and r.output == "hi\n[1, 2]\n"
    r = CliRunner().invoke(ral_command, ["-c", "echo only"])
    assert r.output == "only\n"


def test_a_file_argument_runs_the_file(tmp_path: Path) -> None:
    f = tmp_path / "s.ral"
    f.write_text("let a = 2\nmul $a 21\n")
    assert _json(str(f)) == (0, {"value": 42, "stdout": "", "stderr": "", "error": None})


def test_grant_exec_narrows_the_programs_allowed() -> None:
    code, out = _json("--grant-exec", "printf", "-c", "printf ok; ls")
    assert code == 1 and out["error"]["message"] == "not granted: exec ls"  # type: ignore[index]


def test_grant_root_confines_file_builtins(tmp_path: Path) -> None:
    code, out = _json("--grant-root", str(tmp_path), "-c", "view-text /etc/hostname")
    assert code == 1 and str(out["error"]["message"]).startswith("not granted")  # type: ignore[index]


def test_the_repl_keeps_reading_while_brackets_or_quotes_are_open() -> None:
    assert needs_more("let f = {") and needs_more("[1,\n2") and needs_more('echo "abc')
    assert needs_more("echo a \\") and not needs_more("echo a") and not needs_more("echo ]")


@pytest.mark.parametrize(
    ("src", "code", "value"),
    [
        ("let f = { |a, b| add $a $b }; f 2 3", 0, 5),
        ("let s = 'v'; echo $s", 0, None),
        ("try { div 1 0 } catch e { get $e message }", 0, "division by zero"),
        ("echo $nope", 2, None),
    ],
)
def test_the_real_console_command_runs_in_a_subprocess(src: str, code: int, value: object) -> None:
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-c", MAIN, "ral", "--json", "-c", src],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == code, p.stderr
    assert json.loads(p.stdout)["value"] == value


def test_a_script_on_stdin_runs_when_stdin_is_not_a_terminal() -> None:
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-c", MAIN, "ral"],
        cwd=root,
        input="echo piped\nadd 1 2\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0 and p.stdout == "piped\n3\n"
