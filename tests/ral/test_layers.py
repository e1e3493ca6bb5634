"""ral's modules form layers: each imports only modules of lower layers, so the package has no
import cycle. Every import counts -- module level, function-local, under ``if TYPE_CHECKING:``,
relative -- since each is a dependency a reader has to follow (docs/architecture.md, ral)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "exarch_actors.runtime.ral"
ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "runtime" / "ral"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"__init__", "errors", "grants", "nodes"}),
    frozenset({"lexer", "pattern", "values", "confine"}),
    frozenset({"parser", "context"}),
    frozenset({"interp"}),
    frozenset({"calls", "files"}),
    frozenset({"compile"}),
    frozenset({"codec", "natives"}),
    frozenset({"workers"}),
    frozenset({"session"}),
)
"""Bottom first; the same order, with what each layer holds, is in runtime/ral/__init__.py."""

LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute name a ``from`` import names, ``from .x import y`` resolved from ``module``."""
    if not node.level:
        return node.module or ""
    package = module.split(".")[:-1]  # a module's package; ``__init__``'s is its own
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: str, tree: ast.AST) -> set[str]:
    """The absolute names of every module an import anywhere in ``tree`` may load."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}  # a submodule, maybe
    return found


def _ral_modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PACKAGE_DIR.glob("*.py"))}


def _ral_deps(name: str, source: str, modules: set[str]) -> set[str]:
    """The modules of runtime/ral (by file stem) that module ``name``'s source imports."""
    deps: set[str] = set()
    for target in _imported(f"{PACKAGE}.{name}", ast.parse(source)):
        if target == PACKAGE:
            deps.add("__init__")
        elif target.startswith(PACKAGE + "."):
            head = target[len(PACKAGE) + 1 :].split(".")[0]
            if head in modules:
                deps.add(head)
    deps.discard(name)
    return deps


def import_graph() -> dict[str, set[str]]:
    """For each module of runtime/ral (by file stem), the package's modules it imports."""
    modules = _ral_modules()
    return {
        name: _ral_deps(name, path.read_text("utf-8"), set(modules))
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*path[path.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_every_module_of_runtime_ral_has_a_layer() -> None:
    unplaced = sorted(set(_ral_modules()) - set(LAYER_OF))
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"
    assert set(LAYER_OF) <= set(_ral_modules()), "LAYERS names a module that does not exist"


def test_the_import_graph_of_runtime_ral_has_no_cycle() -> None:
    cycle = _cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_each_ral_module_imports_only_modules_of_lower_layers() -> None:
    upward = [
        f"{name} (layer {LAYER_OF[name]}) imports {dep} (layer {LAYER_OF[dep]})"
        for name, deps in import_graph().items()
        for dep in sorted(deps)
        if LAYER_OF[dep] >= LAYER_OF[name]
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import exarch_actors.runtime.ral.codec\n", {"codec"}),
        ("from exarch_actors.runtime.ral import confine\n", {"__init__", "confine"}),
        ("from . import values\n", {"__init__", "values"}),
        ("from .compile import Scope\n", {"compile"}),
        (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from exarch_actors.runtime.ral.natives import NATIVES\n",
            {"natives"},
        ),
        (
            "def f() -> None:\n    from exarch_actors.runtime.ral.workers import ThreadWorkers\n",
            {"workers"},
        ),
        ("import os\nfrom exarch_actors.runtime.cancel import Cancelled\n", set()),
    ],
)
def test_the_graph_counts_every_kind_of_import(source: str, expected: set[str]) -> None:
    assert _ral_deps("errors", source, set(_ral_modules())) == expected


def test_a_cycle_is_found_when_one_exists() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
