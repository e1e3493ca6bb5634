"""Confinement: the one way file builtins reach the filesystem, refused outside the granted roots.

A path is first made absolute and normalised lexically (``a/link/..`` is ``a``, as ``cd`` keeps
it). :func:`walk` then resolves it the way the kernel would, but one component at a time from
``/``: each component is opened with ``O_NOFOLLOW`` relative to the directory descriptor before
it, and a symbolic link is read (``readlink``) and spliced into the rest of the path instead of
being followed by the kernel. So the real path the walk computes is the path of the descriptor it
holds, and the decision "inside the roots or not" is made on that real path *before* the last
component is opened (opening a FIFO or a device outside the roots is itself an effect). The
caller then uses that descriptor (or its directory with ``*at`` calls); no path is ever opened by
name again, so a link swapped between the check and the use cannot redirect it:

- a component swapped to a link after it was looked at fails its ``O_NOFOLLOW`` open (or opens
  the link itself under ``O_PATH``, which is detected) and is re-read as a link;
- ``..`` in a link's target re-walks the textual parent of the real path, never a descriptor's
  ``..``, so a directory moved under the walk cannot smuggle it elsewhere;
- at most :data:`MAX_LINKS` links per path (loops end as ``ELOOP``, like the kernel's).

Directory walks (:func:`walk_tree`, :func:`open_below`) never follow a link at all: every open is
``O_NOFOLLOW`` relative to a descriptor that descends from the checked top directory, so a walk
stays inside the real tree it started in and cannot loop.

Cost, measured in one run on a loaded 2-core machine (a root four components deep): 1000
``read-text`` calls took 0.33 s against 0.24 s for the old ``realpath`` + ``open`` (one
``openat`` per component instead of the kernel's own walk); ``grep-files`` over 1000 files took
0.15 s against 0.25 s and ``explore-dir`` over 1050 entries 8 ms against 17 ms (descriptor-
relative opens and ``scandir`` instead of ``os.walk`` plus a path open per file).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from exarch_actors.runtime.ral.grants import within

MAX_LINKS = 40
"""Links followed while resolving one path: Linux's own limit (``MAXSYMLINKS`` in fs/namei.c)."""

