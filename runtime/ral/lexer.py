"""Tokens of ral text, each with a 1-based line:col and whether whitespace preceded it.

Newlines are phrase separators only at the top level and directly inside ``{ }``; inside
``[ ]`` and ``( )`` they are whitespace, so a list literal or a parenthesised command may span
lines. A backslash at the end of a line joins it to the next. The scanner is one compiled regex
(measured ~0.4 µs per token) rather than a per-character loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exarch_actors.runtime.ral.errors import RalSyntaxError

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")

_WORD_CH = r"""[^\s${}\[\]()|;"'\#,\\]"""
# Every repetition is possessive (``*+``, ``++``, Python 3.11+): no rule can give back what it
# matched, so the scan is linear on any input. The string rule once read ``"(?:[^"\\]+|\\.)*"``:
# a nested quantifier that, on an unterminated string, tried every split of the text (27 letters
# took 6 s, 40 never returned). ``"[^"\\]*+(?:\\.[^"\\]*+)*+"`` matches the same strings with
# one way only to do it.
_TOKEN = re.compile(
    r"""
    (?P<ws>(?:[^\S\n]|\\\n|\#[^\n]*+)*+)
    (?:
     (?P<word>(?:W|\\(?!\n))++)
    |(?P<var>\$(?:[A-Za-z_][A-Za-z0-9_-]*+|\{[A-Za-z_][A-Za-z0-9_-]*+\}))
    |(?P<punct>[{}\[\]()|;,])
    |(?P<nl>\n)
    |(?P<dq>"[^"\\]*+(?:\\.[^"\\]*+)*+")
    |(?P<sq>'[^']*+')
    |(?P<end>\Z)
    |(?P<bad>.)
    )
    """.replace("W", _WORD_CH),
    re.X | re.S,
)

_DQ_CHUNK = re.compile(r'[^"\\$\n]+')
_NAME_AT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "$": "$"}

_CLOSERS = {"}": "{", "]": "[", ")": "("}

StrPart = str | tuple[str, int, int]
"""A piece of a double-quoted string: literal text, or ``(name, line, col)`` to interpolate."""


@dataclass(slots=True)
class Token:
    kind: str  # word var str sq { } [ ] ( ) | ; , nl eof
    value: object
    line: int
    col: int
    pos: int
    end: int
    sp: bool  # whitespace (or start of text) precedes this token


def tokenize(text: str, line: int = 1, col: int = 1) -> list[Token]:
    """Tokens of ``text``; ``line``/``col`` place its first character (for re-parsed spans)."""
    if not text.isascii():
        _refuse_surrogates(text, line, col)
    toks: list[Token] = []
    append = toks.append
    stack: list[str] = []
    pos = 0
    line_start = -(col - 1)  # so that col(pos) = pos - line_start + 1
    sp = True
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        start = m.start(kind)  # type: ignore[arg-type]
        if start > pos:
            sp = True
            if "\n" in text[pos:start]:  # a backslash-newline continuation
                chunk = text[pos:start]
                line += chunk.count("\n")
                line_start = pos + chunk.rindex("\n") + 1
        pos = start
        end = m.end()
        c = pos - line_start + 1
        if kind == "word":
            append(Token("word", m.group(kind), line, c, pos, end, sp))
            sp = False
        elif kind == "punct":
            ch = text[pos]
            if ch in "{[(":
                stack.append(ch)
            elif ch in "}])":
                if not stack or stack[-1] != _CLOSERS[ch]:
                    raise RalSyntaxError(f"unexpected {ch}", line, c)
                stack.pop()
            append(Token(ch, ch, line, c, pos, end, sp))
            sp = ch in "{[(|;,"
        elif kind == "var":
            name = text[pos + 1 : end]
            if name[0] == "{":
                name = name[1:-1]
            append(Token("var", name, line, c, pos, end, sp))
            sp = False
        elif kind == "nl":
            if not stack or stack[-1] == "{":
                append(Token("nl", None, line, c, pos, end, sp))
            line += 1
            line_start = end
            sp = True
        elif kind == "dq":
            body = text[pos + 1 : end - 1]
            if "\\" not in body and "$" not in body and "\n" not in body:
                parts: list[StrPart] = [body]
            else:
                parts = _dq_parts(body, line, c + 1)
            append(Token("str", parts, line, c, pos, end, sp))
            if "\n" in body:
                line += body.count("\n")
                line_start = pos + 1 + body.rindex("\n") + 1
            sp = False
        elif kind == "sq":
            body = text[pos + 1 : end - 1]
            append(Token("sq", body, line, c, pos, end, sp))
            if "\n" in body:
                line += body.count("\n")
                line_start = pos + 1 + body.rindex("\n") + 1
            sp = False
        elif kind == "end":
            break
        else:
            ch = text[pos]
            if ch == "$":
                raise RalSyntaxError("expected a variable name after $", line, c)
            if ch == '"':
                raise RalSyntaxError('unterminated "..." string', line, c)
            if ch == "'":
                raise RalSyntaxError("unterminated '...' string", line, c)
            raise RalSyntaxError(f"unexpected character {ch!r}", line, c)
        pos = end
    if stack:
        opener = stack[-1]
        for t in reversed(toks):
            if t.kind == opener:
                raise RalSyntaxError(f"unclosed {opener}", t.line, t.col)
    toks.append(Token("eof", None, line, pos - line_start + 1, pos, pos, True))
    return toks


