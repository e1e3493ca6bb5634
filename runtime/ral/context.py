"""The dynamic context of a session: cwd, environment and grants; and the protocols of the two
services a session is given: the desk (agent verbs) and the worker backend (``spawn``).

The context is per session, survives between runs and is part of the snapshot (``to_dict`` /
``from_dict`` are plain JSON/msgpack-able data). Grants (``runtime/ral/grants.py``) only ever
narrow: :meth:`Grants.meet` keeps what both sides allow, so a child agent can never gain a
capability its parent lacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.credentials import DEFAULT as DEFAULT_SECRETS
from exarch_actors.runtime.ral.errors import DeskRefusal
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.ral.values import Closure, WorkerHandle
from exarch_actors.runtime.shell.confinement import Sandbox


@dataclass
class DynamicContext:
    """cwd, environment and grants: mutated by ``cd``/``setenv``, kept between runs.

    The environment starts as this process's without its secrets (``runtime/credentials.py``:
    the provider's keys never reach a shell, its programs or its snapshot)."""

    cwd: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=lambda: DEFAULT_SECRETS.scrub(os.environ))
    grants: Grants = field(default_factory=lambda: Grants.ALL)
    sandbox: Sandbox | None = None
    """The kernel confinement the shell's host enters (``runtime/shell/confinement.py``):
    decided by the fleet, never changed by ral; None is none."""

    def copy(self) -> DynamicContext:
        return DynamicContext(self.cwd, dict(self.env), self.grants, self.sandbox)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "cwd": self.cwd,
            "env": dict(self.env),
            "grants": self.grants.to_dict(),
        }
        if self.sandbox is not None:
            d["sandbox"] = self.sandbox.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DynamicContext:
        return cls(
            cwd=str(d["cwd"]),
            env={str(k): str(v) for k, v in dict(d.get("env") or {}).items()},
            grants=Grants.from_dict(dict(d.get("grants") or {})),
            sandbox=Sandbox.from_dict(d.get("sandbox")),
        )


@runtime_checkable
class Desk(Protocol):
    """Answers agent verbs outside the shell. Only advertised verbs are bound in ral."""

    def verbs(self) -> frozenset[str]: ...

    def call(self, verb: str, args: list[Any]) -> Any:
        """Return a ral value, or raise :class:`DeskRefusal` (reported as a ral error)."""
        ...


@runtime_checkable
class WorkerBackend(Protocol):
    """Runs detached workers: :class:`runtime.ral.workers.ThreadWorkers` in the REPL, OS
    processes owned by the control side in a shell host."""

    def spawn(self, closure: Closure, ctx: DynamicContext, scope: CancelScope) -> WorkerHandle: ...

    def await_(self, handle: WorkerHandle, scope: CancelScope) -> Any:
        """The worker's value; re-raises its ral error; raises Cancelled if ``scope`` trips."""
        ...

    def settled(self, handle: WorkerHandle) -> bool:
        """Whether the worker has finished (value, error or cancellation), without waiting and
        without claiming it: its result is still ``await``'s, or still told at the turn's end."""
        ...

    def cancel(self, handle: WorkerHandle) -> None: ...


AGENT_VERBS = frozenset(
    {
        "agent",
        "message",
        "agent-cancel",
        "agent-wait",
        "agent-result",
        "reply",
        "schedule",
        "unschedule",
        "pin",
        "unpin",
    }
)
"""The agent verbs, answered by the desk (docs/language.md, Agent verbs)."""

__all__ = ["AGENT_VERBS", "Desk", "DeskRefusal", "DynamicContext", "Grants", "WorkerBackend"]
