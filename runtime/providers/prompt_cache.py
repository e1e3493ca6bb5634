"""Where an Anthropic request carries its prompt-cache breakpoints (``cache_control``).

Anthropic caches a request's prefix up to each block marked ``cache_control: {"type":
"ephemeral"}`` and lets a later request whose prefix is byte-identical up to such a block read it
at a tenth of the input price (writing costs 1.25x, docs/cost.md). The API takes at most
:data:`MAX_BREAKPOINTS` markers per request, and looks for an earlier cache entry only about 20
blocks back from each marker, so where they sit decides what a fleet pays for its re-sent
transcripts. The rule, as :func:`place_breakpoints` applies it:

1. **The system prompt** (one marker on its block): fixed for an agent's life.
2. **The tools** (one marker on the last tool: it caches the whole list, which comes before the
   system prompt in the API's prefix order).
3. **The conversation**: the last block of the latest *stable* turn — the newest part of the
   request that the next request will send again unchanged — and the last block of the stable
   user turn before the latest assistant turn (where the previous round trip put its marker, so
   this request reads what that one wrote even when the new turns hold more than 20 blocks).
   Markers move forward as the transcript grows; older ones are simply not sent again.

**Stable** excludes what compaction will drop (``runtime/fleet/compaction.py``): a summary request
ends
with the summarise instruction, and its answer replaces the history, so that instruction is never
sent again; a marker on it would pay the cache-write premium for a prefix nobody reads. The
caller says how many trailing blocks are droppable; no marker is ever placed on one. The marker
*before* them pays when the summary request can read the transcript's cached prefix; when it
cannot — it forbids tool calls (``tool_choice``), and a changed ``tool_choice`` invalidates the
cached messages — the caller asks for no conversation marker at all (``conversation=False``):
every one would be a write that nothing reads.

Invariants (property-tested): at most :data:`MAX_BREAKPOINTS` markers in all; none on a droppable
block; placement is a pure function of the request's shape, so two requests with the same prefix
mark it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_BREAKPOINTS = 4
"""Anthropic refuses a request with more ``cache_control`` blocks than this."""

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}


def conversation_breakpoints(roles: Sequence[str], stable_blocks: int, budget: int) -> list[int]:
    """Positions of the conversation blocks that get a marker, oldest first.

    ``roles`` holds one role per content block, the turns' blocks flattened in order (the
    renderer merges same-role neighbours, so a run of equal roles is one turn);
    ``stable_blocks`` is how many leading blocks are stable (the rest will be dropped);
    ``budget`` is how many markers are left after the system prompt and the tools. The latest
    stable block comes first; then the last block of the user turn before the latest assistant
    turn (the previous request's tail)."""
    stable = max(0, min(stable_blocks, len(roles)))
    if budget <= 0 or stable == 0:
        return []
    latest = stable - 1
    chosen = [latest]
    previous_tail = _previous_request_tail(roles, latest)
    if previous_tail is not None and len(chosen) < budget:
        chosen.append(previous_tail)
    return sorted(chosen)


def _previous_request_tail(roles: Sequence[str], latest: int) -> int | None:
    """The last user block before the latest assistant block at or before ``latest``: where
    the request that produced that assistant turn ended."""
    i = latest
    while i >= 0 and roles[i] != "assistant":
        i -= 1
    while i >= 0 and roles[i] != "user":
        i -= 1
    return i if i >= 0 else None


def place_breakpoints(
    system: list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    messages: list[dict[str, Any]],
    *,
    droppable_blocks: int = 0,
    conversation: bool = True,
) -> int:
    """Mark, in place, the system blocks, the tools and ``messages`` of one request; return how
    many markers were placed. ``droppable_blocks`` is how many trailing conversation blocks
    compaction will drop; ``conversation=False`` marks only the system prompt and the tools (see
    the module docstring). Existing markers are removed first, so
    marking a request twice marks it the same way."""
    flat = [(turn, block) for turn in messages for block in _blocks(turn)]
    for block in [*(system or ()), *(tools or ()), *(b for _, b in flat)]:
        block.pop("cache_control", None)
    placed = 0
    if system:
        system[-1]["cache_control"] = dict(EPHEMERAL)
        placed += 1
    if tools:
        tools[-1]["cache_control"] = dict(EPHEMERAL)
        placed += 1
    roles = [str(turn.get("role", "")) for turn, _ in flat]
    stable = len(flat) - max(0, droppable_blocks) if conversation else 0
    for position in conversation_breakpoints(roles, stable, MAX_BREAKPOINTS - placed):
        flat[position][1]["cache_control"] = dict(EPHEMERAL)
        placed += 1
    return placed


def _blocks(turn: dict[str, Any]) -> list[dict[str, Any]]:
    content = turn.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def marked_blocks(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Flattened positions of the conversation blocks that carry a marker."""
    flat = [b for turn in messages for b in _blocks(turn)]
    return [i for i, b in enumerate(flat) if "cache_control" in b]
