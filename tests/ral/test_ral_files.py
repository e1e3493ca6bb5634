"""File builtins work inside the granted roots and are refused (`not granted`) outside them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from exarch_actors.runtime.ral.context import DynamicContext, Grants
from exarch_actors.runtime.ral.session import Session


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("one\ntwo needle\nthree\n")
    (tmp_path / "src" / "b.txt").write_text("needle again\n")
    (tmp_path / ".hidden").write_text("needle hidden\n")
    (tmp_path / "top.md").write_text("top\n")
    return tmp_path


def test_explore_dir_lists_entries_recursively_with_dirs_marked(
    session: Session, tree: Path
) -> None:
    v = session.run(f"explore-dir {tree}").value
    assert str(v).split("\n") == ["src/", "src/a.py", "src/b.txt", "top.md"]
    assert session.run(f"cd {tree}; len (lines (explore-dir .))").value == 4


def test_view_text_shows_a_whole_file_or_a_line_range(session: Session, tree: Path) -> None:
    assert session.run(f"view-text {tree}/src/a.py").value == "one\ntwo needle\nthree\n"
    assert session.run(f"view-text {tree}/src/a.py 2 3").value == "two needle\nthree"


def test_grep_files_reports_path_line_and_text(session: Session, tree: Path) -> None:
    v = session.run(f"grep-files needle {tree}").value
    assert str(v).split("\n") == ["src/a.py:2:two needle", "src/b.txt:1:needle again"]
    r = session.run(f"grep-files '(' {tree}")
    assert r.error is not None and "bad pattern" in r.error.message


def test_edit_replace_requires_old_to_occur_exactly_once(session: Session, tree: Path) -> None:
    f = tree / "src" / "a.py"
    assert session.run(f"edit-replace {f} two TWO").error is None
    assert f.read_text() == "one\nTWO needle\nthree\n"
    r = session.run(f"edit-replace {f} e E")
    assert r.error is not None and "occurs 6 times" in r.error.message
    r = session.run(f"edit-replace {f} absent x")
    assert r.error is not None and "occurs 0 times" in r.error.message
    assert f.read_text() == "one\nTWO needle\nthree\n"


def test_edit_hash_is_the_sha256_of_the_content(session: Session, tree: Path) -> None:
    f = tree / "top.md"
    assert session.run(f"edit-hash {f}").value == hashlib.sha256(b"top\n").hexdigest()


def test_read_text_and_write_text_round_trip(session: Session, tree: Path) -> None:
    assert session.run(f"write-text {tree}/new.txt 'hé'; read-text {tree}/new.txt").value == "hé"


def test_file_builtins_outside_the_granted_roots_are_not_granted(tree: Path) -> None:
    s = Session(context=DynamicContext(cwd=str(tree), grants=Grants(roots=(str(tree / "src"),))))
    try:
        assert s.run("view-text src/a.py 1 1").value == "one"
        for src in [
            "view-text top.md",
            "explore-dir .",
            "edit-hash /etc/passwd",
            "cd /",
            "edit-replace top.md top x",
            "grep-files x /etc",
            "use ../x.ral",
        ]:
            r = s.run(src)
            assert r.error is not None and r.error.message.startswith("not granted:"), (src, r)
        assert (tree / "top.md").read_text() == "top\n"
    finally:
        s.close()


def test_a_symlink_cannot_escape_the_granted_roots(tree: Path) -> None:
    (tree / "src" / "escape").symlink_to(tree / "top.md")
    s = Session(context=DynamicContext(cwd=str(tree), grants=Grants(roots=(str(tree / "src"),))))
    try:
        r = s.run("view-text src/escape")
        assert r.error is not None and r.error.message.startswith("not granted:")
    finally:
        s.close()


def test_grants_meet_only_narrows() -> None:
    a = Grants.granting(exec=["ls", "cat"], roots=("/tmp",))
    b = Grants(exec=Grants.granting(exec=["cat", "rm"]).exec, roots=("/tmp/x", "/etc"))
    m = a.meet(b)
    assert m.exec is not None and {g.name for g in m.exec} == {"cat"} and m.roots == ("/tmp/x",)
    assert Grants.ALL.meet(a) == a and a.meet(Grants.ALL) == a


def test_dynamic_context_round_trips_through_a_dict(tree: Path) -> None:
    ctx = DynamicContext(str(tree), {"A": "1"}, Grants.granting(["ls"], (str(tree),)))
    assert DynamicContext.from_dict(ctx.to_dict()) == ctx
