"""Per-shell resource limits: memory, live workers, and the largest binding a snapshot holds.

A runaway script must be the shell's problem, never the machine's: a 2 GiB string binding once
drove the shells to 8 GiB RSS and wrote a 2 GiB snapshot, and 300 ``spawn { sleep 20 }`` made
299 processes. Each limit has a default and a flag on ``run``/``fleet``/``chat``
(``--shell-memory``, ``--max-workers``, ``--max-binding-bytes``), travels in
:class:`actors.fleet.FleetConfig` to every shell actor, and is enforced where the resource is
spent:

- **memory** (``RLIMIT_DATA``, soft limit) is set first thing in every shell host and worker
  process; an allocation past it raises ``MemoryError``. Inside a native (where nothing is
  half-done) that is an ordinary ral error ``out of memory: ...``, catchable by ``try``;
  anywhere else the host reports a panic and the call is rolled back. External programs a shell
  starts keep the same limit, each for itself (a program's memory bomb ends in its own
  ``MemoryError`` / failed ``malloc``, reported on its stderr).
- **live workers** (running ``spawn`` workers per shell): one more ``spawn`` is a ral error.
- **processes** (``--shell-procs``): the agent's shell host, its workers and every program they
  started share one pids cgroup capped at this many processes at once
  (``actors/pid_cgroup.py``); one more ``fork`` is ``EAGAIN`` in the program that made it, and
  the call's result says the cap was hit. Where no pids cgroup is writable there is no cap.
- **binding bytes** (a binding's encoding, which is what the durable snapshot holds): a larger
  ``let`` is refused with a ral error naming the binding, and nothing is bound.

Why ``RLIMIT_DATA`` and not ``RLIMIT_AS`` (measured on the 2-core dev box, CPython 3.11, a fresh
shell host): VmSize 101 MiB, VmData 23 MiB, RSS 19.5 MiB, VmPeak 164 MiB. Address space counts
reservations that are never touched -- glibc reserves a 64 MiB malloc arena per thread that
allocates, plus each thread's 8 MiB stack -- so an ``RLIMIT_AS`` would fail thread starts long
before the values grew. ``RLIMIT_DATA`` counts only writable private memory: heap, anonymous
mappings and stacks.

Why 2 GiB (:data:`DEFAULT_SHELL_MEMORY`): committing a binding of the default largest size
(256 MiB) peaks at ~1.1 GiB RSS and 1.4 GiB VmPeak in the host (the value, the value it was
built from, its encoding, and the snapshot frame carrying it), so 1 GiB would refuse bindings
the binding limit allows; 2 GiB leaves headroom and still stops a runaway at a quarter of what
the 2 GiB string cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.shell.confinement import SandboxMode, default_mode

MiB = 1 << 20
GiB = 1 << 30

DEFAULT_SHELL_MEMORY = 2 * GiB
"""Soft ``RLIMIT_DATA`` of every shell host and worker process (see the module docstring)."""

DEFAULT_MAX_WORKERS = 64
"""Running workers one shell may have at once."""

DEFAULT_MAX_PROCESSES = 512
"""Processes one agent's shell host, workers and programs may have at once. A shell host with
its 64 workers (:data:`DEFAULT_MAX_WORKERS`) is 65; a build that runs ``make -j`` with a
compiler per core stays far below; a fork bomb stops here instead of at the machine's
``pid_max`` (4,194,304 on the dev box, where it takes every other agent down first)."""

DEFAULT_MAX_BINDING_BYTES = 256 * MiB
"""The largest binding encoding a shell keeps (and so the largest a snapshot holds)."""

MIN_PROCESSES = 2
"""The shell host itself and one program."""

MIN_SHELL_MEMORY = 64 * MiB
"""A smaller memory limit cannot hold a shell host at all (23 MiB of data before any value)."""


class BadLimit(ExarchError):
    """A limit given on the command line or in a config is not a usable value."""


@dataclass(frozen=True)
class ShellLimits:
    """The limits every shell of a fleet runs under. ``memory_bytes=None``: no memory limit."""

    memory_bytes: int | None = DEFAULT_SHELL_MEMORY
    max_workers: int = DEFAULT_MAX_WORKERS
    max_binding_bytes: int = DEFAULT_MAX_BINDING_BYTES
    sandbox: SandboxMode | None = None
    """The kernel confinement of every shell (``--sandbox``; ``runtime/shell/confinement.py``).
    None: not chosen -- the command resolves it by provider (:meth:`resolved`); a fleet given
    None runs unconfined."""
    max_processes: int = DEFAULT_MAX_PROCESSES
    """Processes at once per agent (``--shell-procs``; see the module docstring)."""

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes < MIN_SHELL_MEMORY:
            raise BadLimit(
                f"shell memory {format_size(self.memory_bytes)} is below the "
                f"{format_size(MIN_SHELL_MEMORY)} a shell host needs to start"
            )
        if self.max_workers < 1:
            raise BadLimit(f"max workers must be at least 1, got {self.max_workers}")
        if self.max_binding_bytes < 1:
            raise BadLimit(f"max binding bytes must be at least 1, got {self.max_binding_bytes}")
        if self.max_processes < MIN_PROCESSES:
            raise BadLimit(
                f"shell processes must be at least {MIN_PROCESSES} (a shell host and one "
                f"program), got {self.max_processes}"
            )

    def to_json(self) -> dict[str, int | str | None]:
        return {
            "shellMemory": self.memory_bytes,
            "maxWorkers": self.max_workers,
            "maxBindingBytes": self.max_binding_bytes,
            "sandbox": None if self.sandbox is None else self.sandbox.value,
            "maxProcesses": self.max_processes,
        }

    def resolved(self, provider: str) -> ShellLimits:
        """These limits with the sandbox mode decided: the one chosen, else the provider's
        default (:func:`runtime.shell.confinement.default_mode`)."""
        if self.sandbox is not None:
            return self
        return replace(self, sandbox=default_mode(provider))

    @classmethod
    def from_json(cls, data: object) -> ShellLimits:
        """The inverse of :meth:`to_json`; missing keys take the defaults (a run recorded
        before ``--sandbox`` existed was unconfined, and resumes so)."""
        if not isinstance(data, dict):
            return cls()
        memory = data.get("shellMemory", DEFAULT_SHELL_MEMORY)
        return cls(
            memory_bytes=None if memory is None else int(memory),
            max_workers=int(data.get("maxWorkers", DEFAULT_MAX_WORKERS)),
            max_binding_bytes=int(data.get("maxBindingBytes", DEFAULT_MAX_BINDING_BYTES)),
            sandbox=None if data.get("sandbox") is None else SandboxMode(str(data["sandbox"])),
            max_processes=int(data.get("maxProcesses", DEFAULT_MAX_PROCESSES)),
        )


_UNITS = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]+)\s*(?:([kmgt])i?b?|b)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"512M"``, ``"2GiB"``, ``"1g"``, ``"65536"`` -> bytes (binary units). :class:`BadLimit`
    for anything else."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise BadLimit(f"not a size: {text!r} (examples: 65536, 512M, 2GiB)")
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def format_size(n: int) -> str:
    """The largest binary unit that shows ``n`` exactly (``2 GiB``, ``1536 KiB``, ``10 bytes``)."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
