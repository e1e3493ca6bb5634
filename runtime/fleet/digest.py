"""Digest caps: what the model sees of a tool result, byte-capped per section.

An oversize section keeps a head and a tail and replaces the middle with an elision banner that
says how many bytes were elided and tells the model to scope its query at the source and re-read
in slices. :func:`digest_tool_result` renders the exact text the model sees *and* the transcript
records, so the user never sees more of a result than the model does.

Invariants (property-tested):

- ``clip_middle`` output is at most ``max(cap, banner)`` UTF-8 bytes; the head and tail budgets
  are ``cap - len(banner)``, so the whole clipped section fits the cap and ``clip_middle`` is
  idempotent.
- the head is a prefix and the tail a suffix of the input, cut on character boundaries (never
  inside a UTF-8 sequence);
- input at or under the cap passes through unchanged.

Cost: nothing is copied whole. ASCII ``str`` length is O(1) in CPython; a non-ASCII ``str`` is
measured in 1 Mi-char encoded chunks (one whole-string ``encode`` was 131 ms for 50 MB here, the
chunked sum 26 ms, with no 50 MB second copy); ``bytes`` are cut raw and only the two kept
windows are decoded. Measured: 50 MB ASCII 0.05 ms, 50 MB bytes 0.1 ms, 50 MB non-ASCII 26 ms
(``benchmarks/digest_cost.py`` measures them against a 50 KB result).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from enum import StrEnum

from exarch_actors.runtime.constants import (
    AGENT_REPLY_CAP,
    OPAQUE_CAP,
    STDERR_CAP,
    STDOUT_CAP,
    VALUE_CAP,
)


class Section(StrEnum):
    VALUE = "value"
    STDOUT = "stdout"
    STDERR = "stderr"
    ERROR = "error"
    NOTES = "notes"
    AGENT_REPLY = "agent reply"


CAPS: dict[Section, int] = {
    Section.VALUE: VALUE_CAP,
    Section.STDOUT: STDOUT_CAP,
    Section.STDERR: STDERR_CAP,
    Section.ERROR: OPAQUE_CAP,
    Section.NOTES: OPAQUE_CAP,
    Section.AGENT_REPLY: AGENT_REPLY_CAP,
}
"""The cap of each section. ``error`` and ``notes`` are opaque blobs (a ral error with its
position, a traceback, runtime notices): the model acts on their head and tail, so OPAQUE_CAP."""


def banner(section: str, elided: int, total: int) -> str:
    """The elision banner, the model-facing text between head and tail."""
    return (
        f"\n[... {section}: {elided} of {total} bytes elided from the middle. Scope the query at "
        "its source (grep-files PATTERN PATH, view-text PATH FROM TO, filter before printing) "
        "and re-read in slices ...]\n"
    )


_CHUNK = 1 << 20


def _byte_len(text: str) -> int:
    """UTF-8 length without a whole-input copy: O(1) for ASCII, 1 Mi-char chunks otherwise."""
    if text.isascii():
        return len(text)
    if len(text) <= _CHUNK:
        return len(text.encode("utf-8"))
    return sum(len(text[i : i + _CHUNK].encode("utf-8")) for i in range(0, len(text), _CHUNK))


def _head_bytes(text: str, budget: int) -> str:
    """The longest prefix of ``text`` of at most ``budget`` UTF-8 bytes."""
    if budget <= 0:
        return ""
    chunk = text[:budget]  # budget chars encode to >= budget bytes, so this suffices
    if chunk.isascii():
        return chunk
    raw = chunk.encode("utf-8")[:budget]
    return raw.decode("utf-8", "ignore")  # drops only a split trailing sequence


def _tail_bytes(text: str, budget: int) -> str:
    """The longest suffix of ``text`` of at most ``budget`` UTF-8 bytes."""
    if budget <= 0:
        return ""
    chunk = text[-budget:]
    if chunk.isascii():
        return chunk
    raw = chunk.encode("utf-8")[-budget:]
    start = 0
    while start < len(raw) and (raw[start] & 0xC0) == 0x80:
        start += 1  # skip continuation bytes of a split leading sequence
    return raw[start:].decode("utf-8")


def _clip_raw(raw: bytes, cap: int, section: str) -> str:
    """:func:`clip_middle` for bytes: only the head and tail windows are decoded, never the
    whole."""
    if len(raw) <= cap:
        return clip_middle(raw.decode("utf-8", "replace"), cap, section)
    total = len(raw)
    widest = len(banner(section, total, total).encode("utf-8"))
    budget = max(cap - widest, 0)
    hb, tb = budget - budget // 2, budget // 2
    # An incremental decoder holds back a sequence split at the window's end; invalid bytes
    # become U+FFFD (3 bytes), so re-cut the decoded windows to their byte budgets.
    head_text = codecs.getincrementaldecoder("utf-8")("replace").decode(raw[:hb], final=False)
    window = raw[total - tb :] if tb else b""
    start = 0
    while start < min(len(window), 3) and (window[start] & 0xC0) == 0x80:
        start += 1
    head = _head_bytes(head_text, hb)
    tail = _tail_bytes(window[start:].decode("utf-8", "replace"), tb)
    kept_raw = len(head.encode("utf-8")) + len(tail.encode("utf-8"))
    return head + banner(section, max(total - kept_raw, 0), total) + tail


def clip_middle(text: str | bytes, cap: int, section: str) -> str:
    """Head + banner + tail of ``text`` within ``cap`` UTF-8 bytes; under-cap input unchanged.

    ``bytes`` input (a program's output may be anything) is cut on the raw bytes and only the
    kept windows are decoded (invalid sequences become U+FFFD); byte counts are of the raw input.
    """
    if cap < 0:
        raise ValueError(f"cap must be >= 0, got {cap}")
    if isinstance(text, bytes | bytearray):
        return _clip_raw(bytes(text), cap, section)
    if len(text) <= cap // 4 or (len(text) <= cap and _byte_len(text) <= cap):
        return text
    total = _byte_len(text)
    if total <= cap:
        return text
    # Size the budget against a banner whose number is as wide as it can get (elided <= total),
    # so the real banner is never longer than the one we budgeted for.
    widest = len(banner(section, total, total).encode("utf-8"))
    budget = max(cap - widest, 0)
    head = _head_bytes(text, budget - budget // 2)
    tail = _tail_bytes(text, budget // 2)
    kept = _byte_len(head) + _byte_len(tail)
    return head + banner(section, total - kept, total) + tail


def clip_section(text: str | bytes, section: Section) -> str:
    """:func:`clip_middle` with the section's own cap."""
    return clip_middle(text, CAPS[section], section.value)


def clip_agent_reply(text: str) -> str:
    """A child's reply as its parent's model sees it."""
    return clip_section(text, Section.AGENT_REPLY)


def digest_tool_result(
    value_render: str | None,
    stdout: str | bytes = "",
    stderr: str | bytes = "",
    error: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The exact text of one ral tool result, as the model sees it and the transcript records it.

    Sections appear in a fixed order, each headed by its name in brackets, and only when it has
    content: ``[error]`` (a failed run; the value is then absent), ``[value]``, ``[stdout]``,
    ``[stderr]``, ``[notes]``. A run with no value, no output and no error renders as
    ``[value]\\nunit`` so the model never receives an empty result.
    """
    parts: list[str] = []
    if error is not None:
        parts.append("[error]\n" + clip_section(error, Section.ERROR))
    elif value_render is not None:
        parts.append("[value]\n" + clip_section(value_render, Section.VALUE))
    for section, body in ((Section.STDOUT, stdout), (Section.STDERR, stderr)):
        if body:
            parts.append(f"[{section.value}]\n" + clip_section(body, section))
    cleaned = [n for n in notes if n]
    if cleaned:
        parts.append("[notes]\n" + clip_section("\n".join(cleaned), Section.NOTES))
    if not parts:
        return "[value]\nunit"
    return "\n".join(parts)
