"""The repository's layout rules that no other test owns: it speaks of itself alone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCANNED = ("runtime", "actors", "cli", "docs", "benchmarks", "examples", "tests", "README.md")
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
random seed ("seed 90413", ``--seed``) is not one; neither is ``docs/ral.md``."""


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
        "cite docs/ral.md, docs/scenarios.md, docs/architecture.md or docs/drills.md, or state "
        "the rule in place:\n" + "\n".join(hits)
    )
