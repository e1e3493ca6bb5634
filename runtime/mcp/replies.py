"""Recorded MCP results: what ``--record`` appends and what a replay serves instead of a server.

A recording (``runtime/replay/recording.py``) is a scenario; each MCP result the run received is
appended to it as one ``[[mcp.NAME.replies]]`` block, in the order the results arrived::

    # mcp fs, reply 1
    [[mcp.fs.replies]]
    method = "tools/call"
    tool = "read_file"
    arguments = "{\\"path\\": \\"notes.txt\\"}"
    result = "{\\"content\\": [...]}"
    stop = "result"

``result`` is the JSON the server sent (so a replay converts it by the same rules,
``runtime/mcp/values.py``); a call that failed without a result (the server crashed, a
transport error) has ``error`` instead and ``stop = "error"``. ``stop`` is every block's last
line, as in an agent's reply block, so a block cut mid-write is found and dropped by the
recording's reader.

Invariants:

- A replay serves a server from its replies and never starts it (``actors/mcp_hub.py``).
- A reply is served once, to the first call of the same method, tool and arguments (compared as
  canonical JSON) still waiting in recorded order, so calls made in another interleaving by
  concurrent agents still find theirs; a call with no reply left is
  :class:`McpReplyMissing`, never a guess.
- Header values and environment are never recorded: only what the server answered.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.mcp.config import McpConfigInvalid

CALL = "tools/call"
LIST = "tools/list"
METHODS = (CALL, LIST)
_KEYS = ("method", "tool", "arguments", "result", "error", "stop")


class McpReplyMissing(ExarchError):
    """A replay met an MCP call the recording has no (more) reply for."""


def arguments_key(arguments: Mapping[str, Any] | None) -> str:
    """Arguments as the key a reply is found by: sorted, compact JSON."""
    return json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class McpRequest:
    """One ``mcp`` / ``mcp-tools`` of one agent, as its desk asks the fleet: ``call_id`` is
    unique per agent (a cancel names it), ``tool`` is None for a listing."""

    agent: str
    call_id: str
    server: str
    method: str
    tool: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str | None, str]:
        """What a recorded reply is found by (:class:`McpReply`'s ``key``)."""
        return (self.method, self.tool, arguments_key(self.arguments))


@dataclass(frozen=True)
class McpReply:
    """One recorded result: ``result`` (JSON) or ``error`` (the failure's text)."""

    method: str
    tool: str | None
    arguments: str
    """Canonical JSON (:func:`arguments_key`)."""
    result: Mapping[str, Any] | None = None
    error: str | None = None

    @property
    def key(self) -> tuple[str, str | None, str]:
        return (self.method, self.tool, self.arguments)


def replies_from_table(name: str, value: Any, where: str) -> tuple[McpReply, ...]:
    """The ``replies`` array of ``[mcp.NAME]`` as a scenario holds it."""
    path = f"{where}: mcp.{name}.replies"
    if not isinstance(value, list):
        raise McpConfigInvalid(f"{path}: expected [[mcp.{name}.replies]] blocks")
    out = []
    for i, block in enumerate(value):
        at = f"{path}[{i}]"
        if not isinstance(block, dict):
            raise McpConfigInvalid(f"{at}: expected a table")
        unknown = sorted(set(block) - set(_KEYS))
        if unknown:
            raise McpConfigInvalid(f"{at}: unknown key {', '.join(unknown)}")
        method = block.get("method")
        if method not in METHODS:
            raise McpConfigInvalid(f"{at}: method must be one of {', '.join(METHODS)}")
        tool = block.get("tool")
        if method == CALL and not isinstance(tool, str):
            raise McpConfigInvalid(f"{at}: a tools/call reply names its tool")
        try:
            args = json.loads(str(block.get("arguments", "{}")))
            result = json.loads(block["result"]) if "result" in block else None
        except (TypeError, ValueError) as e:
            raise McpConfigInvalid(f"{at}: not JSON: {e}") from None
        if (result is None) == ("error" not in block):
            raise McpConfigInvalid(f"{at}: give exactly one of result or error")
        if result is not None and not isinstance(result, dict):
            raise McpConfigInvalid(f"{at}: result must be a JSON object")
        out.append(
            McpReply(
                str(method),
                None if tool is None else str(tool),
                arguments_key(args if isinstance(args, dict) else {}),
                result,
                None if "error" not in block else str(block["error"]),
            )
        )
    return tuple(out)


def mcp_result_block(
    server: str, reply: McpReply, mark: str, toml_string: Callable[[str], str]
) -> str:
    """One ``[[mcp.SERVER.replies]]`` block (``mark``: the writer's ``# ...`` line;
    ``toml_string``: the recording's one-line TOML string quoting)."""
    lines = [f"\n# {mark}\n", f"[[mcp.{server}.replies]]\n"]
    lines.append(f"method = {toml_string(reply.method)}\n")
    if reply.tool is not None:
        lines.append(f"tool = {toml_string(reply.tool)}\n")
    lines.append(f"arguments = {toml_string(reply.arguments)}\n")
    if reply.result is not None:
        text = json.dumps(reply.result, ensure_ascii=False, separators=(",", ":"))
        lines.append(f"result = {toml_string(text)}\n")
        lines.append('stop = "result"\n')
    else:
        lines.append(f"error = {toml_string(reply.error or '')}\n")
        lines.append('stop = "error"\n')
    return "".join(lines)


class ReplyBook:
    """The recorded replies of one run, served once each. Thread-safe."""

    def __init__(self, replies: Mapping[str, Iterable[McpReply]]) -> None:
        self._lock = threading.Lock()
        self._left: dict[str, list[McpReply]] = {s: list(r) for s, r in replies.items()}

    def serves(self, server: str) -> bool:
        return server in self._left

    def take(self, request: McpRequest) -> McpReply:
        """The first unserved reply of this request, removed; :class:`McpReplyMissing` if
        none."""
        key, server = request.key, request.server
        with self._lock:
            left = self._left.get(server, [])
            for i, reply in enumerate(left):
                if reply.key == key:
                    return left.pop(i)
        what = f"{request.tool} {key[2]}" if request.method == CALL else request.method
        raise McpReplyMissing(
            f"mcp {server}: the recording has no reply left for {what} "
            "(the replay called what the recorded run did not)"
        )

    def listing(self, server: str) -> Mapping[str, Any] | None:
        """A recorded ``tools/list`` result of ``server`` (not consumed), for the prompt."""
        with self._lock:
            for reply in self._left.get(server, []):
                if reply.method == LIST and reply.result is not None:
                    return reply.result
        return None


__all__ = [
    "CALL",
    "LIST",
    "McpReply",
    "McpReplyMissing",
    "McpRequest",
    "ReplyBook",
    "arguments_key",
    "mcp_result_block",
    "replies_from_table",
]
