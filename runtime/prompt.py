"""The system prompt, assembled per agent from files in :mod:`runtime.prompts`.

``system.md`` teaches ral; ``verbs.md`` holds the role paragraphs and one fragment per agent verb.
:func:`build_system_prompt` shows an agent exactly the verbs its desk would accept and no others
(no agent is shown a verb the desk would certainly refuse), derived from the same
construction-fixed ``returns`` bit the desk and the nudge layer read:

- ``reply`` iff ``returns`` (a conversing agent has no ``reply``, a returning one must have it;
  a disagreement is a :class:`VerbMismatch`, since prompt and desk would then disagree);
- ``agent`` stays advertised at fuel 0 (the desk is the wall: it refuses with the exhaustion text);
- ``--chat`` builds no prompt at all (``chat=True`` returns ``None``).

Placeholders are ``{{name}}`` (ral's own ``$`` and ``{}`` are everywhere in the text).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.mcp.values import VERBS as MCP_VERBS

AGENT_VERBS: tuple[str, ...] = (
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
)
"""Every agent verb (docs/language.md, Agent verbs), in the order the prompt lists them."""


class VerbMismatch(ExarchError):
    """The advertised verbs disagree with what this agent's desk would accept."""


def advertised_verbs(
    *, returns: bool, allow_schedule: bool = True, allow_pin: bool = True
) -> frozenset[str]:
    """The verbs a desk built from these construction bits accepts (the single source of truth)."""
    verbs = {"agent", "message", "agent-cancel", "agent-wait", "agent-result"}
    if returns:
        verbs.add("reply")
    if allow_schedule:
        verbs |= {"schedule", "unschedule"}
    if allow_pin:
        verbs |= {"pin", "unpin"}
    return frozenset(verbs)


@cache
def _read(name: str) -> str:
    return (
        resources.files("exarch_actors.runtime.prompts").joinpath(name).read_text(encoding="utf-8")
    )


@cache
def _fragments() -> dict[str, str]:
    out: dict[str, str] = {}
    key: str | None = None
    buf: list[str] = []
    for line in _read("verbs.md").splitlines():
        if line.startswith("## "):
            if key is not None:
                out[key] = "\n".join(buf).strip()
            key, buf = line[3:].strip(), []
        elif key is not None:
            buf.append(line)
    if key is not None:
        out[key] = "\n".join(buf).strip()
    return out


def preload() -> None:
    """Read and parse the prompt files now: the fork server calls it before forking
    (``actors/fork_warm.py``), so an agent process builds its prompt from inherited memory
    instead of importing ``importlib``'s resource readers and reading both files (about 7 ms of
    a process agent's spawn on a loaded 2-core box)."""
    _read("system.md")
    _fragments()


_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")


def _fill(template: str, values: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"prompt placeholder {{{{{m.group(1)}}}}} has no value")
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, template)


def build_system_prompt(
    verbs: frozenset[str],
    agent_name: str,
    returns: bool,
    fuel: int,
    *,
    chat: bool = False,
    sandbox: str | None = None,
    mcp: str | None = None,
) -> str | None:
    """The system prompt of one agent, or ``None`` in ``--chat`` mode.

    ``sandbox``: the one-line confinement of a confined shell
    (:meth:`runtime.shell.confinement.Sandbox.describe`), told in one closing line so the model
    knows why a path or socket is refused; None (unconfined) adds nothing.

    ``mcp``: the lines on the MCP servers the agent may use (``runtime/mcp/values.py``,
    already size-capped), closing the prompt; ``mcp`` and ``mcp-tools`` in ``verbs`` are
    explained there, not among the agent verbs.

    ``verbs`` is what the agent's desk accepts (see :func:`advertised_verbs`); each verb appears
    in the prompt iff it is in ``verbs``. Raises :class:`VerbMismatch` for an unknown verb or for
    ``reply`` on a non-returning agent.
    """
    if chat:
        return None
    verbs = verbs - MCP_VERBS
    unknown = verbs - set(AGENT_VERBS)
    if unknown:
        raise VerbMismatch(f"unknown agent verbs {sorted(unknown)}; known: {list(AGENT_VERBS)}")
    if ("reply" in verbs) != returns:
        raise VerbMismatch(
            "reply is advertised iff the agent returns: "
            f"returns={returns} but reply {'is' if 'reply' in verbs else 'is not'} in verbs"
        )
    if fuel < 0:
        raise ValueError(f"fuel must be >= 0, got {fuel}")
    frags = _fragments()
    values = {"agent_name": agent_name, "fuel": str(fuel)}
    listed = [_fill(frags[f"verb: {v}"], values) for v in AGENT_VERBS if v in verbs]
    verbs_text = (frags["verbs header"] + "\n" + "\n".join(listed)) if listed else ""
    role = frags["role: returning" if returns else "role: conversing"]
    values |= {"role": role, "verbs": verbs_text}
    text = _fill(_read("system.md"), values).rstrip() + "\n"
    if sandbox:
        text += f"\nYour shell is sandboxed ({sandbox}); outside it, access fails.\n"
    if mcp:
        text += f"\n{mcp}\n"
    return text
