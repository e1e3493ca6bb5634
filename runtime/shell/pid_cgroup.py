"""Where an agent's pids cgroup is, and who is in it (reads only; ``actors/pid_cgroup.py`` joins
and sweeps).

Layout: ``<pids hierarchy>/<our cgroup>/exarch-<session token>/<agent>/<pid>``: one leaf per
shell host or worker, the agent's process cap (``--shell-procs``) on ``<agent>``, so it counts
the host, its workers and every program they started together; the session's group is how
``resume`` and ``check`` find what a dead run left, whatever its environment says.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@functools.lru_cache(maxsize=1)
def hierarchy() -> Path | None:
    """The writable pids cgroup this process may create groups under: its own cgroup in the
    v1 ``pids`` hierarchy, or in the v2 hierarchy when ``pids`` is delegated there. None when
    neither is writable (read once per process: the fork server's answer holds for its
    children)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in mounts:
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup" and "pids" in parts[3].split(","):
            v1 = parts[1]
        elif parts[2] == "cgroup2":
            v2 = parts[1]
    for line in own:
        hid, controllers, path = line.split(":", 2)
        if v1 is not None and "pids" in controllers.split(","):
            return _usable(Path(v1 + path), v2=False)
        if v2 is not None and hid == "0" and controllers == "":
            found = _usable(Path(v2 + path), v2=True)
            if found is not None:
                return found
    return None


def _usable(base: Path, *, v2: bool) -> Path | None:
    if not os.access(base, os.W_OK):
        return None
    if v2:
        try:
            if "pids" not in (base / "cgroup.subtree_control").read_text().split():
                return None
        except OSError:
            return None
    return base


def session_group(marker: str) -> str:
    """The group of a session (``marker``: its ``EXARCH_SESSION``, the session's real path)."""
    return "exarch-" + hashlib.sha1(marker.encode()).hexdigest()[:16]


def agent_group(marker: str, agent: str) -> str:
    """The group of one agent of a session, relative to :func:`hierarchy`."""
    return f"{session_group(marker)}/{_SAFE.sub('_', agent) or '_'}"


def members(path: Path) -> list[int]:
    out: list[int] = []
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            out.extend(int(p) for p in procs.read_text().split())
    return out


def session_members(marker: str) -> list[int]:
    """The processes still in a session's groups (``check``: a dead run's should be none)."""
    base = hierarchy()
    if base is None:
        return []
    path = base / session_group(marker)
    return members(path) if path.is_dir() else []


__all__ = ["agent_group", "hierarchy", "members", "session_group", "session_members"]
