"""The repository's layout rules that no other test owns: it speaks of itself alone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCANNED = (
    "runtime",
    "actors",
    "cli",
    "exarch_actors",
    "docs",
    "benchmarks",
    "examples",
    "tests",
    "README.md",
)
"""Where a reader meets this repository's prose: code, docs, tests, examples."""

SUFFIXES = frozenset({".py", ".md", ".toml", ".txt", ".json", ".sh", ".cfg", ".ini", ".yaml"})

OUTSIDE_CITATIONS = re.compile(
    "|".join(
        (
            r"\bseeds? ?0\d\d\b",  # the design notes numbered 000, 001, 003
            r"\bseed (?:X\d|[:,])",  # their rule labels ("seed X2/X7") and bare "(seed: ...)"
            r"\bthe seeds?\b|\bseeds?'",  # "the seed's table", "the seeds' bounds"
            r"\b(?:SCENARIO|RAL|DESIGN)\.md\b",  # upper case: the outside documents, not docs/*.md
            r"\.\./shared|/work/shared|steering repo",
            r"\b[A-Z]\w*::\w+|\b\w+\.rs\b",  # names from the design notes' Rust sketches
        )
    )
)
"""A citation of a document a reader of this repository cannot open. A drill's or Hypothesis's
random seed ("seed 90413", ``--seed``) is not one; neither is ``docs/language.md``."""


def _scanned_files() -> list[Path]:
    me = Path(__file__).resolve()
    out: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        out += [
            p
            for p in paths
            if p.is_file()
            and p.suffix in SUFFIXES
            and "__pycache__" not in p.parts
            and p.resolve() != me  # the pattern list above names what it forbids
        ]
    return out


def test_the_scan_covers_code_docs_tests_and_examples() -> None:
    scanned = {p.relative_to(ROOT).parts[0] for p in _scanned_files()}
    assert scanned == set(SCANNED)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _scanned_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE_CITATIONS.search(line)
    ]
    assert not hits, (
        "cite docs/language.md, docs/scenarios.md, docs/architecture.md or docs/drills.md, or "
        "state the rule in place:\n" + "\n".join(hits)
    )


# --------------------------------------------------------------------------- the import graph

LAYERS = ("runtime", "actors", "cli", "exarch_actors")
"""The project's packages, lowest first: a package may import only from itself and those
before it (runtime never imports actors or cli; actors never imports cli; only exarch_actors, the
Python API, imports all three)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for top in LAYERS
        for p in sorted((ROOT / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _imported_names(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, wherever the import sits (type-checking blocks and
    function bodies included), relative imports resolved. ``from a import b`` counts as an
    import of ``a.b`` when that is a module, else of ``a``; ``import a.b.c`` of ``a.b.c``."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.add(source)
            out.update(f"{source}.{alias.name}" for alias in node.names)
    return {_short(name) for name in out}


def _short(name: str) -> str:
    """``exarch_actors.runtime.x`` as the graph names it: ``runtime.x`` (the folder it is in)."""
    head, _, rest = name.partition(".")
    if head == "exarch_actors" and rest.partition(".")[0] in LAYERS[:3]:
        return rest
    return name


def _import_graph() -> dict[str, set[str]]:
    modules = _project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {t for t in _imported_names(path, name) if t in modules and t != name}
        # ``import a.b`` also runs a/__init__.py; that is not counted as an edge: a package's
        # __init__ importing its own modules (runtime/providers/) is how a package is built.
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle
    through its members, smallest component first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components, key=lambda c: (len(c), c))


def _a_cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete cycle inside a strongly connected component, as ``a -> b -> ... -> a``."""
    members = set(component)
    start = component[0]
    # breadth-first from start back to start, inside the component
    paths = {w: [start, w] for w in sorted(graph[start] & members)}
    frontier = list(paths)
    while start not in paths:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return paths[start]


def test_the_import_scan_counts_type_checking_function_local_and_relative_imports(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "runtime" / "fleet"
    pkg.mkdir(parents=True)
    source = pkg / "inbox.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from exarch_actors.runtime.state.journal import Journal\n"
        "import exarch_actors.runtime.ral.values\n"
        "from . import park\n"
        "from ..session_dir import SessionDir\n"
        "def f():\n"
        "    from exarch_actors.cli import main\n",
        encoding="utf-8",
    )
    found = _imported_names(source, "runtime.fleet.inbox")
    assert {
        "runtime.state.journal",
        "runtime.ral.values",
        "runtime.fleet.park",
        "runtime.session_dir",
        "cli.main",
    } <= found


def test_the_import_graph_covers_runtime_actors_and_cli() -> None:
    graph = _import_graph()
    assert {m.split(".")[0] for m in graph} == set(LAYERS)
    assert "runtime.state.journal" in graph["runtime.settlement.release_sweep"]


def test_no_module_imports_itself_back_through_others() -> None:
    graph = _import_graph()
    cycles = [
        f"{' -> '.join(_a_cycle_through(c, graph))}  (all of: {', '.join(c)})"
        for c in _cycles(graph)
    ]
    assert not cycles, "import cycles (every import counts, however deep):\n" + "\n".join(cycles)


