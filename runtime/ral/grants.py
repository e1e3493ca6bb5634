"""Grants: which programs a ral session may run and which filesystem roots its file builtins may
touch; and the fleet's policy that narrows them per agent.

Invariants:

- An exec grant is resolved once, when it is made, to the absolute path of an executable file: a
  bare name on the granting process's PATH, a path against its cwd. A granted program runs
  exactly that file under any head that reaches it: a bare head finds the grant by name (the
  session's own ``PATH`` is never consulted), a head with a ``/`` runs the granted file whose
  real path it names. A ``PATH``, a file or a link changed inside ral never widens what runs.
- A root is stored as a real path when it is granted and never re-resolved afterwards
  (:meth:`Grants.from_dict`, :meth:`Grants.meet`): a root later replaced by a link does not move
  the grant. Confining a path to the roots is :mod:`runtime.ral.confine`.
- :meth:`Grants.meet` only narrows: whatever the meet allows, both sides allow. A child's grants
  are its parent's met with the fleet's (:meth:`GrantPolicy.for_agent`), so no fork widens them.
- ``mcp`` names the MCP servers an agent may call (``runtime/mcp``); it narrows by
  intersection like ``exec``, so a child never reaches a server its parent could not.
- ``None`` means unrestricted (the default); an empty collection means nothing at all.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exarch_actors.runtime.errors import GrantUnresolvable


def _both(a: frozenset[Any] | None, b: frozenset[Any] | None) -> frozenset[Any] | None:
    """What both sets allow (None: unrestricted)."""
    if a is None:
        return b
    return a if b is None else a & b


def within(path: str, root: str) -> bool:
    """Whether the absolute ``path`` is ``root`` or lies below it (plain text: both are real)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True, order=True)
class ExecGrant:
    """One granted program: the bare ``name`` it answers to, the absolute ``path`` that runs, and
    that path's ``real`` path at grant time (what a head with a ``/`` must resolve to)."""

    name: str
    path: str
    real: str

    def to_list(self) -> list[str]:
        return [self.name, self.path, self.real]


def resolve_program(
    spec: str, *, search_path: str | None = None, cwd: str | None = None
) -> ExecGrant:
    """Make one exec grant: ``spec`` is a bare name (looked up on ``search_path``, default this
    process's ``PATH``) or a path (absolute, or relative to ``cwd``). Raises
    :class:`GrantUnresolvable` when no executable file answers."""
    cwd = cwd or os.getcwd()
    what = f"exec {spec}"
    if not spec or "\0" in spec:
        raise GrantUnresolvable(what, "a program name cannot be empty")
    if "/" in spec:
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(spec)))
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise GrantUnresolvable(what, f"{path} is not an executable file")
    else:
        if search_path is None:
            search_path = os.environ.get("PATH", os.defpath)
        found = shutil.which(spec, path=search_path)
        if found is None:
            hint = ""
            if spec in ("*", "all") or any(c in spec for c in "*?["):
                hint = " (there is no wildcard: name each program; no exec grant means every one)"
            raise GrantUnresolvable(what, f"not found on PATH{hint}")
        path = os.path.normpath(os.path.join(cwd, found))
    return ExecGrant(os.path.basename(path), path, os.path.realpath(path))


