"""A loopback MCP server for the tests, written with the official SDK (``MCPServer``).

Run as ``python loopback_server.py LOG [--http PORT]``: stdio by default, streamable HTTP on
127.0.0.1:PORT with ``--http``. Every tool call appends one line to LOG (``start NAME``,
``cancelled NAME``, ``done NAME``), so a test reads what the server saw.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LOG = sys.argv[1] if len(sys.argv) > 1 else os.devnull
server = MCPServer("loopback", log_level="WARNING")


def note(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@server.tool(description="Echo TEXT back.")
def echo(text: str) -> str:
    note("done echo")
    return text


@server.tool(description="Add two integers; a structured result.")
def add(a: int, b: int) -> dict[str, Any]:
    note("done add")
    return {"sum": a + b, "terms": [a, b]}


@server.tool(description="Fail with MESSAGE.")
def fail(message: str) -> str:
    note("done fail")
    raise ToolError(message)


@server.tool(description="Sleep SECONDS, noting a cancel.")
async def slow(seconds: float) -> str:
    note("start slow")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note("cancelled slow")
        raise
    note("done slow")
    return "slept"


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="Exit the server process at once (a crash).")
def crash() -> str:
    note("crash")
    os._exit(3)


@server.tool(description="Write TEXT to PATH.")
def write(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


@server.tool(description="The value of an environment variable, or empty.")
def getenv(name: str) -> str:
    return os.environ.get(name, "")


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()
