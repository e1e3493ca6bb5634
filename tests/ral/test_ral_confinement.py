"""Root grants confine every file builtin: links are resolved and whatever leads outside the
roots is refused (`not granted: ...`), and a link swapped between check and use never redirects
a read. Real files, real symlinks, a real process flipping a link."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from exarch_actors.runtime.ral.context import DynamicContext, Grants
from exarch_actors.runtime.ral.session import RunResult, Session
from tests.support.waiting import wait_for

SECRET = "outside-secret-7f3a"
INSIDE = "inside-text-c41d"


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """``R`` is the granted root, ``outside`` is not. ``outside/secret.txt`` holds SECRET."""
    root = tmp_path / "R"
    outside = tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    (outside / "deep" / "more.txt").write_text(f"{SECRET} deep\n")
    (root / "inside.txt").write_text(f"{INSIDE}\n")
    (root / "sub" / "note.txt").write_text("note\n")
    return tmp_path


@pytest.fixture
def jailed(world: Path) -> Iterator[Session]:
    root = world / "R"
    s = Session(
        context=DynamicContext(cwd=str(root), grants=Grants(roots=(str(root),))), faults=False
    )
    try:
        yield s
    finally:
        s.close()


def _refused(r: RunResult) -> bool:
    return r.error is not None and r.error.message.startswith("not granted:")


def _leaks(r: RunResult) -> bool:
    return SECRET in repr(r.value) or SECRET in r.stdout or SECRET in r.stderr


def test_grep_files_does_not_print_etc_passwd_through_a_link_that_read_text_refuses(
    world: Path, jailed: Session
) -> None:
    """The issue's report, verbatim: `R/link-passwd -> /etc/passwd`."""
    (world / "R" / "link-passwd").symlink_to("/etc/passwd")
    assert _refused(jailed.run("read-text link-passwd"))
    r = jailed.run('grep-files "root" .')
    assert r.error is None, r.error
    assert "link-passwd" not in str(r.value) and "/bin/" not in str(r.value)
    assert _refused(jailed.run('grep-files "root" link-passwd'))


def test_every_file_builtin_refuses_a_symlinked_file_that_leads_outside(
    world: Path, jailed: Session
) -> None:
    (world / "R" / "leak").symlink_to(world / "outside" / "secret.txt")
    for src in [
        "read-text leak",
        "view-text leak",
        "view-text leak 1 1",
        "edit-hash leak",
        f"edit-replace leak {SECRET} gone",
        "write-text leak overwritten",
        "use leak",
        "grep-files . leak",
        "explore-dir leak",
        "cd leak",
    ]:
        r = jailed.run(src)
        assert _refused(r) and not _leaks(r), (src, r)
        assert "a link leads outside the granted roots" in str(r.error), (src, r)
    assert (world / "outside" / "secret.txt").read_text() == f"{SECRET}\n"
    assert (world / "R" / "leak").is_symlink()


def test_a_symlinked_directory_leading_outside_is_neither_entered_nor_walked(
    world: Path, jailed: Session
) -> None:
    (world / "R" / "ldir").symlink_to(world / "outside", target_is_directory=True)
    for src in [
        "explore-dir ldir",
        "grep-files x ldir",
        "read-text ldir/secret.txt",
        "read-text ldir/deep/more.txt",
        "write-text ldir/new.txt x",
        "cd ldir",
    ]:
        r = jailed.run(src)
        assert _refused(r) and not _leaks(r), (src, r)
    assert not (world / "outside" / "new.txt").exists()
    listing = str(jailed.run("explore-dir .").value).split("\n")
    assert "ldir@" in listing and not any("secret" in e for e in listing)
    r = jailed.run(f"grep-files {SECRET} .")
    assert r.error is None and r.value == ""


def test_links_inside_the_roots_are_followed_and_written_through(
    world: Path, jailed: Session
) -> None:
    root = world / "R"
    (root / "alias").symlink_to("inside.txt")
    (root / "sub" / "up").symlink_to("../inside.txt")
    (root / "lsub").symlink_to("sub", target_is_directory=True)
    assert jailed.run("read-text alias").value == f"{INSIDE}\n"
    assert jailed.run("read-text sub/up").value == f"{INSIDE}\n"
    assert jailed.run("read-text lsub/note.txt").value == "note\n"
    assert str(jailed.run("explore-dir lsub").value).split("\n") == ["note.txt", "up@"]
    assert jailed.run("write-text alias rewritten; read-text inside.txt").value == "rewritten"
    assert (root / "alias").is_symlink()
    assert jailed.run("cd lsub; pwd").value == str(root / "lsub")


def test_a_dotdot_through_a_link_never_reaches_outside(world: Path, jailed: Session) -> None:
    root = world / "R"
    (root / "ldeep").symlink_to(world / "outside" / "deep", target_is_directory=True)
    (root / "escape").symlink_to("sub/../../outside/secret.txt")
    (root / "sub" / "climb").symlink_to("../../outside", target_is_directory=True)
    # a path's own ".." is lexical (as for cd): ldeep/../secret.txt is R/secret.txt
    r = jailed.run("read-text ldeep/../secret.txt")
    assert r.error is not None and "No such file" in r.error.message and not _leaks(r)
    for src in ["read-text escape", "read-text sub/climb/secret.txt", "explore-dir sub/climb"]:
        r = jailed.run(src)
        assert _refused(r) and not _leaks(r), (src, r)


