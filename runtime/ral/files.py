"""File builtins, confined to the granted roots (``not granted: ...`` outside them).

Every builtin reaches the filesystem only through :mod:`runtime.ral.confine`: links are resolved
one component at a time and whatever leads outside the roots is refused, and the descriptor that
was checked is the one used (no check-then-open race). Directory walks (``explore-dir``,
``grep-files``) never follow a link: ``explore-dir`` lists one as ``name@``, ``grep-files`` skips
it (as ``grep -r`` does); only the PATH argument itself is resolved.

Listings skip hidden entries (names starting with ``.``) and are capped so a stray
``explore-dir /`` cannot produce an unbounded value; a cap is always announced in the output.
Writes are atomic (temp file + ``rename`` in the checked directory), keeping the file's mode.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from exarch_actors.runtime.ral import confine
from exarch_actors.runtime.ral.errors import RalError
from exarch_actors.runtime.ral.interp import Interp, Native
from exarch_actors.runtime.ral.pattern import compile_pattern
from exarch_actors.runtime.ral.values import UNIT, render, type_name
from exarch_actors.runtime.shell.confinement import Sandbox, refusal_note

LIST_CAP = 5000
"""Most entries ``explore-dir`` lists and most matches ``grep-files`` reports."""

GREP_MAX_FILE = 4 << 20
"""Files larger than 4 MiB are skipped by ``grep-files`` (logs and blobs, not source)."""

_GREP_OPEN = os.O_RDONLY | os.O_NONBLOCK
"""``O_NONBLOCK``: opening a FIFO met in a walk must not wait for a writer (it is then skipped)."""


@contextmanager
def refusals(what: str, shown: Any, verb: str, sandbox: Sandbox | None = None) -> Iterator[None]:
    """Map confinement and OS failures to ral errors: ``not granted: WHAT PATH (why)`` and
    ``WHAT: cannot VERB PATH: reason`` (a kernel refusal in a confined shell says so)."""
    try:
        yield
    except confine.Outside as e:
        raise RalError(f"not granted: {what} {shown} ({e.why})") from None
    except OSError as e:
        reason = f"{e.strerror or e}{refusal_note(sandbox, e)}"
        raise RalError(f"{what}: cannot {verb} {shown}: {reason}") from None


def read_bytes(it: Interp, p: Any, what: str) -> bytes:
    """The content of the file ``p`` leads to, inside the roots."""
    full = it.path(p, what)
    with refusals(what, p, "read", it.ctx.sandbox):
        return confine.read_confined_bytes(full, it.ctx.grants.roots)


def _read_text(it: Interp, p: Any, what: str) -> str:
    return read_bytes(it, p, what).decode("utf-8", "replace")


def _write_text(it: Interp, p: Any, data: str, what: str) -> None:
    full = it.path(p, what)
    with refusals(what, p, "write", it.ctx.sandbox):
        confine.write_atomic(full, data.encode("utf-8"), it.ctx.grants.roots)


def _open_dir(it: Interp, shown: str, what: str) -> int:
    full = it.path(shown, what)
    with refusals(what, shown, "open", it.ctx.sandbox):
        try:
            fd, _ = confine.open_dir(full, it.ctx.grants.roots)
        except NotADirectoryError:
            raise RalError(f"{what}: not a directory: {shown}") from None
        except FileNotFoundError:
            raise RalError(f"{what}: no such file or directory: {shown}") from None
    return fd


def view_text(it: Interp, a: list[Any]) -> Any:
    s = _read_text(it, a[0], "view-text")
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
    fd = _open_dir(it, shown, "explore-dir")
    try:
        entries = confine.walk_tree(fd, LIST_CAP * 4)
    finally:
        os.close(fd)
    suffix = {"dir": "/", "link": "@", "file": ""}
    lines = [p + suffix[kind] for p, kind in entries[:LIST_CAP]]
    if len(entries) > LIST_CAP:
        lines.append(f"... (listing capped at {LIST_CAP} entries)")
    return "\n".join(lines)


def grep_files(it: Interp, a: list[Any]) -> Any:
    if type(a[0]) is not str:
        raise RalError(f"grep-files: the pattern must be a string, not {type_name(a[0])}")
    pat = compile_pattern(a[0], "grep-files")  # RE2: linear time whatever the pattern
    shown = str(a[1]) if len(a) > 1 else "."
    full = it.path(shown, "grep-files")
    roots = it.ctx.grants.roots
    with refusals("grep-files", shown, "read", it.ctx.sandbox):
        try:
            top, _ = confine.open_dir(full, roots)
        except NotADirectoryError:  # one file (links resolved, confined like read-text)
            fd = confine.open_file(full, roots, _GREP_OPEN)
            return "\n".join(_grep_fd(fd, pat, shown, []))
        except FileNotFoundError:
            raise RalError(f"grep-files: no such file or directory: {shown}") from None
    hits: list[str] = []
    try:
        for rel, kind in confine.walk_tree(top, LIST_CAP * 4):
            if kind != "file":
                continue  # directories are walked; links are never followed
            it.poll()
            try:
                fd = confine.open_below(top, rel, _GREP_OPEN)
            except OSError:
                continue  # gone, unreadable, or swapped to a link since the walk
            _grep_fd(fd, pat, rel, hits)
            if len(hits) > LIST_CAP:
                break
    finally:
        os.close(top)
    return "\n".join(hits)


def _grep_fd(fd: int, pat: Any, rel: str, hits: list[str]) -> list[str]:
    """Append ``rel:line:text`` for each matching line of the open file ``fd`` (closed here);
    non-regular, large and binary files are skipped. Past :data:`LIST_CAP` a cap line ends it."""
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > GREP_MAX_FILE:
            return hits
        try:
            data = fh.read()
        except OSError:
            return hits
    if b"\0" in data[:8192]:
        return hits  # binary
    for n, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
        if pat.search(line):
            hits.append(f"{rel}:{n}:{line}")
            if len(hits) >= LIST_CAP:
                hits.append(f"... (matches capped at {LIST_CAP})")
                return hits
    return hits


def edit_replace(it: Interp, a: list[Any]) -> Any:
    old, new = a[1], a[2]
    if type(old) is not str or type(new) is not str:
        raise RalError("edit-replace: OLD and NEW must be strings")
    if not old:
        raise RalError("edit-replace: OLD is empty")
    s = _read_text(it, a[0], "edit-replace")
    n = s.count(old)
    if n != 1:
        raise RalError(
            f"edit-replace: OLD occurs {n} times in {a[0]}; it must occur exactly once"
            + (" (add surrounding lines to make it unique)" if n > 1 else "")
        )
    _write_text(it, a[0], s.replace(old, new, 1), "edit-replace")
    return UNIT


def edit_hash(it: Interp, a: list[Any]) -> Any:
    return hashlib.sha256(read_bytes(it, a[0], "edit-hash")).hexdigest()


def read_text(it: Interp, a: list[Any]) -> Any:
    return _read_text(it, a[0], "read-text")


def write_text(it: Interp, a: list[Any]) -> Any:
    data = a[1] if type(a[1]) is str else render(a[1])
    _write_text(it, a[0], data, "write-text")
    return UNIT


def _natives() -> dict[str, Native]:
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
