"""The quick tier (``pytest -m "not slow"``, the README's everyday command) still reaches every
package of the suite: a package whose every test is marked ``slow`` would drop out of it
silently. Read from the test files' syntax (``ast``), not by collecting them: a collection of
the whole suite takes seconds, this takes milliseconds."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _marks_slow(node: ast.expr) -> bool:
    """Whether a decorator or a ``pytestmark`` value names ``pytest.mark.slow`` anywhere in it
    (alone, in a list, or called)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "slow" for n in ast.walk(node))


def _module_is_slow(tree: ast.Module) -> bool:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
        ):
            return _marks_slow(stmt.value)
    return False


def _tests(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module's test functions, and the test methods of its ``Test*`` classes (their
    class's decorators carried over as theirs)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            if stmt.name.startswith("test"):
                found.append(stmt)
        elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    item.name.startswith("test")
                ):
                    item.decorator_list = [*stmt.decorator_list, *item.decorator_list]
                    found.append(item)
    return found


def quick_tests(path: Path) -> list[str]:
    """The names of ``path``'s tests that ``-m "not slow"`` selects."""
    tree = ast.parse(path.read_text(), str(path))
    if _module_is_slow(tree):
        return []
    return [t.name for t in _tests(tree) if not any(map(_marks_slow, t.decorator_list))]


def test_the_reader_tells_slow_tests_from_quick_ones(tmp_path: Path) -> None:
    marked = tmp_path / "test_marked.py"
    marked.write_text(
        "import pytest\n"
        "@pytest.mark.slow\n"
        "def test_a(): pass\n"
        "@pytest.mark.timeout(9)\n"
        "def test_b(): pass\n"
        "@pytest.mark.slow\n"
        "class TestC:\n"
        "    def test_c(self): pass\n"
        "class TestD:\n"
        "    def test_d(self): pass\n"
    )
    assert quick_tests(marked) == ["test_b", "test_d"]
    whole = tmp_path / "test_whole.py"
    whole.write_text(
        "import pytest\npytestmark = [pytest.mark.ray, pytest.mark.slow]\ndef test_e(): pass\n"
    )
    assert quick_tests(whole) == []


def test_the_quick_tier_runs_tests_of_every_package_of_the_suite() -> None:
    packages = sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    assert len(packages) > 20  # the suite's packages were found
    left_out = [
        p.name for p in packages if not any(quick_tests(f) for f in sorted(p.glob("test_*.py")))
    ]
    assert left_out == [], f"every test of these packages is marked slow: {left_out}"
