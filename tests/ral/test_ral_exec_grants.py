"""Exec grants: a granted program is resolved once, when the grant is made, and a granted name
runs exactly that file; a PATH (or a file) changed inside ral never widens what runs. Real
programs, real scripts on disk, the real command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exarch_actors.runtime.errors import GrantUnresolvable
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.ral.session import Session

MAIN = "from exarch_actors.cli.main import main; main()"
ROOT = Path(__file__).resolve().parents[2]


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """``a/tool`` prints ``from-a``, ``b/tool`` prints ``from-b`` and leaves a marker file."""
    _script(tmp_path / "a" / "tool", "echo from-a")
    _script(tmp_path / "b" / "tool", f"touch {tmp_path}/b-ran; echo from-b")
    return tmp_path


def _session(grants: Grants, cwd: Path) -> Session:
    return Session(context=DynamicContext(cwd=str(cwd), grants=grants), faults=False)


@pytest.fixture
def granted_a(tools: Path) -> Iterator[Session]:
    """A session granted ``tool`` as found on a PATH holding only ``a``."""
    s = _session(Grants.granting(exec=["tool"], search_path=str(tools / "a")), tools)
    try:
        yield s
    finally:
        s.close()


def _ral(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", MAIN, "ral", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_path_set_inside_ral_never_runs_a_script_in_place_of_a_granted_cat(
    tmp_path: Path,
) -> None:
    """The issue's report: `--grant-exec cat`, `setenv PATH (concat (pwd) "/bin"); cat` ran
    R/bin/cat, a script written with write-text (which keeps an existing exec bit)."""
    root = tmp_path / "R"
    fake = _script(root / "bin" / "cat", "true")
    (root / "note.txt").write_text("real cat output\n")
    script = (
        f'write-text bin/cat "#!/bin/sh\\ntouch {root}/pwned; echo pwned\\n"; '
        'setenv PATH (concat (pwd) "/bin"); cat note.txt'
    )
    p = _ral(root, "--grant-root", str(root), "--grant-exec", "cat", "-c", script)
    assert os.access(fake, os.X_OK), "write-text kept the exec bit (the premise of the report)"
    assert p.returncode == 0, p.stderr
    assert p.stdout == "real cat output\n"
    assert not (root / "pwned").exists()


def test_a_granted_name_runs_the_file_resolved_at_grant_time_whatever_path_ral_sets(
    tools: Path, granted_a: Session
) -> None:
    assert granted_a.run("tool").value == "from-a"
    assert granted_a.run(f"setenv PATH {tools}/b; tool").value == "from-a"
    assert granted_a.run("setenv PATH unit; tool").value == "from-a"
    assert not (tools / "b-ran").exists()


def test_a_head_with_a_slash_runs_only_a_granted_file(tools: Path, granted_a: Session) -> None:
    (tools / "alias").symlink_to(tools / "a" / "tool")
    assert granted_a.run(f"{tools}/a/tool").value == "from-a"
    assert granted_a.run("./a/tool").value == "from-a"
    assert granted_a.run(f"{tools}/alias").value == "from-a"  # the granted file, by real path
    for head in (f"{tools}/b/tool", "./b/tool"):
        r = granted_a.run(head)
        assert r.error is not None and r.error.message == f"not granted: exec {head}"
    assert not (tools / "b-ran").exists()


def test_a_program_granted_by_its_path_answers_to_that_path_and_to_its_name(
    tools: Path,
) -> None:
    s = _session(Grants.granting(exec=[str(tools / "b" / "tool")]), tools)
    try:
        assert s.run("tool").value == "from-b"
        assert s.run(f"{tools}/b/tool").value == "from-b"
        r = s.run(f"{tools}/a/tool")
        assert r.error is not None and r.error.message.startswith("not granted: exec")
    finally:
        s.close()


def test_a_granted_program_deleted_later_is_an_error_never_a_lookup_on_path(
    tools: Path, granted_a: Session
) -> None:
    (tools / "a" / "tool").unlink()
    r = granted_a.run(f"setenv PATH {tools}/b; tool")
    assert r.error is not None and r.error.message.startswith("tool:")
    assert not (tools / "b-ran").exists()


def test_without_exec_grants_the_session_path_still_finds_programs(
    tools: Path, session: Session
) -> None:
    assert session.run(f"setenv PATH {tools}/a; tool").value == "from-a"
    assert session.run(f"setenv PATH {tools}/b; tool").value == "from-b"


def test_write_text_keeps_an_exec_bit_but_the_script_runs_only_if_its_file_is_granted(
    tools: Path, granted_a: Session
) -> None:
    script = _script(tools / "mine.sh", "echo mine")
    assert granted_a.run(f"write-text {script} '#!/bin/sh\\necho changed\\n'").error is None
    assert os.stat(script).st_mode & 0o777 == 0o755
    r = granted_a.run(f"{script}")
    assert r.error is not None and r.error.message == f"not granted: exec {script}"


def test_granting_a_program_not_on_path_is_refused_when_the_grant_is_made(
    tmp_path: Path,
) -> None:
    with pytest.raises(GrantUnresolvable, match="cannot grant exec no-such-prog-x9: not found"):
        Grants.granting(exec=["no-such-prog-x9"])
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    with pytest.raises(GrantUnresolvable, match="is not an executable file"):
        Grants.granting(exec=[str(plain)])
    with pytest.raises(GrantUnresolvable, match="cannot grant root /no/such/dir: not a directory"):
        Grants.granting(roots=["/no/such/dir"])


def test_two_different_programs_cannot_both_be_granted_under_one_name(tools: Path) -> None:
    with pytest.raises(GrantUnresolvable, match="is already granted as tool"):
        Grants.granting(exec=[str(tools / "a" / "tool"), str(tools / "b" / "tool")])


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--grant-exec", "no-such-prog-x9", "--grant-exec: cannot grant exec no-such-prog-x9: "),
        ("--grant-exec", "*", "there is no wildcard"),
        ("--grant-exec", "all", "there is no wildcard"),
        ("--grant-root", "/no/such/dir", "--grant-root: cannot grant root /no/such/dir: "),
    ],
)
def test_the_ral_command_refuses_a_grant_it_cannot_make_with_exit_2(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    p = _ral(tmp_path, flag, value, "-c", "touch ran")
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "ran").exists()


def test_exec_grants_survive_a_snapshot_round_trip_without_being_resolved_again(
    tools: Path,
) -> None:
    g = Grants.granting(exec=["tool"], search_path=str(tools / "a"))
    again = DynamicContext.from_dict(DynamicContext(str(tools), {}, g).to_dict()).grants
    assert again == g
    assert again.program("tool", str(tools)) == str(tools / "a" / "tool")


def test_a_snapshot_with_bare_program_names_is_read_as_names_resolved_now() -> None:
    """Snapshots written before grants were resolved recorded names; each is resolved on this
    process's PATH when read, and one not found is dropped (never a wider grant)."""
    g = Grants.from_dict({"exec": ["printf", "no-such-prog-x9"], "roots": None})
    assert g.exec is not None and {e.name for e in g.exec} == {"printf"}
    assert g.program("no-such-prog-x9", "/") is None
