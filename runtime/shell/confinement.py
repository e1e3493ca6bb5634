"""Kernel confinement of a shell: the sandbox modes and the rules a shell host enforces.

The rules here are pure (grants + mode + a few paths -> a :class:`Ruleset`); the system calls
that make the kernel enforce them are :mod:`actors.landlock`. docs/security.md is the user's
account of what is and is not enforced.

Modes, named as Codex CLI names them (``--sandbox``):

- ``full-access``: no kernel confinement (ral's grants still apply to ral's own file builtins
  and program heads).
- ``workspace-write``: programs read the system's program and library directories, the Python
  the runtime runs on, and the **workspace**; they write only the workspace and the agent's
  scratch directory; no network.
- ``read-only``: as ``workspace-write``, but the workspace is read-only (the scratch directory
  stays writable: ``$EXARCH_SCRATCH`` and ``$TMPDIR`` point there).

Invariants:

- The workspace is the run's (``--grant-root`` dirs, else the directory the run started in)
  met with the agent's own grant roots (:meth:`Grants.meet`): a child's grants never exceed
  its parent's, so neither do the paths its kernel rules open (``tests/shell/test_escapes.py``
  checks this with real probes over random grant pairs).
- A sandbox travels inside the shell's :class:`runtime.ral.context.DynamicContext` and is
  decided by the fleet (``actors/fleet.py``), never by ral: no builtin changes it, and the
  fleet replaces whatever a snapshot carries. The scratch path is the fleet's, never read
  back from the shell's environment (which ral can change).
- Writable roots never include the right to make device nodes (a root program in a workspace
  could otherwise ``mknod`` a raw disk).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.ral.grants import Grants


class SandboxMode(enum.Enum):
    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"
    FULL_ACCESS = "full-access"


MODES = tuple(m.value for m in SandboxMode)

NETWORK_DEFAULT = SandboxMode.WORKSPACE_WRITE
"""The default of a run whose provider is a network model: its commands were written by a
model, so they run confined (writes to the workspace and scratch only, no network)."""

SCRIPTED_DEFAULT = SandboxMode.FULL_ACCESS
"""The default of a scripted run (a scenario file the user wrote, played back offline): the
commands are the user's own, as with ``ral``; it keeps the suite and examples unchanged."""


class SandboxUnavailable(ExarchError):
    """The kernel cannot enforce the sandbox mode asked for (no Landlock)."""


def default_mode(provider: str) -> SandboxMode:
    """The mode of a run that did not pass ``--sandbox`` (see the two defaults above)."""
    return SCRIPTED_DEFAULT if provider == "scripted" else NETWORK_DEFAULT


@dataclass(frozen=True)
class Sandbox:
    """One agent's sandbox: its ``mode``, the run's ``workspace`` (real paths), whether programs
    may use the network, the agent's ``scratch`` directory, and its process cap: at most
    ``processes`` processes at once in its pids cgroup ``group`` (``actors/pid_cgroup.py``;
    None: no cap, where no pids cgroup is writable). The cap applies in every mode,
    full-access included: it is a resource limit, not a confinement of what a program sees."""

    mode: SandboxMode = SandboxMode.FULL_ACCESS
    workspace: tuple[str, ...] = ()
    network: bool = False
    scratch: str | None = None
    processes: int | None = None
    group: str | None = None

    @property
    def confined(self) -> bool:
        return self.mode is not SandboxMode.FULL_ACCESS

    def for_scratch(self, scratch: str) -> Sandbox:
        return replace(self, scratch=scratch)

    def describe(self) -> str:
        """One line for people (``/resources``, the first turn, the run's start)."""
        procs = "" if self.processes is None else f"; at most {self.processes} processes"
        if not self.confined:
            return f"full-access: not confined by the kernel{procs}"
        where = ", ".join(self.workspace) or "nothing"
        writes = "scratch only" if self.mode is SandboxMode.READ_ONLY else f"{where} and scratch"
        net = "network allowed" if self.network else "no network"
        return f"{self.mode.value}: reads system dirs and {where}; writes {writes}; {net}{procs}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "workspace": list(self.workspace),
            "network": self.network,
            "scratch": self.scratch,
            "processes": self.processes,
            "group": self.group,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Sandbox | None:
        if not d:
            return None
        return cls(
            SandboxMode(str(d.get("mode", SandboxMode.FULL_ACCESS.value))),
            tuple(str(p) for p in d.get("workspace") or ()),
            bool(d.get("network")),
            None if d.get("scratch") is None else str(d["scratch"]),
            None if d.get("processes") is None else int(d["processes"]),
            None if d.get("group") is None else str(d["group"]),
        )


SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc")
"""Directories every confined program reads (and executes from). ``/proc`` is readable, but the
kernel refuses a confined program another process's ``environ``, ``cwd``, ``root``, ``mem``
(ptrace checks, which Landlock narrows to the program's own domain)."""

