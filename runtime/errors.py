"""Typed refusals, named by the state they report.

Every refusal the runtime hands a caller is one of these: it says what state refused and what to
do next. None of them is a cancellation (see :class:`runtime.cancel.Cancelled`).
"""

from __future__ import annotations

from typing import Any


class ExarchError(Exception):
    """Base of every typed refusal.

    Picklable with its fields whatever its constructor takes (an agent process re-raises the
    refusal the control side raised, ``actors/agent_process.py``): rebuilt from its type, its
    message and its attributes, never by calling ``__init__`` again."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


def _rebuilt(cls: type[ExarchError], args: tuple[Any, ...], state: dict[str, Any]) -> ExarchError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InboxFull(ExarchError):
    """A quota-checked inbox source, or the inbox as a whole, is at its cap."""

    def __init__(
        self, source: str, cap: int, *, total: bool = False, recipient: str | None = None
    ) -> None:
        self.source = source
        self.cap = cap
        self.total = total
        self.recipient = recipient
        which = "total" if total else f"source {source}"
        who = f" of {recipient}" if recipient else ""
        super().__init__(
            f"inbox full: the inbox{who} holds its cap of {cap} for {which}; "
            "retry after the recipient drains its queue"
        )


class NameTaken(ExarchError):
    """A live agent already holds this name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"name taken: a live agent is already named {name!r}; choose another name")


class NameUsed(ExarchError):
    """A child of this name already ran in this run: the spawn journal keys children by name,
    so a second child under the same name could never be settled."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"name used: a child named {name!r} already ran in this run; choose another name"
        )


class SpawnFailed(ExarchError):
    """A child was registered but could not be admitted or started; it was torn down, its slot
    (if the journal opened one) settled ``down``, and nobody waits for it."""

    def __init__(self, name: str, cause: BaseException) -> None:
        self.name = name
        self.cause = cause
        super().__init__(f"spawn failed: {name!r} could not be started ({cause}); it never ran")


class UnknownAgent(ExarchError):
    """No live agent has this name (it never existed or has already ended)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown agent: no live agent is named {name!r}")


class FuelExhausted(ExarchError):
    """The agent has no spawn fuel left; the delegation chain bottoms out here."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        super().__init__(
            f"spawn fuel exhausted: {agent} is at the depth limit; "
            "do the work in this agent instead"
        )


class GrantUnresolvable(ExarchError):
    """A grant cannot be made: a program that is not an executable file on PATH, or a root that
    is not a directory. Raised when the grant is made (the command line exits 2), never later."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"cannot grant {what}: {reason}")


class SnapshotRefused(ExarchError):
    """A snapshot file is corrupt or of a foreign format version; the previous one is kept."""


class ScenarioError(ExarchError):
    """A scenario file cannot be used; the message carries the file position."""
