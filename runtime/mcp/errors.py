"""Why an ``mcp`` call was refused or failed, each named by the state that refused it.

Every one reaches ral as an error carrying its message (``try`` catches it), and crosses an agent
process's channel as itself (:class:`runtime.errors.ExarchError` pickles with its fields).
"""

from __future__ import annotations

from exarch_actors.runtime.errors import ExarchError


class McpServerUnknown(ExarchError):
    """``mcp NAME ...`` names no server the fleet was configured with."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        self.name = name
        listed = ", ".join(known) if known else "none is configured ([mcp.NAME] or --mcp)"
        super().__init__(f"mcp: no server named {name!r} (servers: {listed})")


class NotGranted(ExarchError):
    """The agent's grants exclude this MCP server (``[grants.PATTERN] mcp``, ``--grant-mcp``)."""

    def __init__(self, agent: str, server: str) -> None:
        self.agent = agent
        self.server = server
        super().__init__(
            f"not granted: agent {agent} may not use MCP server {server!r} (its grants exclude "
            "it; a child never gains a server its parent lacks)"
        )


class McpServerUnavailable(ExarchError):
    """The server could not be started or reached (no such program, refused handshake)."""


class McpSdkMissing(McpServerUnavailable):
    """The ``mcp`` SDK is not installed in the Python the control process runs on."""

    def __init__(self) -> None:
        super().__init__(
            "mcp: the MCP SDK is not installed; install it with "
            "pip install 'exarch-actors[mcp]' (docs/mcp.md)"
        )


class McpServerCrashed(ExarchError):
    """The server's connection ended while this call was in flight; the next call starts the
    server again."""


class McpRequestFailed(ExarchError):
    """The server answered the request with a protocol error (unknown tool, bad arguments)."""


__all__ = [
    "McpRequestFailed",
    "McpSdkMissing",
    "McpServerCrashed",
    "McpServerUnavailable",
    "McpServerUnknown",
    "NotGranted",
]