def test_link_loops_end_in_an_error_and_walks_over_them_terminate(
    world: Path, jailed: Session
) -> None:
    root = world / "R"
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    (root / "sub" / "self").symlink_to(".", target_is_directory=True)
    (root / "sub" / "parent").symlink_to("..", target_is_directory=True)
    r = jailed.run("read-text a")
    assert r.error is not None and "Too many levels of symbolic links" in r.error.message
    r = jailed.run("read-text sub/self/self/self/note.txt")
    assert r.value == "note\n"
    listing = str(jailed.run("explore-dir .").value).split("\n")
    assert listing == ["a@", "b@", "inside.txt", "sub/", "sub/note.txt", "sub/parent@", "sub/self@"]
    r = jailed.run("grep-files note .")
    assert r.value == "sub/note.txt:1:note"


def test_a_link_from_outside_into_the_roots_is_allowed_by_where_it_leads(
    world: Path, jailed: Session
) -> None:
    (world / "outside" / "in").symlink_to(world / "R" / "inside.txt")
    assert jailed.run(f"read-text {world}/outside/in").value == f"{INSIDE}\n"
    assert _refused(jailed.run(f"read-text {world}/outside/secret.txt"))


_FLIPPER = textwrap.dedent(
    """
    import os, sys
    link, inside, outside, stop = sys.argv[1:5]
    tmp = link + ".tmp"
    n = 0
    while not os.path.exists(stop):
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.symlink((inside, outside)[n % 2], tmp)
        os.replace(tmp, link)  # atomic: the link always exists, pointing one way or the other
        n += 1
    """
)

BATCH = 1000
"""Reads per ral run; runs repeat (at most MAX_BATCHES) until both sides of the race were seen."""
MAX_BATCHES = 30


def _race(world: Path, link: str, inside: str, outside: str, body: str) -> list[str]:
    """Evaluate the ral expression ``body`` over and over while a separate process flips
    ``R/link`` between ``inside`` and ``outside`` as fast as it can, until some evaluations saw
    the inside and some were refused; return every result (a value or an error message)."""
    root = world / "R"
    stop = world / "stop-flipping"
    flipper = subprocess.Popen(
        [sys.executable, "-c", _FLIPPER, str(root / link), inside, outside, str(stop)]
    )
    s = Session(
        context=DynamicContext(cwd=str(root), grants=Grants(roots=(str(root),))), faults=False
    )
    seen: list[str] = []
    try:
        wait_for(lambda: os.path.lexists(root / link), 30, "the flipper's first link")
        script = f"map {{ |i| try {{ {body} }} catch e {{ $e[message] }} }} (range 0 {BATCH})"
        for _ in range(MAX_BATCHES):
            r = s.run(script)
            assert r.error is None, r.error
            assert isinstance(r.value, list)
            seen += [str(v) for v in r.value]
            if any(INSIDE in v for v in seen) and any("not granted" in v for v in seen):
                break
        return seen
    finally:
        s.close()
        stop.touch()
        flipper.wait(timeout=30)


def test_a_file_link_flipped_between_inside_and_outside_never_yields_outside_content(
    world: Path,
) -> None:
    out = world / "outside" / "secret.txt"
    seen = _race(world, "flip", str(world / "R" / "inside.txt"), str(out), "read-text flip")
    assert not any(SECRET in v for v in seen)
    assert any(INSIDE in v for v in seen), "the race never let the inside file through"
    assert any(v.startswith("not granted:") for v in seen), "the race never hit the outside"


def test_a_directory_link_flipped_between_inside_and_outside_never_yields_outside_content(
    world: Path,
) -> None:
    (world / "R" / "real").mkdir()
    (world / "R" / "real" / "secret.txt").write_text(f"{INSIDE}\n")
    seen = _race(
        world,
        "dir",
        str(world / "R" / "real"),
        str(world / "outside"),
        "concat (read-text dir/secret.txt) (grep-files . dir)",
    )
    assert not any(SECRET in v for v in seen)
    assert any(INSIDE in v for v in seen), "the race never let the inside file through"
    assert any(v.startswith("not granted:") for v in seen), "the race never hit the outside"


def test_a_root_that_later_becomes_a_link_does_not_move_the_grant(world: Path) -> None:
    """Roots are real paths when granted and never re-resolved (snapshots, forks)."""
    root = world / "R2"
    root.mkdir()
    g = Grants(roots=(str(root),))
    root.rmdir()
    root.symlink_to(world / "outside", target_is_directory=True)
    again = DynamicContext.from_dict(DynamicContext(str(world), {}, g).to_dict()).grants
    assert again.roots == (str(root),)
    s = Session(context=DynamicContext(cwd=str(world), grants=again), faults=False)
    try:
        assert _refused(s.run("read-text R2/secret.txt"))
    finally:
        s.close()


def test_with_no_root_grants_links_still_resolve_and_walks_still_never_loop(
    world: Path, session: Session
) -> None:
    root = world / "R"
    (root / "sub" / "self").symlink_to(".", target_is_directory=True)
    (root / "alias").symlink_to("inside.txt")
    assert session.run(f"read-text {root}/alias").value == f"{INSIDE}\n"
    assert session.run(f"grep-files {INSIDE} {root}").value == f"inside.txt:1:{INSIDE}"
    assert os.path.islink(root / "alias")
