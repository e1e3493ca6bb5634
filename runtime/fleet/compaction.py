"""Compaction policy: when to summarise an agent's history, whether it
is allowed, and which suffix of the history survives.

- :func:`compaction_due` — used tokens entered the top 15% of a *known* window (the provider's
  usage figure, else an estimate from the history's size: some local servers report no usage);
  when the window is unknown, the serialised history passed COMPACT_THRESHOLD (500 KiB).
- :func:`can_compact` — the gate: no tool results pending. Compacting between a tool call and its
  result would strand the provider protocol, so a refused gate drops nothing.
- :func:`suffix_start` — the first event the compacted mirror keeps verbatim: the start of the
  most recent user-turn that fits the suffix budget, never between a tool call and its result.

The driver calls these at the top of apply, where the log is ReadyForUser; the event log
(:mod:`runtime.state.eventlog`) applies the result.
"""

from __future__ import annotations

from collections.abc import Sequence

from exarch_actors.runtime.constants import COMPACT_THRESHOLD, COMPACT_WINDOW_FRACTION

SUFFIX_BUDGET_BYTES = COMPACT_THRESHOLD // 5
"""At most 100 KiB of recent history is kept verbatim after a compaction, so one compaction buys
at least 400 KiB of headroom before the fallback threshold is due again."""

SUMMARY_PREAMBLE = "[Summary of the earlier conversation, which was compacted]\n"
"""Prefixed to the summary where it leads the rendered transcript (model-facing)."""


CUT_KINDS = frozenset({"user", "nudge", "steering"})
"""Event kinds a compaction may cut before: they open a user-role message."""


BYTES_PER_TOKEN_ESTIMATE = 3
"""Serialised history bytes per token when the provider reported no usage. Tokenisers average
about 4 characters of English per token; the serialised history also carries JSON keys and
escapes, and code or non-Latin text packs fewer bytes in a token, so 3 errs toward compacting
early, never toward a request the server's window refuses."""


def compaction_due(used_tokens: int | None, window_tokens: int | None, history_bytes: int) -> bool:
    """Whether context pressure calls for a compaction now.

    With a known window (> 0), due iff the tokens in use are in the top 15% of the window
    (``used >= window * 0.85``); they are ``used_tokens`` when the provider reported usage, else
    ``history_bytes // BYTES_PER_TOKEN_ESTIMATE``. With no window, due iff ``history_bytes``
    exceeds COMPACT_THRESHOLD.
    """
    if window_tokens is not None and window_tokens > 0:
        used = used_tokens if used_tokens is not None else history_bytes // BYTES_PER_TOKEN_ESTIMATE
        return used >= window_tokens * (1.0 - COMPACT_WINDOW_FRACTION)
    return history_bytes > COMPACT_THRESHOLD


def can_compact(pending_tool_results: int) -> bool:
    """The gate: only with no tool results pending (the log is ReadyForUser)."""
    return pending_tool_results == 0


def suffix_start(
    kinds: Sequence[str], sizes: Sequence[int], budget: int = SUFFIX_BUDGET_BYTES
) -> int:
    """Index of the first event kept verbatim after a compaction of ``len(kinds)`` events.

    Candidates are the indices > 0 of user-role events (:data:`CUT_KINDS`: a user message, a
    nudge or steering is never inside a tool-call batch, so a cut there keeps the protocol
    whole); index 0 is excluded so a compaction always drops something. The earliest candidate
    whose suffix fits ``budget`` bytes wins; when even the last candidate's suffix is over
    budget, or there is none, everything is summarised (returns ``len(kinds)``).
    """
    if len(kinds) != len(sizes):
        raise ValueError("kinds and sizes must have the same length")
    n = len(kinds)
    best = n
    acc = 0
    for i in range(n - 1, -1, -1):
        acc += sizes[i]
        if acc > budget:
            break
        if i > 0 and kinds[i] in CUT_KINDS:
            best = i
    return best
