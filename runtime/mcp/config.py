"""The MCP servers of a fleet: ``[mcp.NAME]`` tables (a scenario, a config file) and ``--mcp``.

A server is either **stdio** (``command``, ``args``, ``env``, ``cwd``: the fleet starts the
program and speaks JSON-RPC over its stdin/stdout) or **streamable HTTP** (``url``,
``headers``). ``description`` is the one line the system prompt shows for it.

Invariants:

- A server has exactly one transport: a table with both ``command`` and ``url`` (or neither) is
  refused with :class:`McpConfigInvalid` naming where it was written, never guessed.
- Names are ral words (``[A-Za-z0-9_-]+``), so ``mcp NAME TOOL`` never needs quoting.
- Sources merge by name, later over earlier: the user's config file, the project's, the
  scenario, then ``--mcp`` flags (:func:`merged`). A later source replaces a server whole; it
  never mixes fields of two definitions.
- Nothing here starts anything: these are values (picklable, comparable) the fleet holds.

Two words are filled in a stdio table where it is read (never in ``--mcp``, whose words a shell
already expanded): ``{python}`` is the Python exarch-actors runs on (it has the ``mcp`` SDK, so
a server written with it starts anywhere the command runs), and ``{here}`` the directory of the
file the table is written in (a scenario ships its server beside it).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.errors import ExarchError

NAME = re.compile(r"^[A-Za-z0-9_-]+$")

STDIO_KEYS = ("command", "args", "env", "cwd")
HTTP_KEYS = ("url", "headers")
KEYS = (*STDIO_KEYS, *HTTP_KEYS, "description")


class McpConfigInvalid(ExarchError):
    """An ``[mcp.NAME]`` table or ``--mcp`` value cannot describe a server; says where."""


@dataclass(frozen=True)
class McpServer:
    """One configured server. ``command`` set: stdio; ``url`` set: streamable HTTP."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Request headers (often a bearer token): never shown in a repr, a prompt or a recording."""
    description: str = ""

    @property
    def transport(self) -> str:
        """``stdio``, ``http``, or ``recorded`` (neither: a replay serves it from a recording's
        replies, ``runtime/mcp/replies.py``)."""
        if self.command is not None:
            return "stdio"
        return "http" if self.url is not None else "recorded"

    def describe(self) -> str:
        """One line for people: the transport and what runs or where (no header values)."""
        if self.command is not None:
            return f"stdio: {shlex.join([self.command, *self.args])}"
        return f"http: {self.url}" if self.url is not None else "recorded replies"

    def to_dict(self) -> dict[str, Any]:
        """The server as ``run.json`` keeps it for ``resume``: environment and header *names*
        only (a value may be a token; :func:`servers_from_run` reads them again)."""
        d: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.command is not None:
            d |= {"command": self.command, "args": list(self.args)}
            d["envNames"] = [k for k, _ in self.env]
            if self.cwd is not None:
                d["cwd"] = self.cwd
        elif self.url is not None:
            d |= {"url": self.url, "headerNames": [k for k, _ in self.headers]}
        return d


