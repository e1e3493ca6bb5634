"""Shipping an agent host's durable writes to the session directory on another machine.

An agent host on a Ray node (``actors/ray_backend.py``) writes its durable files -- its event
log, snapshot base and binding log, its ``Commit`` records, its shell's ``record.jsonl`` lines
-- into a session directory *local to its node*, and every one of those writes is also shipped, as a
:class:`ShippedRecord`, to the driver, which applies it to the real session directory
(:func:`apply_shipped`). So the session directory on the driver's machine is complete whether
or not the nodes share a file system, and ``check`` and ``resume`` read it alone.

Two ends, one module:

- **Host side.** The host binds its local root with a sink (``durability.bind(..., ship=)``);
  every writer of a durable file under it (the bound append writers, ``atomic_write_bytes``,
  the binding log's writer, the event log's ``/clear`` archive) hands the write to
  ``durability.shipped`` right after making it locally. With no sink bound (every backend but
  Ray) that is one test of a counter.
- **Driver side.** :func:`apply_shipped` writes a record into the session directory under the
  session's durability policy: JSON lines through the bound append writer, binary frames as
  one raw ``write(2)``, whole files atomically, renames as ``os.replace``.

Invariants:
- A host writes only its own agent's directory and ``record.jsonl``: any other path (``..``,
  an absolute path, another agent's directory) is refused (:class:`RecordRefused`) and
  nothing is written.
- Order: the host ships a record after its local write and before it acts on it (the write's
  caller returns only after the sink does), and the driver applies a channel's records
  in the order they arrive, before it reads any later frame of that channel. So whatever the
  driver saw of a host (a bus event, a spawn, its end) it saw after that host's earlier
  records were written into the session directory: the directory is a prefix of each host's
  writes, as after any crash, never a state the rest of the run contradicts.
- Durability: under ``process`` a record is written (``write(2)``) on the driver before the
  driver reads the host's next frame; under ``machine`` the host waits for the driver's
  acknowledgement, which comes once the record is fsync'd there (the sink decides how to wait;
  ``actors/agent_process_host.py``).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path, PurePosixPath

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import OPS, ShippedRecord, write_all
from exarch_actors.runtime.state.durable import atomic_write_bytes
from exarch_actors.runtime.state.private import FILE_MODE, private_dirs
from exarch_actors.runtime.state.session_dir import SessionDir

__all__ = [
    "RecordRefused",
    "ShippedRecord",
    "agent_files",
    "apply_shipped",
    "node_copy_name",
    "seed",
]


class RecordRefused(ExarchError):
    """A shipped record names a path its host may not write, or an unknown operation."""


def node_copy_name(driver_root: Path) -> str:
    """The name of a node's copy of the session directory at ``driver_root`` (the same on
    every node: the driver's directory name and a digest of its full path, so two runs never
    share a copy even when their directories share a name). ``replay`` reads a path that ends
    in it as the recorded session's own."""
    digest = hashlib.sha256(str(driver_root.resolve()).encode()).hexdigest()[:10]
    return f"{driver_root.name}-{digest}"


def agent_files(session: SessionDir, name: str) -> dict[str, bytes]:
    """The durable files of agent ``name`` in ``session``, by path relative to its root: what
    a host started on another node is seeded with (its event logs, snapshot base and log)."""
    directory = session.events(name).parent
    if not directory.is_dir():
        return {}
    out: dict[str, bytes] = {}
    for p in sorted(directory.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            out[p.relative_to(session.root).as_posix()] = p.read_bytes()
    return out


def seed(session: SessionDir, name: str, files: dict[str, bytes]) -> None:
    """Make agent ``name``'s directory in ``session`` hold exactly ``files`` (from
    :func:`agent_files`): a host restarted on another node starts from the driver's copy."""
    directory = session.events(name).parent
    private_dirs(directory)
    for p in directory.iterdir():
        if p.is_file():
            p.unlink()
    for rel, data in files.items():
        target = _allowed(session, name, rel)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            write_all(fd, data, target)
        finally:
            os.close(fd)


@functools.lru_cache(maxsize=4096)
def _allowed(session: SessionDir, agent: str, rel: str) -> Path:
    """The absolute path of ``rel`` if agent ``agent``'s host may write it.

    Cached (a refusal raises, so only allowed paths are kept): a Ray host ships about four
    records a ral call, each checked here on the driver's reader thread, and the check's
    pathlib work was 40 of the 63 us an append took there (a bound ``process`` session,
    measured in one process); a host writes the same few files all run long."""
    pure = PurePosixPath(rel)
    target = session.root.joinpath(*pure.parts) if pure.parts else session.root
    own = session.events(agent).parent
    if (
        pure.is_absolute()
        or ".." in pure.parts
        or not (target == session.record or (target.parent == own and target.name))
    ):
        raise RecordRefused(f"agent {agent}: may not write {rel!r} in the session directory")
    return target


def apply_shipped(session: SessionDir, agent: str, record: ShippedRecord) -> None:
    """Write ``record`` (from ``agent``'s host) into ``session`` under its bound policy;
    :class:`RecordRefused` for a path the host may not write or an unknown operation."""
    if record.op not in OPS:
        raise RecordRefused(f"agent {agent}: unknown record operation {record.op!r}")
    target = _allowed(session, agent, record.path)
    if record.op == "lines":
        durability.append(target, record.data)
    elif record.op == "bytes":
        _append_bytes(target, record.data)
    elif record.op == "replace":
        atomic_write_bytes(target, record.data)
    else:
        if record.to is None:
            raise RecordRefused(f"agent {agent}: a rename of {record.path!r} without a target")
        os.replace(target, _allowed(session, agent, record.to))


def _append_bytes(path: Path, data: bytes) -> None:
    """One raw append (a binding-log frame: no line discipline), durable under the policy."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:  # its directory is there but for the first frame: no walk up its parents each time
        fd = os.open(path, flags, FILE_MODE)
    except FileNotFoundError:
        private_dirs(path.parent)
        fd = os.open(path, flags, FILE_MODE)
    try:
        write_all(fd, data, path)
        durability.sync_for(path)(fd)
    finally:
        os.close(fd)