@dataclass(frozen=True)
class Grants:
    """Which programs may run (``exec``), where file builtins may reach (``roots``) and which MCP
    servers ``mcp`` may call (``mcp``).

    Build with :meth:`granting` (names and directories, resolved and checked now). The plain
    constructor takes resolved :class:`ExecGrant` entries and makes each root a real path."""

    exec: frozenset[ExecGrant] | None = None
    roots: tuple[str, ...] | None = None
    mcp: frozenset[str] | None = None
    _by_name: dict[str, ExecGrant] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    ALL: ClassVar[Grants]

    def __post_init__(self) -> None:
        if self.roots is not None:
            roots = tuple(dict.fromkeys(os.path.realpath(r) for r in self.roots))
            object.__setattr__(self, "roots", roots)
        if self.mcp is not None and not isinstance(self.mcp, frozenset):
            object.__setattr__(self, "mcp", frozenset(self.mcp))
        self._index()

    def _index(self) -> None:
        if self.exec is None:
            return
        if not isinstance(self.exec, frozenset):
            object.__setattr__(self, "exec", frozenset(self.exec))
        by_name: dict[str, ExecGrant] = {}
        for g in sorted(self.exec):  # sorted: of two paths to one file, the same one runs
            if not isinstance(g, ExecGrant):
                raise TypeError(f"exec grants are resolved ExecGrant entries, not {g!r}")
            other = by_name.setdefault(g.name, g)
            if other.real != g.real:  # a bare name must mean one file, or a meet could swap it
                raise GrantUnresolvable(
                    f"exec {g.path}", f"{other.path} is already granted as {g.name}"
                )
        self._by_name.update(by_name)

    @classmethod
    def _trusted(
        cls,
        ex: Iterable[ExecGrant] | None,
        roots: Iterable[str] | None,
        mcp: Iterable[str] | None = None,
    ) -> Grants:
        """Grants from already-resolved parts: nothing is looked up or re-resolved."""
        g = object.__new__(cls)
        object.__setattr__(g, "exec", None if ex is None else frozenset(ex))
        object.__setattr__(g, "roots", None if roots is None else tuple(dict.fromkeys(roots)))
        object.__setattr__(g, "mcp", None if mcp is None else frozenset(mcp))
        object.__setattr__(g, "_by_name", {})
        g._index()
        return g

    @classmethod
    def granting(
        cls,
        exec: Iterable[str] | None = None,
        roots: Iterable[str] | None = None,
        *,
        search_path: str | None = None,
        cwd: str | None = None,
        mcp: Iterable[str] | None = None,
    ) -> Grants:
        """Make grants from program names/paths and directories, resolving each once, now.

        Raises :class:`GrantUnresolvable` for a program not found, a root that is not a
        directory, or two different files that would answer to the same bare name."""
        cwd = cwd or os.getcwd()
        entries: list[ExecGrant] | None = None
        if exec is not None:
            entries = []
            for spec in exec:
                entries.append(resolve_program(spec, search_path=search_path, cwd=cwd))
        real_roots: list[str] | None = None
        if roots is not None:
            real_roots = []
            for r in roots:
                full = os.path.realpath(os.path.join(cwd, os.path.expanduser(r)))
                if not r or not os.path.isdir(full):
                    raise GrantUnresolvable(f"root {r}", "not a directory")
                real_roots.append(full)
        return cls._trusted(entries, real_roots, mcp)

    # -- narrowing -------------------------------------------------------------------------
    def meet(self, other: Grants) -> Grants:
        """The narrowing of both: never allows anything either side refuses."""
        ex = _both(self.exec, other.exec)
        if self.roots is None:
            roots = other.roots
        elif other.roots is None:
            roots = self.roots
        else:
            mine = [r for r in self.roots if any(within(r, o) for o in other.roots)]
            theirs = [o for o in other.roots if any(within(o, r) for r in self.roots)]
            roots = tuple(dict.fromkeys(mine + theirs))
        return Grants._trusted(ex, roots, _both(self.mcp, other.mcp))

    # -- questions -------------------------------------------------------------------------
    def program(self, head: str, cwd: str) -> str | None:
        """The absolute path to run for ``head``, or None when it is not granted.

        Only for restricted grants (``exec`` is not None). A bare head is looked up by name; a
        head with a ``/`` must be a granted file (compared by real path), and the granted path
        is what runs, whatever the head resolves to by the time it would be executed."""
        if self.exec is None:
            raise ValueError("program() is for restricted grants; unrestricted heads use PATH")
        if "/" not in head:
            g = self._by_name.get(head)
            return None if g is None else g.path
        real = os.path.realpath(os.path.join(cwd, os.path.expanduser(head)))
        for g in sorted(self.exec):
            if g.real == real:
                return g.path
        return None

    def mcp_server(self, name: str) -> bool:
        """Whether the MCP server ``name`` may be called."""
        return self.mcp is None or name in self.mcp

    def contains(self, real: str) -> bool:
        """Whether the real (link-free, absolute) path ``real`` lies inside a granted root."""
        if self.roots is None:
            return True
        return any(within(real, r) for r in self.roots)

    # -- data ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "exec": None if self.exec is None else [g.to_list() for g in sorted(self.exec)],
            "roots": None if self.roots is None else list(self.roots),
        }
        if self.mcp is not None:  # absent: every server (as files written before MCP say)
            d["mcp"] = sorted(self.mcp)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Grants:
        """Grants as :meth:`to_dict` wrote them; nothing is re-resolved.

        A bare name (how snapshots written before exec grants were resolved recorded them) is
        resolved on this process's PATH, or dropped when it is not found: never wider than the
        name-only grant it replaces."""
        ex = d.get("exec")
        roots = d.get("roots")
        mcp = d.get("mcp")
        entries: list[ExecGrant] | None = None
        if ex is not None:
            entries = []
            for item in ex:
                if isinstance(item, str):
                    try:
                        entries.append(resolve_program(item))
                    except GrantUnresolvable:
                        pass
                else:
                    name, path, real = (str(x) for x in item)
                    entries.append(ExecGrant(name, path, real))
        return cls._trusted(
            entries,
            None if roots is None else [str(r) for r in roots],
            None if mcp is None else [str(m) for m in mcp],
        )

    def describe(self) -> str:
        """One line for people: ``exec: cat, grep; roots: /srv/x`` (``any`` when unrestricted)."""
        ex = "any" if self.exec is None else ", ".join(sorted(g.name for g in self.exec)) or "none"
        roots = "any" if self.roots is None else ", ".join(self.roots) or "none"
        mcp = "" if self.mcp is None else f"; mcp: {', '.join(sorted(self.mcp)) or 'none'}"
        return f"exec: {ex}; roots: {roots}{mcp}"


Grants.ALL = Grants()


@dataclass(frozen=True)
class GrantPolicy:
    """A fleet's authority: ``base`` for every agent (the command line's ``--grant-exec`` /
    ``--grant-root``), narrowed by every ``(pattern, grants)`` of ``agents`` whose pattern is the
    agent's name or a glob matching it (a scenario's ``[grants.PATTERN]`` tables)."""

    base: Grants = field(default_factory=Grants)
    agents: tuple[tuple[str, Grants], ...] = ()

    def for_agent(self, name: str, parent: Grants | None = None) -> Grants:
        """The grants of agent ``name``: its parent's (if any) met with the base and with every
        matching table. A meet of meets: never wider than the parent, the base or any table."""
        g = self.base if parent is None else parent.meet(self.base)
        for pattern, table in self.agents:
            if name == pattern or fnmatch.fnmatchcase(name, pattern):
                g = g.meet(table)
        return g

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base.to_dict(),
            "agents": [[p, g.to_dict()] for p, g in self.agents],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> GrantPolicy:
        if not d:
            return cls()
        return cls(
            Grants.from_dict(dict(d.get("base") or {})),
            tuple((str(p), Grants.from_dict(dict(g))) for p, g in d.get("agents") or ()),
        )


__all__ = ["ExecGrant", "GrantPolicy", "GrantUnresolvable", "Grants", "resolve_program", "within"]