def _strings(value: Any, where: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise McpConfigInvalid(f"{where}: {what} must be a list of strings")
    return tuple(value)


def _table(value: Any, where: str, what: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise McpConfigInvalid(f"{where}: {what} must be a table of strings")
    return tuple(sorted(value.items()))


def _name(name: str, where: str) -> str:
    if not NAME.match(name):
        raise McpConfigInvalid(f"{where}: server name {name!r} must be letters, digits, - or _")
    return name


def filled(word: str, here: str | None) -> str:
    """``word`` with ``{python}`` and ``{here}`` filled (see the module docstring)."""
    word = word.replace("{python}", sys.executable)
    return word if here is None else word.replace("{here}", here)


def server_from_table(name: str, table: Any, where: str, here: str | None = None) -> McpServer:
    """One ``[mcp.NAME]`` table; ``where`` (``FILE`` or ``FILE:LINE``) prefixes a refusal,
    ``here`` is the directory ``{here}`` names. Unknown keys are refused too: a misspelt
    ``comand`` would otherwise leave no transport."""
    where = f"{where}: mcp.{name}"
    _name(name, where)
    if not isinstance(table, dict):
        raise McpConfigInvalid(f"{where}: expected a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise McpConfigInvalid(
            f"{where}: unknown key {', '.join(unknown)} (known: {', '.join(KEYS)})"
        )
    command, url = table.get("command"), table.get("url")
    if (command is None) == (url is None):
        raise McpConfigInvalid(f"{where}: give exactly one of command (stdio) or url (HTTP)")
    description = table.get("description", "")
    if not isinstance(description, str):
        raise McpConfigInvalid(f"{where}: description must be a string")
    description = " ".join(description.split())
    if command is not None:
        stray = sorted(k for k in HTTP_KEYS if k in table)
        if stray:
            raise McpConfigInvalid(f"{where}: {', '.join(stray)} belongs to an HTTP server")
        if not isinstance(command, str) or not command:
            raise McpConfigInvalid(f"{where}: command must be a non-empty string")
        cwd = table.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise McpConfigInvalid(f"{where}: cwd must be a string")
        return McpServer(
            name,
            command=filled(command, here),
            args=tuple(filled(a, here) for a in _strings(table.get("args", []), where, "args")),
            env=_table(table.get("env", {}), where, "env"),
            cwd=None if cwd is None else filled(cwd, here),
            description=description,
        )
    stray = sorted(k for k in STDIO_KEYS if k in table)
    if stray:
        raise McpConfigInvalid(f"{where}: {', '.join(stray)} belongs to a stdio server")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise McpConfigInvalid(f"{where}: url must be an http:// or https:// URL")
    return McpServer(
        name,
        url=url,
        headers=_table(table.get("headers", {}), where, "headers"),
        description=description,
    )


def servers_from_doc(doc: Any, where: str, here: str | None = None) -> tuple[McpServer, ...]:
    """Every server of an ``mcp`` top-level table (``doc`` is its value), in file order."""
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise McpConfigInvalid(f"{where}: mcp must be a table of server names ([mcp.NAME])")
    return tuple(server_from_table(str(n), t, where, here) for n, t in doc.items())


def server_from_flag(value: str) -> McpServer:
    """``--mcp NAME=COMMAND [ARG...]`` (split as a shell would) or ``--mcp NAME=URL``."""
    name, sep, rest = value.partition("=")
    where = f"--mcp {value}"
    if not sep or not rest.strip():
        raise McpConfigInvalid(f"{where}: expected NAME=COMMAND (or NAME=URL)")
    _name(name, where)
    if rest.startswith(("http://", "https://")):
        return McpServer(name, url=rest)
    try:
        words = shlex.split(rest)
    except ValueError as e:
        raise McpConfigInvalid(f"{where}: {e}") from None
    return McpServer(name, command=words[0], args=tuple(words[1:]))


def servers_from_run(
    entries: Any, environ: Mapping[str, str], where: str = "the run's spec"
) -> tuple[McpServer, ...]:
    """The servers ``run.json`` kept (:meth:`McpServer.to_dict`), for ``resume``: a stdio
    server's environment values are read again from ``environ`` (as the provider's key is);
    an HTTP server's header values are not kept anywhere, so it resumes without them."""
    out = []
    for e in entries or ():
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            continue
        table: dict[str, Any] = {"description": str(e.get("description") or "")}
        if e.get("command") is not None:
            table |= {"command": e["command"], "args": list(e.get("args") or ())}
            names = [str(n) for n in e.get("envNames") or () if str(n) in environ]
            table["env"] = {n: environ[n] for n in names}
            if e.get("cwd") is not None:
                table["cwd"] = e["cwd"]
        elif e.get("url") is not None:
            table["url"] = e["url"]
        else:  # served from a recording's replies
            out.append(McpServer(e["name"], description=table["description"]))
            continue
        out.append(server_from_table(e["name"], table, where))
    return tuple(out)


def merged(*sources: Iterable[McpServer]) -> tuple[McpServer, ...]:
    """The servers of every source by name, a later source's definition replacing an earlier
    one's whole; the order is where each name first appeared."""
    out: dict[str, McpServer] = {}
    for source in sources:
        for server in source:
            out[server.name] = server
    return tuple(out.values())


def by_name(servers: Iterable[McpServer]) -> Mapping[str, McpServer]:
    return {s.name: s for s in servers}


__all__ = [
    "McpConfigInvalid",
    "McpServer",
    "by_name",
    "merged",
    "server_from_flag",
    "server_from_table",
    "servers_from_doc",
    "servers_from_run",
]
