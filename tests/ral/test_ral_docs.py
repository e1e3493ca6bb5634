"""Every ```ral example in docs/language.md runs and produces what its annotations say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.ral.values import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "language.md"
_BLOCK = re.compile(r"^```ral\n(.*?)^```", re.S | re.M)


def _chunks() -> list[tuple[int, int, str]]:
    out = []
    for b, m in enumerate(_BLOCK.finditer(DOC.read_text(encoding="utf-8"))):
        for c, chunk in enumerate(re.split(r"\n\s*\n", m.group(1))):
            if chunk.strip():
                out.append((b, c, chunk))
    return out


CHUNKS = _chunks()


def test_the_reference_has_examples() -> None:
    assert len(CHUNKS) > 30


@pytest.mark.parametrize("block", sorted({b for b, _, _ in CHUNKS}))
def test_doc_example_block_behaves_as_annotated(block: int) -> None:
    s = Session(faults=False)
    try:
        for _, c, chunk in [x for x in CHUNKS if x[0] == block]:
            r = s.run(chunk)
            checked = False
            for line in chunk.split("\n"):
                m = re.match(r"# (=>|stdout:|error:) ?(.*)$", line)
                if not m:
                    continue
                checked = True
                kind, want = m.groups()
                where = f"block {block} chunk {c}:\n{chunk}"
                if kind == "=>":
                    assert r.error is None, (where, r.error)
                    assert render(r.value) == want, where
                elif kind == "stdout:":
                    assert r.error is None, (where, r.error)
                    assert r.stdout == want.replace("\\n", "\n"), where
                else:
                    assert r.error is not None, where
                    pos = re.match(r"(\d+):(\d+) (.*)", want)
                    if pos:
                        assert (r.error.line, r.error.col) == (int(pos[1]), int(pos[2])), where
                        want = pos[3]
                    assert want in r.error.message, (where, r.error)
            if not checked:
                assert r.error is None, (chunk, r.error)
    finally:
        s.close()
