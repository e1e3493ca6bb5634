"""The disk warning latch: report and warn only, never refuse or delete.

- With no ceiling configured (the default) :meth:`DiskWarn.check` returns at once: nothing is
  walked, ever (a test injects a walker that fails if called).
- With a ceiling, it measures only when the agent's ral-call epoch has advanced at least
  DISK_WARN_CHECK_INTERVAL (32) calls since the last measurement. The check runs at drive's top,
  where the epoch may have jumped by many calls in one turn, so the rule is "32 calls since the
  last walk", not "epoch divisible by 32" (a modulo rule would miss every boundary a turn jumps
  across).
- A measurement over the ceiling yields one :class:`DiskWarning` and latches; further
  measurements stay silent until one finds the total back under (which unlatches), so there is
  one warning per excursion, not one per boundary.

Nothing here rotates or deletes anything.

**Each byte once.** An agent's scratch directory lives inside the session directory
(``scratch/<name>``), so summing the two walks would count the scratch twice.
:func:`disk_usage` walks each labelled root without the other roots nested inside it, so its
figures sum to the bytes of the union; :class:`DiskWarn` measures only the outermost roots. The
warning and the ``/resources`` disk rows therefore agree with ``du`` on the same directories.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exarch_actors.runtime.constants import DISK_WARN_CHECK_INTERVAL


def dir_size(path: str | os.PathLike[str], exclude: Iterable[str | os.PathLike[str]] = ()) -> int:
    """Bytes of regular files under ``path`` (symlinks not followed; vanished entries skipped).

    A missing path is 0. Iterative (no recursion limit on deep trees). Directories in
    ``exclude`` (compared as absolute paths) are not descended into.
    """
    total = 0
    skip = {os.path.abspath(e) for e in exclude}
    stack = [os.fspath(path)]
    while stack:
        top = stack.pop()
        if skip and os.path.abspath(top) in skip:
            continue
        try:
            it = os.scandir(top)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            try:
                st = os.stat(top, follow_symlinks=False)
            except OSError:
                continue
            total += st.st_size if not os.path.isdir(top) else 0
            continue
        with it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


def _within(inner: Path, outer: Path) -> bool:
    return inner != outer and inner.is_relative_to(outer)


def outermost(roots: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """``roots`` without duplicates and without any root nested inside another: walking these
    counts every byte under ``roots`` exactly once."""
    absolute = [Path(os.path.abspath(r)) for r in roots]
    kept: list[Path] = []
    for r in absolute:
        if r in kept or any(_within(r, o) for o in absolute):
            continue
        kept.append(r)
    return kept


def disk_usage(
    roots: Mapping[str, str | os.PathLike[str]],
    walker: Callable[..., int] = dir_size,
) -> dict[str, int]:
    """Bytes under each labelled root, a root nested inside another counted under its own label
    only, and a repeated root counted once (under its first label; later labels read 0). The
    values sum to the bytes of the union of the roots."""
    absolute = {label: Path(os.path.abspath(r)) for label, r in roots.items()}
    out: dict[str, int] = {}
    seen: set[Path] = set()
    for label, root in absolute.items():
        if root in seen:
            out[label] = 0
            continue
        seen.add(root)
        nested = {r for r in absolute.values() if _within(r, root)}
        out[label] = walker(root, exclude=nested) if nested else walker(root)
    return out


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``; exact below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class DiskWarning:
    """One excursion over the ceiling: the SystemNote the agent emits (transcript and TUI)."""

    total_bytes: int
    ceiling_bytes: int
    epoch: int

    @property
    def text(self) -> str:
        return (
            f"disk: the session directory and scratch hold {human_bytes(self.total_bytes)}, over "
            f"the configured ceiling of {human_bytes(self.ceiling_bytes)}. Report only: nothing "
            "is rotated or deleted; free space or raise disk_warn_bytes."
        )


class DiskWarn:
    """The per-agent latch. ``roots`` are the session log dir and the scratch dir; a root
    nested inside another is not walked again (each byte counts once)."""

    def __init__(
        self,
        ceiling_bytes: int | None,
        roots: Sequence[str | os.PathLike[str]],
        *,
        walker: Callable[[Path], int] = dir_size,
        interval: int = DISK_WARN_CHECK_INTERVAL,
    ) -> None:
        if ceiling_bytes is not None and ceiling_bytes < 0:
            raise ValueError(f"disk_warn_bytes must be >= 0, got {ceiling_bytes}")
        if interval < 1:
            raise ValueError(f"interval must be >= 1, got {interval}")
        self.ceiling_bytes = ceiling_bytes
        self.roots = tuple(Path(r) for r in roots)
        self._walker = walker
        self.interval = interval
        self._next_epoch = interval
        self.latched = False
        self.last_total: int | None = None

    @property
    def configured(self) -> bool:
        return self.ceiling_bytes is not None

    def check(self, epoch: int) -> DiskWarning | None:
        """Call at each ready boundary with the agent's ral-call epoch."""
        if self.ceiling_bytes is None or epoch < self._next_epoch:
            return None
        self._next_epoch = epoch + self.interval
        total = sum(self._walker(r) for r in outermost(self.roots))
        self.last_total = total
        if total > self.ceiling_bytes:
            if self.latched:
                return None
            self.latched = True
            return DiskWarning(total, self.ceiling_bytes, epoch)
        self.latched = False
        return None
