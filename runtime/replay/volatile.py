"""Volatile parts of a ral result: what may differ between a run and its replay without the
workflow having changed, blanked by a small, named rule set before results are compared.

Rules (``exarch-actors replay --ignore NAME``, repeatable; ``all`` names every one):

- ``time`` — ISO-8601 dates and date-times (``2024-05-01``, ``2024-05-01T10:00:00.123Z``,
  ``2024-05-01 10:00:00+02:00``) and clock times (``10:00:00``, ``10:00:00.5``) become ``<time>``;
- ``pid`` — a number after the word ``pid`` or ``ppid`` (any case; ``pid 42``, ``pid=42``,
  ``"pid": 42``) becomes ``<pid>``;
- ``tmp`` — the first component under a temporary directory (``/tmp``, ``/var/tmp``,
  ``$TMPDIR``), e.g. the random ``tmpk3j_x2`` of ``/tmp/tmpk3j_x2/out.txt``, becomes ``<tmp>``
  (what follows it is kept: ``<tmp>/out.txt``).

``--ignore-regex RE`` (repeatable) blanks every match of RE as ``<ignored>``. One rule is always
on: the two session directories (the recorded run's and the replay's, each ``$EXARCH_SCRATCH``
lives in its own) become ``<session>``; they differ by construction, not because the workflow
changed. So does a Ray node's copy of the recorded session (``copies``: its name, the same on
every node; any absolute path ending in it), where that run's hosts kept their files and scratch.

Invariants (property-tested): normalising is idempotent; text with none of these parts is left
unchanged; two texts that differ only in a part a rule blanks normalise to the same text. The
session roots are replaced first, so a session under ``/tmp`` reads ``<session>``, never
``<tmp>``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field

from exarch_actors.runtime.errors import ExarchError

_DATE = r"\d{4}-\d{2}-\d{2}"
_CLOCK = r"\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
_ZONE = r"(?:Z|[+-]\d{2}:?\d{2})?"
_TIME = re.compile(
    rf"(?<![\w.]){_DATE}(?:[T ]{_CLOCK}{_ZONE})?(?!\w)|(?<![\w:.]){_CLOCK}{_ZONE}(?!\w)"
)
_PID = re.compile(r"(?i)(\bp?pid\b[\"']?\s*[:=]?\s*)\d+")

RULES = ("time", "pid", "tmp")
"""The named rules, in the order they apply (after the session roots)."""


class UnknownRule(ExarchError):
    """An ``--ignore`` name that is not a rule of :data:`RULES` (nor ``all``)."""


def rule_names(names: Iterable[str]) -> frozenset[str]:
    """The rules ``names`` select; ``all`` selects every one. Raises :class:`UnknownRule`."""
    out: set[str] = set()
    for name in names:
        if name == "all":
            out.update(RULES)
        elif name in RULES:
            out.add(name)
        else:
            raise UnknownRule(
                f"unknown volatile rule {name!r}: expected one of {', '.join(RULES)} or all"
            )
    return frozenset(out)


def temp_dirs() -> tuple[str, ...]:
    """The temporary directories the ``tmp`` rule knows, longest first (a nested one wins)."""
    dirs = {"/tmp", "/var/tmp", tempfile.gettempdir()}
    env = os.environ.get("TMPDIR")
    if env:
        dirs.add(env)
    cleaned = {d.rstrip("/") for d in dirs if d.rstrip("/")}
    return tuple(sorted(cleaned, key=len, reverse=True))


@dataclass(frozen=True)
class Normaliser:
    """Blanks the volatile parts of a text. ``roots`` are the session directories."""

    rules: frozenset[str] = frozenset()
    patterns: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    """Names of node copies of a session directory (``runtime/state/record_mirror.py``)."""
    tmp: tuple[str, ...] = field(default_factory=temp_dirs)

    def __post_init__(self) -> None:
        unknown = set(self.rules) - set(RULES)
        if unknown:
            raise UnknownRule(f"unknown volatile rule(s): {', '.join(sorted(unknown))}")
        try:
            compiled = tuple(re.compile(p) for p in self.patterns)
        except re.error as e:
            raise UnknownRule(f"--ignore-regex {e.pattern!r}: {e}") from None
        object.__setattr__(self, "_compiled", compiled)
        roots = sorted({r.rstrip("/") for r in self.roots if r.rstrip("/")}, key=len, reverse=True)
        object.__setattr__(self, "_roots", tuple(roots))
        names = "|".join(re.escape(c) for c in self.copies if c)
        copies = re.compile(rf"(?:/[^/\s\"'`]+)*/(?:{names})(?![\w.-])") if names else None
        object.__setattr__(self, "_copies", copies)
        tmp = "|".join(re.escape(d) for d in self.tmp)
        object.__setattr__(
            self,
            "_tmp",
            re.compile(rf"(?<![\w/])(?:{tmp})/(?!<)[^/\s\"'`)\]}},;:]+") if tmp else None,
        )

    def __call__(self, text: str) -> str:
        for root in self.__dict__["_roots"]:
            text = text.replace(root, "<session>")
        copies = self.__dict__["_copies"]
        if copies is not None:
            text = copies.sub("<session>", text)
        if "time" in self.rules:
            text = _TIME.sub("<time>", text)
        if "pid" in self.rules:
            text = _PID.sub(r"\1<pid>", text)
        tmp = self.__dict__["_tmp"]
        if "tmp" in self.rules and tmp is not None:
            text = tmp.sub("<tmp>", text)
        for pattern in self.__dict__["_compiled"]:
            text = pattern.sub("<ignored>", text)
        return text

    def describe(self) -> list[str]:
        """The rules in force, for the report: ``session`` first, then the named ones."""
        return ["session", *(r for r in RULES if r in self.rules)] + [
            f"regex:{p}" for p in self.patterns
        ]
