"""What a shell call returns: the :class:`CallResult` of one ral tool call, the read-only
:class:`ShellProbe`, and the shell's errors. Every value here is frozen.

(``CallResult`` is the shell's own record of a call; ``runtime.messages.ToolResult`` is the
model-visible message a digest of it becomes.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.events import Notice


class ShellBootFailed(ExarchError):
    """A shell host process could not be started or could not restore its snapshot."""


class ShellClosed(ExarchError):
    """The shell was closed; start a new one."""


@dataclass(frozen=True)
class CallResult:
    """What one ral tool call returned, as the agent sees it."""

    value: str
    """The value's display rendering (``render``)."""
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    """``line:col message`` of the ral error, the cancellation, or the panic; None on success."""
    error_kind: str | None = None
    """``syntax`` | ``elaboration`` | ``runtime`` | ``cancelled`` | ``panic``."""
    referenced: frozenset[str] = frozenset()
    defined: tuple[str, ...] = ()
    compiled: bool = True
    rolled_back: bool = False
    epoch: int = 0
    notices: tuple[Notice, ...] = ()
    """Notices this call produced (also delivered to the ``notice_sink`` when one is installed)."""
    host_pid: int | None = None
    """The shell host that holds the state after this call (a new one after a rollback)."""
    host_started_at: float | None = None
    """That host's create time (``psutil``'s), read once per host: with the pid it names the
    process without blaming a reused pid."""

    @classmethod
    def of(cls, **fields: Any) -> CallResult:
        """``CallResult(**fields)``, the equal value, made without the frozen dataclass's
        ``object.__setattr__`` per field (13 fields: ~1.7 us against ~0.4 us, of a ~40 us
        trivial round trip). Unknown or missing fields are refused as the constructor does."""
        if "value" not in fields or not fields.keys() <= _CALL_FIELDS.keys():
            return cls(**fields)  # the constructor's own TypeError
        obj = object.__new__(cls)
        d = obj.__dict__
        d.update(_CALL_FIELDS)
        d.update(fields)
        return obj

    @classmethod
    def answered(
        cls, value: str, epoch: int, host_pid: int, started_at: float | None
    ) -> CallResult:
        """:meth:`of` for a call that returned ``value`` and nothing else (no output, error,
        name or notice): what a trivial call returns, built with no keyword map at all."""
        obj = object.__new__(cls)
        d = obj.__dict__
        d.update(_CALL_FIELDS)
        d["value"] = value
        d["epoch"] = epoch
        d["host_pid"] = host_pid
        d["host_started_at"] = started_at
        return obj


def _defaults(cls: type) -> dict[str, Any]:
    """Every field's default (``value``'s: ""), for :meth:`CallResult.of`; a field without a
    plain default would need its own factory there, so it is refused at import."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "value":
            out["value"] = ""
        elif f.default is dataclasses.MISSING:
            raise TypeError(f"CallResult.of needs a plain default for {f.name}")
        else:
            out[f.name] = f.default
    return out


_CALL_FIELDS = _defaults(CallResult)


@dataclass(frozen=True)
class ShellProbe:
    """Read-only figures for the /resources card; taking them renews nothing."""

    epoch: int
    running_workers: int
    settled_workers: int
    nearest_worker_reap_calls: int | None
    nearest_worker_backstop_secs: float | None
    live_bindings: int
    baseline_bindings: int
    pinned_bindings: int
    nearest_binding_expiry_calls: int | None
    bytes_held: int
    """Encoded bytes of the leased (model-written) bindings."""
    snapshot_bindings_bytes: int
    """Encoded bytes of every session binding in the durable snapshot."""
    host_pid: int | None = None