def test_runtime_never_imports_actors_or_cli_and_actors_never_imports_cli() -> None:
    graph = _import_graph()
    rank = {top: n for n, top in enumerate(LAYERS)}
    upward = [
        f"{src} imports {dst}"
        for src, targets in sorted(graph.items())
        for dst in sorted(targets)
        if rank[dst.split(".")[0]] > rank[src.split(".")[0]]
    ]
    assert not upward, "a lower layer imports a higher one:\n" + "\n".join(upward)


# --------------------------------------------------------------------------- the session layout

SESSION_DIR_MODULE = ROOT / "runtime" / "state" / "session_dir.py"

SESSION_FILE_NAMES = frozenset(
    {
        "run.json",
        "transcript.jsonl",
        "record.jsonl",
        "spawn-journal.jsonl",
        "result.json",
        "recording.toml",
        "replay-report.json",
        "events.jsonl",
        "snapshot.msgpack",
    }
)
"""Every file a session directory holds (docs/scenarios.md)."""

SESSION_DIR_NAMES = frozenset({"agents", "scratch", "retained"})
"""Its directories: named only where a path is built (``x / "agents"``), since the same words are
also ordinary keys (a scenario's ``agents`` table)."""


def _session_names_in(path: Path, root: Path = ROOT) -> list[str]:
    """Each string constant in ``path`` that is a session file's name, a glob of one
    (``events*.jsonl``), or a session directory's name joined onto a path."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    stems = {name.split(".")[0] for name in SESSION_FILE_NAMES}
    hits: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            named = text in SESSION_FILE_NAMES or any(
                text.startswith(stem + "*") or text.startswith(stem + ".")
                for stem in stems
                if text.endswith((".jsonl", ".json", ".msgpack", ".toml"))
            )
            if named:
                hits.append(f"{path.relative_to(root)}:{node.lineno}: {text!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and right.value in SESSION_DIR_NAMES:
                hits.append(f"{path.relative_to(root)}:{node.lineno}: / {right.value!r}")
    return hits


def test_the_session_name_scan_finds_names_globs_and_joined_directories(tmp_path: Path) -> None:
    source = tmp_path / "reader.py"
    source.write_text(
        "from pathlib import Path\n"
        "def f(root: Path) -> list[Path]:\n"
        "    a = root / 'transcript.jsonl'\n"
        "    b = sorted((root / 'agents' / 'x').glob('events*.jsonl'))\n"
        "    return [a, *b, root / 'result.json']\n"
        "AGENTS_KEY = 'agents'  # an ordinary key, not a path\n",
        encoding="utf-8",
    )
    found = {hit.split(": ", 1)[1] for hit in _session_names_in(source, tmp_path)}
    assert found == {"'transcript.jsonl'", "/ 'agents'", "'events*.jsonl'", "'result.json'"}


def test_only_the_session_dir_module_names_a_session_file() -> None:
    hits = [
        hit
        for path in sorted(_project_modules().values())
        if path != SESSION_DIR_MODULE
        for hit in _session_names_in(path)
    ]
    assert not hits, (
        "name a session's files through runtime.state.session_dir.SessionDir:\n" + "\n".join(hits)
    )


def test_the_session_dir_module_names_every_session_file() -> None:
    source = SESSION_DIR_MODULE.read_text(encoding="utf-8")
    constants = {
        n.value
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    assert constants >= SESSION_FILE_NAMES


# --------------------------------------------------------------------------- one name, one thing


def _public_definitions(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Every top-level public class and function name (no leading ``_``) -> the modules that
    define it, in module order."""
    defined: dict[str, list[str]] = {}
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:
            public = not getattr(node, "name", "_").startswith("_")
            if public and isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                defined.setdefault(node.name, []).append(name)
    return defined


def _doubles(modules: dict[str, Path]) -> dict[str, list[str]]:
    return {n: mods for n, mods in _public_definitions(modules).items() if len(mods) > 1}


def test_the_name_scan_finds_a_class_or_function_defined_in_two_modules(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "class Verdict: ...\ndef fold(): ...\ndef _private(): ...\nCONSTANT = 1\n",
        encoding="utf-8",
    )
    (tmp_path / "b.py").write_text(
        "def Verdict(): ...\nasync def fold(): ...\ndef _private(): ...\nCONSTANT = 2\n"
        "class Outer:\n    def fold(self): ...\n",
        encoding="utf-8",
    )
    assert _doubles({"a": tmp_path / "a.py", "b": tmp_path / "b.py"}) == {
        "Verdict": ["a", "b"],
        "fold": ["a", "b"],
    }


def test_each_public_class_and_function_name_is_defined_in_one_module_only() -> None:
    doubles = _doubles(_project_modules())
    assert not doubles, (
        "each name means one thing in the project; rename one of each:\n"
        + "\n".join(f"{n}: {', '.join(mods)}" for n, mods in sorted(doubles.items()))
    )
