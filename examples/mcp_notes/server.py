"""A small filesystem-like MCP server: read-only notes, the text files of one directory.

Written with the official ``mcp`` SDK (``MCPServer``); started by the fleet over stdio as
``{python} {here}/mcp_notes/server.py {here}/mcp_notes/notes`` (``examples/mcp-notes.toml``).
A note's name is a file name in that directory; nothing outside it is served.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
server = MCPServer("notes", log_level="WARNING")


def _note(name: str) -> Path:
    path = (ROOT / name).resolve()
    if path.parent != ROOT or not path.is_file():
        raise ToolError(f"no note named {name!r}")
    return path


@server.tool(description="List the notes (their names, sorted).")
def list_notes() -> dict[str, Any]:
    return {"notes": sorted(p.name for p in ROOT.iterdir() if p.is_file())}


@server.tool(description="Read one note: its name and text.")
def read_note(name: str) -> dict[str, Any]:
    return {"name": name, "text": _note(name).read_text(encoding="utf-8")}


@server.tool(description="Search every note for TEXT; the names of those that hold it.")
def search(text: str) -> dict[str, Any]:
    hits = [p.name for p in sorted(ROOT.iterdir()) if p.is_file() and text in p.read_text()]
    return {"notes": hits}


if __name__ == "__main__":
    server.run()
