"""MCP results as ral values, ral maps as tool arguments, and the prompt's list of servers.

An MCP result arrives as JSON (the SDK's model dumped with its wire names); what the model sees
in ral is decided here, the same for a live server and a recorded reply:

- ``structuredContent`` present: that JSON as ral maps, lists, strings, numbers and booleans
  (JSON ``null`` is ral unit);
- else the ``content`` items: one text item is its string; several items are a list, each text
  item a string and every other item a map of its kind (``[type: image, mimeType: ...,
  bytes: N]`` -- binary payloads are never inlined into a ral value); no item is unit;
- ``isError``: :class:`McpToolFailed` with the server's own text, which the desk hands ral as
  an error (``try`` catches it).

Invariants: conversion never loses a JSON value a ral value can hold and never invents one; a
ral value that has no JSON form (a closure, a worker handle, bytes, a variant) is refused as an
argument with :class:`McpArgumentInvalid` before anything is sent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.ral.values import UNIT, Unit, type_name

PROMPT_CAP = 2000
"""Characters the system prompt's MCP section may take at most (tool lines past it are cut and
the cut is said, so the model knows to ask ``mcp-tools NAME``)."""

VERBS = frozenset({"mcp", "mcp-tools"})
"""The two ral commands of MCP, answered by the desk (docs/language.md)."""


class McpToolFailed(ExarchError):
    """The server answered the tool call with an error result (``isError``): its own text."""


class McpArgumentInvalid(ExarchError):
    """A ral value given as tool arguments has no JSON form (or is not a map)."""


def to_ral(value: Any) -> Any:
    """JSON (as ``json.loads`` gives it) as a ral value: ``null`` is unit, objects are maps."""
    if value is None:
        return UNIT
    if isinstance(value, dict):
        return {str(k): to_ral(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_ral(v) for v in value]
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def to_json(value: Any, where: str = "arguments") -> Any:
    """A ral value as JSON; a value with no JSON form is :class:`McpArgumentInvalid`."""
    if isinstance(value, Unit):
        return None
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): to_json(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise McpArgumentInvalid(f"{where}: a {type_name(value)} has no JSON form")


def arguments(value: Any) -> dict[str, Any]:
    """``mcp NAME TOOL ARGS``'s ARGS: a ral map (unit or nothing: no arguments)."""
    if isinstance(value, Unit):
        return {}
    if not isinstance(value, dict):
        raise McpArgumentInvalid(
            f'ARGS must be a map such as [path: "notes.txt"], got a {type_name(value)}'
        )
    out = to_json(value)
    assert isinstance(out, dict)
    return out


def _item(item: Mapping[str, Any]) -> Any:
    kind = str(item.get("type", "unknown"))
    if kind == "text":
        return str(item.get("text", ""))
    out: dict[str, Any] = {"type": kind}
    for key in ("mimeType", "uri", "name"):
        if key in item:
            out[key] = str(item[key])
    data = item.get("data")
    if isinstance(data, str):
        try:
            out["bytes"] = len(base64.b64decode(data, validate=False))
        except ValueError:
            out["bytes"] = len(data)
    resource = item.get("resource")
    if isinstance(resource, dict):
        out["uri"] = str(resource.get("uri", ""))
        if "text" in resource:
            out["text"] = str(resource["text"])
    return out


def error_text(result: Mapping[str, Any]) -> str:
    """What an error result says: its text items joined (or that it said nothing)."""
    texts = [str(i.get("text", "")) for i in result.get("content") or () if i.get("type") == "text"]
    return "\n".join(t for t in texts if t) or "the tool failed without a message"


def call_value(result: Mapping[str, Any]) -> Any:
    """A ``tools/call`` result (JSON) as a ral value; an error result raises
    :class:`McpToolFailed` with the server's text."""
    if result.get("isError"):
        raise McpToolFailed(error_text(result))
    if result.get("structuredContent") is not None:
        return to_ral(result["structuredContent"])
    items = [_item(i) for i in result.get("content") or () if isinstance(i, dict)]
    if not items:
        return UNIT
    if len(items) == 1:
        return items[0]
    return items


@dataclass(frozen=True)
class ToolLine:
    """One tool as the prompt and ``mcp-tools`` show it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]

    @property
    def summary(self) -> str:
        """The description's first line (the prompt shows no more)."""
        first = self.description.strip().splitlines()[0] if self.description.strip() else ""
        return first


def tool_lines(listing: Mapping[str, Any]) -> tuple[ToolLine, ...]:
    """The tools of a ``tools/list`` result (JSON)."""
    out = []
    for t in listing.get("tools") or ():
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            schema = t.get("inputSchema")
            out.append(
                ToolLine(
                    t["name"],
                    str(t.get("description") or ""),
                    schema if isinstance(schema, dict) else {},
                )
            )
    return tuple(out)


def tools_value(listing: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``mcp-tools NAME``: a list of ``[name: ..., description: ..., input: SCHEMA]``."""
    return [
        {"name": t.name, "description": t.description, "input": to_ral(dict(t.input_schema))}
        for t in tool_lines(listing)
    ]


def prompt_section(
    servers: Iterable[tuple[str, str, tuple[ToolLine, ...] | None]], cap: int = PROMPT_CAP
) -> str | None:
    """The system prompt's lines on MCP: each server the agent may use with its description and
    its tools (name and first description line) when known, within ``cap`` characters. None
    when there is no server."""
    servers = list(servers)
    if not servers:
        return None
    lines = [
        "MCP servers (their tools are ral commands: `mcp SERVER TOOL [key: value]` returns the "
        "result as a ral value; `mcp-tools SERVER` lists tools with their input schemas):"
    ]
    size = len(lines[0])
    cut = False
    for name, description, tools in servers:
        head = f"- {name}" + (f": {description}" if description else "")
        if tools is None:
            head += " (tools not listed yet: `mcp-tools " + name + "`)"
        if size + len(head) + 1 > cap:
            cut = True
            break
        lines.append(head)
        size += len(head) + 1
        for t in tools or ():
            line = f"  - {t.name}" + (f": {t.summary}" if t.summary else "")
            if size + len(line) + 1 > cap:
                cut = True
                break
            lines.append(line)
            size += len(line) + 1
    if cut:
        lines.append("  (more: `mcp-tools SERVER`)")
    return "\n".join(lines)


__all__ = [
    "PROMPT_CAP",
    "VERBS",
    "McpArgumentInvalid",
    "McpToolFailed",
    "ToolLine",
    "arguments",
    "call_value",
    "error_text",
    "prompt_section",
    "to_json",
    "to_ral",
    "tool_lines",
    "tools_value",
]
