"""The dynamic context of a session: cwd, environment and grants; and the desk protocol.

The context is per session, survives between runs and is part of the snapshot (``to_dict`` /
``from_dict`` are plain JSON/msgpack-able data). Grants only ever narrow: :meth:`Grants.meet`
keeps what both sides allow, so a child agent can never gain a capability its parent lacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from runtime.ral.errors import DeskRefusal


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class Grants:
    """Which programs may be executed and which filesystem roots file builtins may touch.

    ``None`` means everything. ``exec`` names are matched against the head as written and against
    the resolved absolute path; ``roots`` are compared after ``realpath`` so symlinks cannot
    escape.
    """

    exec: frozenset[str] | None = None
    roots: tuple[str, ...] | None = None

    ALL: ClassVar[Grants]

    def __post_init__(self) -> None:
        if self.roots is not None:
            object.__setattr__(
                self, "roots", tuple(dict.fromkeys(os.path.realpath(r) for r in self.roots))
            )
        if self.exec is not None and not isinstance(self.exec, frozenset):
            object.__setattr__(self, "exec", frozenset(self.exec))

    def meet(self, other: Grants) -> Grants:
        """The narrowing of both: never allows anything either side refuses."""
        if self.exec is None:
            ex = other.exec
        elif other.exec is None:
            ex = self.exec
        else:
            ex = self.exec & other.exec
        if self.roots is None:
            roots = other.roots
        elif other.roots is None:
            roots = self.roots
        else:
            mine = [r for r in self.roots if any(_within(r, o) for o in other.roots)]
            theirs = [o for o in other.roots if any(_within(o, r) for r in self.roots)]
            roots = tuple(dict.fromkeys(mine + theirs))
        return Grants(ex, roots)

    def allows_exec(self, name: str, resolved: str | None = None) -> bool:
        if self.exec is None:
            return True
        if name in self.exec:
            return True
        return resolved is not None and resolved in self.exec

    def allows_path(self, path: str) -> bool:
        """Whether ``path`` (absolute) lies inside a granted root, after resolving symlinks."""
        if self.roots is None:
            return True
        real = os.path.realpath(path)
        return any(_within(real, r) for r in self.roots)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exec": None if self.exec is None else sorted(self.exec),
            "roots": None if self.roots is None else list(self.roots),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grants:
        ex = d.get("exec")
        roots = d.get("roots")
        return cls(
            None if ex is None else frozenset(ex),
            None if roots is None else tuple(roots),
        )


Grants.ALL = Grants()


@dataclass
class DynamicContext:
    """cwd, environment and grants: mutated by ``cd``/``setenv``, kept between runs."""

    cwd: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    grants: Grants = field(default_factory=lambda: Grants.ALL)

    def copy(self) -> DynamicContext:
        return DynamicContext(self.cwd, dict(self.env), self.grants)

    def to_dict(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "env": dict(self.env), "grants": self.grants.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DynamicContext:
        return cls(
            cwd=str(d["cwd"]),
            env={str(k): str(v) for k, v in dict(d.get("env") or {}).items()},
            grants=Grants.from_dict(dict(d.get("grants") or {})),
        )


@runtime_checkable
class Desk(Protocol):
    """Answers agent verbs outside the shell. Only advertised verbs are bound in ral."""

    def verbs(self) -> frozenset[str]: ...

    def call(self, verb: str, args: list[Any]) -> Any:
        """Return a ral value, or raise :class:`DeskRefusal` (reported as a ral error)."""
        ...


AGENT_VERBS = frozenset(
    {"agent", "message", "agent-cancel", "reply", "schedule", "unschedule", "pin", "unpin"}
)
"""The verbs RAL.md assigns to the desk."""

__all__ = ["AGENT_VERBS", "Desk", "DeskRefusal", "DynamicContext", "Grants"]
