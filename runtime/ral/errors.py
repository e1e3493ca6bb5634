"""The ral interpreter's typed errors.

:class:`RalError` is the only error a ral ``try`` can catch. Syntax and elaboration refusals are
raised before any phrase runs. Everything else that escapes the evaluator is either
:class:`runtime.cancel.Cancelled` (never catchable) or an internal fault such as
:class:`InternalPanic`, which the host treats as a shell panic.
"""

from __future__ import annotations

from exarch_actors.runtime.errors import ExarchError


class RalError(ExarchError):
    """A ral runtime error; ``line``/``col`` are 0 until the nearest call site fills them in."""

    def __init__(self, message: str, line: int = 0, col: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.col = col

    def __str__(self) -> str:
        if self.line:
            return f"{self.line}:{self.col} {self.message}"
        return self.message


class RalSyntaxError(ExarchError):
    """A program that does not parse (kind ``syntax``) or does not elaborate (``elaboration``)."""

    def __init__(self, message: str, line: int, col: int, kind: str = "syntax") -> None:
        super().__init__(f"{line}:{col} {message}")
        self.message = message
        self.line = line
        self.col = col
        self.kind = kind


class CodecError(ExarchError):
    """Bytes that do not decode to a ral value, or a value that cannot be encoded."""


class ValueTooLarge(CodecError):
    """A value whose size written out -- each item of each container, a part that occurs n times
    counted n times -- passes :data:`runtime.ral.values.MAX_EXPANDED_ITEMS`: encoding it would
    take time and memory exponential in the program that built it (``fold { |a, x| [$a, $a] }``
    doubles it each step), so the codec refuses it before writing a byte."""


class DeskRefusal(ExarchError):
    """Raised by a desk to refuse an agent verb; the shell reports it as a ral error."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MidRunRefused(ExarchError):
    """A session-scope mutation (``unset``/``restore``) was attempted while a run is in flight."""


class InternalPanic(RuntimeError):
    """The non-ral error raised by ``fault panic``: the host must treat it as a shell panic."""
