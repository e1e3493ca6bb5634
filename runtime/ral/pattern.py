"""Regular expressions that ral programs write (``grep-files PATTERN``): RE2, never backtracking.

A pattern comes from a model and the text it searches from any file, so Python's backtracking
``re`` is the wrong engine: ``(a*)*b`` over a line of 30 ``a`` takes minutes there, in C, where
no cancellation can reach it. RE2 (the ``google-re2`` package) matches in time linear in the text
for every pattern it accepts, and bounds the memory a compiled pattern may use (8 MiB by
default). The price is RE2's syntax: no backreferences (``\\1``) and no lookaround
(``(?=...)``); such a pattern is refused with a ral error naming what RE2 did not accept.
"""

from __future__ import annotations

from typing import Any

from exarch_actors.runtime.ral.errors import RalError


def compile_pattern(pattern: str, who: str) -> Any:
    """A compiled RE2 pattern with ``search(text)``; :class:`RalError` when RE2 refuses it."""
    import re2  # imported on first use: most shells never grep

    options = re2.Options()
    options.log_errors = False  # RE2 would otherwise print its complaint on the host's stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        raise RalError(f"{who}: bad pattern: {_reason(e)}") from None
    except UnicodeEncodeError:
        raise RalError(f"{who}: bad pattern: not valid Unicode text") from None


def _reason(e: Exception) -> str:
    msg = e.args[0] if e.args else e
    return msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)
