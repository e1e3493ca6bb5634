"""Writing a session record by hand as the runtime's writers would: sealed with its checksum
(``runtime/state/checksum.py``). A test that means "a writer wrote a record of the wrong shape"
uses these, so what it tests is the shape check, not the checksum."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exarch_actors.runtime.state.checksum import open_line, seal_line
from exarch_actors.runtime.state.durable import read_json_document, write_json_document


def record_of(line: bytes | str) -> dict[str, Any]:
    """The record a JSON line holds, without its checksum member."""
    raw = line.encode() if isinstance(line, str) else line
    rec: dict[str, Any] = json.loads(open_line(raw.rstrip(b"\n"))[0])
    return rec


def sealed(record: dict[str, Any]) -> bytes:
    """``record`` as the sealed JSON line a writer appends (with its newline)."""
    return seal_line(json.dumps(record, ensure_ascii=False).encode())


def rewrite_document(path: Path, **changed: Any) -> dict[str, Any]:
    """Replace fields of the JSON document at ``path`` (``run.json``, ``result.json``), sealed
    as the writer seals it; a value of ``...`` removes the field. Returns the new document."""
    doc = {**read_json_document(path)[0], **changed}
    doc = {k: v for k, v in doc.items() if v is not ...}
    write_json_document(path, doc)
    return doc