def _refuse_surrogates(text: str, line: int, col: int) -> None:
    """A lone surrogate (``\\ud800`` from a JSON tool call, or an undecodable byte of a ``-c``
    argument) is not a character: no file, terminal, pipe or UTF-8 frame can carry it, so it is
    refused where the program is read, with its position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        pos = e.start
        nl = text.rfind("\n", 0, pos)
        if nl >= 0:
            line, col = line + text.count("\n", 0, pos), pos - nl
        else:
            col += pos
        code = ord(text[pos])
        raise RalSyntaxError(
            f"invalid character U+{code:04X} (a lone surrogate)", line, col
        ) from None


def _dq_parts(body: str, line: int, col: int) -> list[StrPart]:
    """Escapes and ``$name``/``${name}`` of a ``"..."`` body starting at ``line``:``col``."""
    parts: list[StrPart] = []
    buf: list[str] = []
    pos = 0
    n = len(body)
    line_start = -(col - 1)
    while pos < n:
        m = _DQ_CHUNK.match(body, pos)
        if m:
            buf.append(m.group())
            pos = m.end()
            continue
        ch = body[pos]
        if ch == "\n":
            buf.append("\n")
            pos += 1
            line += 1
            line_start = pos
            continue
        if ch == "\\":
            nxt = body[pos + 1 : pos + 2]
            if nxt in _ESCAPES:
                buf.append(_ESCAPES[nxt])
                pos += 2
            elif nxt == "\n":  # backslash-newline joins lines
                pos += 2
                line += 1
                line_start = pos
            else:  # unknown escapes stay literal, as in a POSIX shell ("\d" stays \d)
                buf.append("\\")
                pos += 1
            continue
        # ch == "$"
        c = pos - line_start + 1
        if body.startswith("${", pos):
            close = body.find("}", pos + 2)
            name = body[pos + 2 : close] if close >= 0 else ""
            if close < 0 or not NAME_RE.match(name):
                raise RalSyntaxError("bad ${...} interpolation", line, c)
            end = close + 1
        else:
            nm = _NAME_AT.match(body, pos + 1)
            if not nm:  # a lone `$` is literal
                buf.append("$")
                pos += 1
                continue
            name = nm.group()
            end = nm.end()
        if buf:
            parts.append("".join(buf))
            buf = []
        parts.append((name, line, c))
        pos = end
    if buf or not parts:
        parts.append("".join(buf))
    return parts
