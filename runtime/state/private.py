"""Session files are the user's alone: every file the runtime writes under a session directory
(or a recording) is created ``0600`` and every directory it makes ``0700``.

A session holds what agents read and ran (tool results, transcripts, snapshots of their
shells), and a recording the model's replies: on a shared machine none of it is anyone else's
to read. The modes are given where each file is created (not through the process umask, which
would also narrow the files agents' programs write in the user's tree).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dirs(path: str | os.PathLike[str]) -> None:
    """Make directory ``path`` and whichever of its parents are missing, each ``0700`` (the
    umask may only narrow that); ones that exist are left as they are."""
    p = Path(path)
    missing: list[Path] = []
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
            d.mkdir(DIR_MODE)
        if not d.is_dir():  # a file in the way: refused, as mkdir -p refuses it
            raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(d))


def make_private(path: str | os.PathLike[str]) -> None:
    """``chmod 0700`` a directory the user handed over (``--session-dir DIR`` that exists)."""
    os.chmod(path, DIR_MODE)