_PATH = getattr(os, "O_PATH", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_STEP = (_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
"""An intermediate directory: ``O_PATH`` needs only search permission (as ``realpath`` does);
with ``O_DIRECTORY`` a link fails (``ENOTDIR``) instead of being opened itself."""
_READ = os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC
_READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_NOFOLLOW | _CLOEXEC


class Outside(Exception):
    """``real`` (where the path leads) lies outside every granted root."""

    def __init__(self, real: str, via_link: bool) -> None:
        super().__init__(real)
        self.real = real
        self.via_link = via_link

    @property
    def why(self) -> str:
        if self.via_link:
            return "a link leads outside the granted roots"
        return "outside the granted roots"


@dataclass(frozen=True)
class Located:
    """The parent directory (an open descriptor, owned by the caller) and the final name of a
    resolved path whose last component is not a link (it may not exist yet)."""

    dir_fd: int
    dir_real: str
    name: str

    @property
    def real(self) -> str:
        return os.path.join(self.dir_real, self.name)


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def _readlink(name: str, dir_fd: int) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOENT):  # not a link (any more), or gone
            return None
        raise


def walk(
    path: str, roots: tuple[str, ...] | None, final_flags: int | None
) -> tuple[int, str, str | None]:
    """Resolve the absolute, lexically normal ``path`` confined to ``roots`` (None: anywhere).

    ``final_flags`` given: open the last component with them and return ``(fd, real, None)``.
    ``final_flags`` None: stop at the last component, following it only if it is a link, and
    return ``(parent_fd, parent_real, name)``; the name may not exist. The caller owns the
    returned descriptor. Raises :class:`Outside` or ``OSError``."""
    if not os.path.isabs(path):
        raise ValueError(f"confine.walk needs an absolute path, not {path!r}")
    if final_flags is not None:
        final_flags |= os.O_NOFOLLOW  # the kernel never follows a link for us
    todo = deque(_parts(path))
    fd = os.open("/", _STEP)
    real = "/"
    links = 0

    def restart_at(target: str) -> None:
        nonlocal fd, real
        todo.extendleft(reversed(_parts(target)))
        os.close(fd)
        fd = os.open("/", _STEP)
        real = "/"

    def splice(target: str) -> None:
        nonlocal links
        links += 1
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if target.startswith("/"):
            restart_at(target)
        else:
            todo.extendleft(reversed(_parts(target)))

    def check(candidate: str) -> None:
        if roots is not None and not any(within(candidate, r) for r in roots):
            raise Outside(candidate, links > 0)

    def check_last(name: str, candidate: str) -> bool:
        """Refuse a last component outside the roots before it is opened, unless it is a link
        (then it is spliced and False returned: its target is what gets checked)."""
        try:
            check(candidate)
        except Outside:
            target = _readlink(name, fd)
            if target is None:
                raise
            splice(target)
            return False
        return True

    try:
        while todo:
            name = todo.popleft()
            if name == "..":
                restart_at(os.path.dirname(real))
                continue
            last = not todo
            candidate = os.path.join(real, name)
            flags = _STEP
            if last and final_flags is None:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is not None and stat.S_ISLNK(st.st_mode):
                    splice(_readlink(name, fd) or name)  # gone since the stat: look again
                    continue
                if not check_last(name, candidate):
                    continue
                return fd, real, name
            if last and final_flags is not None:
                if not check_last(name, candidate):
                    continue
                flags = final_flags
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except OSError as e:
                # O_NOFOLLOW refuses a link (ELOOP; ENOTDIR with O_DIRECTORY; EMLINK on BSD)
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                target = _readlink(name, fd)
                if target is None and e.errno != errno.ELOOP:
                    raise  # a real "not a directory"
                splice(target or name)  # None: a link a moment ago, so look again
                continue
            os.close(fd)
            fd, real = nfd, candidate
            if last:
                return fd, real, None
        # the path ended at "/" itself (the only directory reached without a last component)
        check(real)
        if final_flags is None:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        os.close(fd)
        fd = os.open(real, final_flags & ~os.O_NOFOLLOW)
        return fd, real, None
    except BaseException:
        os.close(fd)
        raise


# -- the operations the file builtins use ---------------------------------------------------


def open_file(path: str, roots: tuple[str, ...] | None, flags: int = _READ) -> int:
    """An open descriptor of the file ``path`` leads to, inside the roots."""
    fd, _, _ = walk(path, roots, flags)
    return fd


def read_confined_bytes(path: str, roots: tuple[str, ...] | None) -> bytes:
    fd = open_file(path, roots)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def open_dir(path: str, roots: tuple[str, ...] | None) -> tuple[int, str]:
    """A readable descriptor of the directory ``path`` leads to, and its real path."""
    fd, real, _ = walk(path, roots, _READ_DIR)
    return fd, real


def real_dir(path: str, roots: tuple[str, ...] | None) -> str:
    """The real path of the directory ``path`` leads to (``NotADirectoryError`` otherwise)."""
    fd, real, _ = walk(path, roots, _STEP)
    os.close(fd)
    return real


@contextmanager
def located(path: str, roots: tuple[str, ...] | None) -> Iterator[Located]:
    """The parent directory and final name of ``path`` (links resolved), for writing."""
    fd, real, name = walk(path, roots, None)
    try:
        assert name is not None
        yield Located(fd, real, name)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, roots: tuple[str, ...] | None) -> None:
    """Replace the file ``path`` leads to with ``data``: a temporary file in the same (checked)
    directory, then ``rename``, both relative to that directory's descriptor. An existing file
    keeps its mode (exec bits included: an exec grant names a resolved file, so a written script
    is run only through a granted interpreter); a new one gets ``0o666`` less the umask."""
    with located(path, roots) as loc:
        try:
            st = os.stat(loc.name, dir_fd=loc.dir_fd, follow_symlinks=False)
            mode: int | None = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
        except FileNotFoundError:
            mode = None
        tmp = f".ral-edit-{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
        fd = os.open(tmp, flags, 0o600 if mode is not None else 0o666, dir_fd=loc.dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                if mode is not None:
                    os.fchmod(fh.fileno(), mode)
            os.replace(tmp, loc.name, src_dir_fd=loc.dir_fd, dst_dir_fd=loc.dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=loc.dir_fd)
            except OSError:
                pass
            raise


# -- directory walks: never follow a link ---------------------------------------------------


def open_below(top_fd: int, rel: str, flags: int = _READ) -> int:
    """Open ``rel`` (a relative path from :func:`walk_tree`) below ``top_fd`` without following
    any link: a component swapped to a link since the walk fails (``ELOOP``/``ENOTDIR``)."""
    parts = _parts(rel)
    fd = os.dup(top_fd)
    try:
        for i, name in enumerate(parts):
            nfd = os.open(name, _STEP if i < len(parts) - 1 else flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def walk_tree(top_fd: int, limit: int) -> list[tuple[str, str]]:
    """``(relative path, kind)`` of every visible entry below ``top_fd``, sorted by path; kind is
    ``dir``, ``file`` or ``link``. Hidden entries (``.name``) are skipped; links are listed and
    never followed; an unreadable directory is skipped. Stops after about ``limit`` entries."""
    out: list[tuple[str, str]] = []
    pending = [""]
    while pending and len(out) <= limit:
        rel = pending.pop()
        try:
            fd = open_below(top_fd, rel, _READ_DIR) if rel else os.dup(top_fd)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue
        finally:
            os.close(fd)
        subdirs = []
        for e in listed:
            if e.name.startswith("."):
                continue
            p = f"{rel}/{e.name}" if rel else e.name
            try:
                if e.is_symlink():
                    kind = "link"
                elif e.is_dir(follow_symlinks=False):
                    kind = "dir"
                    subdirs.append(p)
                else:
                    kind = "file"
            except OSError:
                continue
            out.append((p, kind))
        pending.extend(reversed(subdirs))
    out.sort()
    return out


__all__ = [
    "MAX_LINKS",
    "Located",
    "Outside",
    "located",
    "open_below",
    "open_dir",
    "open_file",
    "read_confined_bytes",
    "real_dir",
    "walk",
    "walk_tree",
]
