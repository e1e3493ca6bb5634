"""File builtins, confined to the granted roots (``not granted: ...`` outside them).

Listings skip hidden entries (names starting with ``.``) and are capped so a stray
``explore-dir /`` cannot produce an unbounded value; a cap is always announced in the output.
Writes are atomic (temp file + ``os.replace``), keeping the file's mode.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import TYPE_CHECKING, Any

from runtime.ral.errors import RalError
from runtime.ral.pattern import compile_pattern
from runtime.ral.values import UNIT, render, type_name

if TYPE_CHECKING:
    from runtime.ral.interp import Interp, Native

LIST_CAP = 5000
"""Most entries ``explore-dir`` lists and most matches ``grep-files`` reports."""

GREP_MAX_FILE = 4 << 20
"""Files larger than 4 MiB are skipped by ``grep-files`` (logs and blobs, not source)."""


def _read_text(full: str, shown: str, who: str) -> str:
    try:
        with open(full, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise RalError(f"{who}: cannot read {shown}: {e.strerror or e}") from None
    return data.decode("utf-8", "replace")


def _write_atomic(full: str, data: str, shown: str, who: str) -> None:
    d = os.path.dirname(full) or "."
    try:
        mode = os.stat(full).st_mode & 0o7777 if os.path.exists(full) else None
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".ral-edit-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(data)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, full)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise RalError(f"{who}: cannot write {shown}: {e.strerror or e}") from None


def _walk(root: str) -> list[tuple[str, bool]]:
    """(relative path, is_dir) under ``root``, sorted, hidden entries skipped."""
    out: list[tuple[str, bool]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out.append((os.path.normpath(os.path.join(rel, d)), True))
        for f in sorted(filenames):
            if not f.startswith("."):
                out.append((os.path.normpath(os.path.join(rel, f)), False))
        if len(out) > LIST_CAP * 4:
            break
    out.sort()
    return out


def view_text(it: Interp, a: list[Any]) -> Any:
    full = it.path(a[0], "view-text")
    s = _read_text(full, str(a[0]), "view-text")
    if len(a) == 1:
        return s
    if len(a) != 3 or type(a[1]) is not int or type(a[2]) is not int:
        raise RalError("view-text: expected PATH or PATH FROM TO (line numbers, 1-based)")
    lo, hi = a[1], a[2]
    if lo < 1 or hi < lo:
        raise RalError(f"view-text: bad line range {lo}..{hi}")
    return "\n".join(s.split("\n")[lo - 1 : hi])


def explore_dir(it: Interp, a: list[Any]) -> Any:
    shown = str(a[0]) if a else "."
    full = it.path(shown, "explore-dir")
    if not os.path.isdir(full):
        raise RalError(f"explore-dir: not a directory: {shown}")
    entries = _walk(full)
    lines = [p + "/" if is_dir else p for p, is_dir in entries[:LIST_CAP]]
    if len(entries) > LIST_CAP:
        lines.append(f"... (listing capped at {LIST_CAP} entries)")
    return "\n".join(lines)


def grep_files(it: Interp, a: list[Any]) -> Any:
    if type(a[0]) is not str:
        raise RalError(f"grep-files: the pattern must be a string, not {type_name(a[0])}")
    pat = compile_pattern(a[0], "grep-files")  # RE2: linear time whatever the pattern
    shown = str(a[1]) if len(a) > 1 else "."
    full = it.path(shown, "grep-files")
    if os.path.isfile(full):
        files = [(full, shown)]
    elif os.path.isdir(full):
        files = [(os.path.join(full, p), p) for p, is_dir in _walk(full) if not is_dir]
    else:
        raise RalError(f"grep-files: no such file or directory: {shown}")
    hits: list[str] = []
    for path, rel in files:
        if it.stop:
            from runtime.ral.compile import check_cancel

            check_cancel(it)
        try:
            if os.path.getsize(path) > GREP_MAX_FILE:
                continue
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
            if pat.search(line):
                hits.append(f"{rel}:{n}:{line}")
                if len(hits) >= LIST_CAP:
                    hits.append(f"... (matches capped at {LIST_CAP})")
                    return "\n".join(hits)
    return "\n".join(hits)


def edit_replace(it: Interp, a: list[Any]) -> Any:
    full = it.path(a[0], "edit-replace")
    old, new = a[1], a[2]
    if type(old) is not str or type(new) is not str:
        raise RalError("edit-replace: OLD and NEW must be strings")
    if not old:
        raise RalError("edit-replace: OLD is empty")
    s = _read_text(full, str(a[0]), "edit-replace")
    n = s.count(old)
    if n != 1:
        raise RalError(
            f"edit-replace: OLD occurs {n} times in {a[0]}; it must occur exactly once"
            + (" (add surrounding lines to make it unique)" if n > 1 else "")
        )
    _write_atomic(full, s.replace(old, new, 1), str(a[0]), "edit-replace")
    return UNIT


def edit_hash(it: Interp, a: list[Any]) -> Any:
    full = it.path(a[0], "edit-hash")
    try:
        with open(full, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError as e:
        raise RalError(f"edit-hash: cannot read {a[0]}: {e.strerror or e}") from None


def read_text(it: Interp, a: list[Any]) -> Any:
    return _read_text(it.path(a[0], "read-text"), str(a[0]), "read-text")


def write_text(it: Interp, a: list[Any]) -> Any:
    data = a[1] if type(a[1]) is str else render(a[1])
    _write_atomic(it.path(a[0], "write-text"), data, str(a[0]), "write-text")
    return UNIT


def _natives() -> dict[str, Native]:
    from runtime.ral.interp import Native

    return {
        "view-text": Native(view_text, 1, 3, "view-text PATH [FROM TO]"),
        "grep-files": Native(grep_files, 1, 2, "grep-files PATTERN [PATH] -> path:line:text lines"),
        "explore-dir": Native(explore_dir, 0, 1, "explore-dir [PATH] -> one entry per line"),
        "edit-replace": Native(edit_replace, 3, 3, "edit-replace PATH OLD NEW (OLD exactly once)"),
        "edit-hash": Native(edit_hash, 1, 1, "edit-hash PATH -> sha256 hex of the content"),
        "read-text": Native(read_text, 1, 1, "read-text PATH -> the whole file as a string"),
        "write-text": Native(write_text, 2, 2, "write-text PATH TEXT (atomic)"),
    }


FILE_NATIVES = _natives()