ETC_HIDDEN = frozenset(
    {"shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh", "security"}
)
"""``/etc`` entries a confined program never reads (the rest of ``/etc`` it does: the dynamic
loader's cache, passwd, certificates, locale). Landlock grants by hierarchy, so ``/etc`` is
granted entry by entry."""

MAX_OPEN_FILES = 1024
"""``RLIMIT_NOFILE`` (soft) of a confined shell and its programs: one more ``open`` is
``EMFILE`` ("Too many open files") in the program that made it."""

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
"""Device files a confined program reads and writes."""


@dataclass(frozen=True)
class Ruleset:
    """What the kernel is told: paths readable (and executable), paths writable (every file
    right but device nodes), device files read-write, and whether the network is closed."""

    read: tuple[str, ...]
    write: tuple[str, ...]
    devices: tuple[str, ...]
    network: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": list(self.read),
            "write": list(self.write),
            "devices": list(self.devices),
            "network": self.network,
        }


def workspace_of(sandbox: Sandbox, grants: Grants) -> tuple[str, ...]:
    """The run's workspace met with the agent's grant roots: never wider than either."""
    return Grants._trusted(None, sandbox.workspace).meet(grants).roots or ()


def python_paths() -> tuple[str, ...]:
    """Where the runtime's own Python lives (a confined host still imports lazily)."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix]
    found += [p for p in sys.path if p and os.path.isabs(p)]
    # the directory holding the ``exarch_actors`` package this module was imported through
    # (exarch_actors/runtime/shell/confinement.py): a clone's root, whose runtime/, actors/
    # and cli/ the package's links lead to, or site-packages
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found.append(os.path.dirname(package))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found))


def path_dirs(path: str | None = None) -> tuple[str, ...]:
    """The directories of ``path`` (default: this process's ``PATH`` -- in a shell host the
    fork server's, which ral cannot change) where programs are found, so they can run; an
    entry that is ``/`` or holds the home directory is left out (it would open all of it)."""
    home = os.path.realpath(os.path.expanduser("~"))
    found = []
    for d in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        if not d or not os.path.isabs(d):
            continue
        real = os.path.realpath(d)
        if real == "/" or home == real or home.startswith(real.rstrip("/") + "/"):
            continue
        found.append(real)
    return tuple(found)


def etc_entries(etc: str = "/etc") -> tuple[str, ...]:
    try:
        names = sorted(os.listdir(etc))
    except OSError:
        return ()
    return tuple(os.path.join(etc, n) for n in names if n not in ETC_HIDDEN)


def ruleset(
    sandbox: Sandbox | None,
    grants: Grants,
    *,
    python: Iterable[str] = (),
    etc: Iterable[str] = (),
) -> Ruleset | None:
    """The kernel rules of a shell (None: not confined). ``python`` and ``etc`` are what
    :func:`python_paths` and :func:`etc_entries` read (passed in, so this stays pure)."""
    if sandbox is None or not sandbox.confined:
        return None
    workspace = workspace_of(sandbox, grants)
    scratch = (sandbox.scratch,) if sandbox.scratch else ()
    programs = () if grants.exec is None else tuple(sorted({g.real for g in grants.exec}))
    read = SYSTEM_READ + tuple(etc) + tuple(python) + programs + workspace + scratch
    write = scratch if sandbox.mode is SandboxMode.READ_ONLY else workspace + scratch
    return Ruleset(
        tuple(dict.fromkeys(read)), tuple(dict.fromkeys(write)), DEVICES, sandbox.network
    )


def confined_line(sandbox: Sandbox | None) -> str | None:
    """The sandbox's line for the model's first turn, or None when the shell is unconfined."""
    return sandbox.describe() if sandbox is not None and sandbox.confined else None


def refusal_note(sandbox: Sandbox | None, error: BaseException) -> str:
    """What a ral error adds to a kernel's ``EACCES``/``EPERM`` in a confined shell: the
    sandbox refused it, not the file's permissions (empty otherwise)."""
    if sandbox is None or not sandbox.confined or not isinstance(error, PermissionError):
        return ""
    return f" (outside the sandbox: {sandbox.mode.value}; docs/security.md)"


def check_mode(mode: SandboxMode, abi: int) -> None:
    """Refuse a confined mode the kernel cannot enforce (``abi`` 0: no Landlock)."""
    if mode is not SandboxMode.FULL_ACCESS and abi < 1:
        raise SandboxUnavailable(
            f"this kernel has no Landlock, so --sandbox {mode.value} cannot be enforced; "
            "pass --sandbox full-access to run unconfined"
        )


__all__ = [
    "MODES",
    "Ruleset",
    "Sandbox",
    "SandboxMode",
    "SandboxUnavailable",
    "check_mode",
    "confined_line",
    "default_mode",
    "refusal_note",
    "ruleset",
    "workspace_of",
]
