"""Recursive-descent parser: tokens to :mod:`runtime.ral.nodes`.

Grammar (informal)::

    program  = sep* (phrase (sep+ phrase)*)? sep*          sep = newline | ;
    phrase   = let [rec] NAME = rhs | if C BODY (else if C BODY)* [else BODY]
             | for NAME in ATOM BODY | try BODY catch NAME BODY | use ATOM
             | return [rhs] | command
    command  = ATOM ATOM*        (a lone non-word atom is a value, never run)
    ATOM     = word | $name[idx]* | "..." | '...' | [list] | [k: v] | [:]
             | { |p| program } | ( rhs )

Adjacent word pieces with no space between them (``$dir/file.txt``) join into one string.
Nesting is capped at :data:`MAX_NESTING` so a hostile program gets a syntax error, never a
Python ``RecursionError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from exarch_actors.runtime.ral.errors import RalSyntaxError
from exarch_actors.runtime.ral.lexer import NAME_RE, Token, tokenize
from exarch_actors.runtime.ral.nodes import (
    Block,
    Cmd,
    Concat,
    For,
    If,
    Index,
    Interpolation,
    Let,
    ListLit,
    Lit,
    MapLit,
    Node,
    Paren,
    Return,
    Try,
    Use,
    Var,
)
from exarch_actors.runtime.ral.values import UNIT

MAX_NESTING = 200
"""Deepest bracket nesting accepted; far beyond hand-written code, well inside Python's stack."""

_INT = re.compile(r"-?[0-9]+\Z")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+(?:[eE][-+]?[0-9]+)?\Z")
_KEYWORDS = frozenset({"let", "if", "for", "try", "use", "return"})
_PHRASE_END = frozenset({"nl", ";", "}", ")", "eof"})
_PIECE = frozenset({"word", "var", "str", "sq"})


def word_value(w: str, line: int, col: int) -> Lit:
    """A bare word's literal: number, bool, unit, or a string (``bare`` marks a possible head)."""
    c0 = w[0]
    if c0.isdigit() or (c0 == "-" and len(w) > 1):
        if _INT.match(w):
            try:
                return Lit(int(w), line, col)
            except ValueError:  # beyond Python's 4300-digit int parsing limit
                raise RalSyntaxError("number literal too large", line, col) from None
        if _FLOAT.match(w):
            f = float(w)
            if f in (float("inf"), float("-inf")):
                raise RalSyntaxError("number literal too large", line, col)
            return Lit(f, line, col)
    if w == "true":
        return Lit(True, line, col)
    if w == "false":
        return Lit(False, line, col)
    if w == "unit":
        return Lit(UNIT, line, col)
    return Lit(w, line, col, bare=True)


class Parser:
    def __init__(self, text: str, line: int = 1, col: int = 1) -> None:
        self.text = text
        self.toks = tokenize(text, line, col)
        self.i = 0
        self.depth = 0

    # -- helpers -------------------------------------------------------------------------
    def peek(self) -> Token:
        return self.toks[self.i]

    def next(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def fail(self, msg: str, t: Token | None = None) -> RalSyntaxError:
        t = t or self.peek()
        return RalSyntaxError(msg, t.line, t.col)

    def expect(self, kind: str, what: str) -> Token:
        t = self.peek()
        if t.kind != kind:
            raise self.fail(f"expected {what}, found {describe_token(t)}")
        return self.next()

    def is_word(self, w: str) -> bool:
        t = self.peek()
        return t.kind == "word" and t.value == w

    def skip_nl(self) -> None:
        while self.toks[self.i].kind == "nl":
            self.i += 1

    def skip_nl_before(self, w: str) -> bool:
        """Allow ``else``/``catch`` on the line after a ``}``."""
        j = self.i
        while self.toks[j].kind == "nl":
            j += 1
        t = self.toks[j]
        if t.kind == "word" and t.value == w:
            self.i = j
            return True
        return False

    # -- program -------------------------------------------------------------------------
    def program(self, closer: str) -> list[Node]:
        phrases: list[Node] = []
        toks = self.toks
        while True:
            k = toks[self.i].kind
            while k == "nl" or k == ";":
                self.i += 1
                k = toks[self.i].kind
            if k == closer:
                return phrases
            if k == "eof":
                raise self.fail(f"expected {closer}, found end of input")
            phrases.append(self.phrase())
            k = toks[self.i].kind
            if k not in ("nl", ";") and k != closer:
                raise self.fail(f"unexpected {describe_token(toks[self.i])}")

    def phrase(self, allow_let: bool = True) -> Node:
        t = self.peek()
        if t.kind == "word" and t.value in _KEYWORDS:
            nxt = self.toks[self.i + 1]
            # a keyword followed directly by a glued piece is an ordinary word (`iffy`-style)
            if nxt.sp or nxt.kind not in _PIECE:
                kw = t.value
                if kw == "let":
                    if not allow_let:
                        raise self.fail("let is not allowed here", t)
                    return self.let()
                if kw == "if":
                    return self.if_()
                if kw == "for":
                    return self.for_()
                if kw == "try":
                    return self.try_()
                if kw == "use":
                    self.next()
                    return Use(self.atom(), t.line, t.col)
                if kw == "return":
                    self.next()
                    if self.peek().kind in _PHRASE_END:
                        return Return(None, t.line, t.col)
                    return Return(self.phrase(allow_let=False), t.line, t.col)
        return self.command()

    def let(self) -> Node:
        t = self.next()
        rec = False
        if self.is_word("rec") and not (
            self.toks[self.i + 1].kind == "word" and self.toks[self.i + 1].value == "="
        ):
            self.next()
            rec = True
        nt = self.expect("word", "a name after let")
        name = str(nt.value)
        if not NAME_RE.match(name):
            if name == "=":
                raise self.fail("expected a name after let", nt)
            if "=" in name:
                raise self.fail("put spaces around = in let NAME = VALUE", nt)
            raise self.fail(f"bad name {name!r} after let", nt)
        eq = self.peek()
        if not (eq.kind == "word" and eq.value == "="):
            raise self.fail(f"expected = after let {name}, found {describe_token(eq)}")
        self.next()
        if self.peek().kind in _PHRASE_END:
            raise self.fail(f"expected a value after let {name} =")
        expr = self.phrase(allow_let=False)
        if rec and not (isinstance(expr, Block)):
            raise RalSyntaxError("let rec needs a block { |params| ... }", expr.line, expr.col)
        return Let(name, expr, rec, t.line, t.col)

    def body(self, what: str) -> Block:
        t = self.peek()
        if t.kind != "{":
            raise self.fail(f"expected {{ after {what}, found {describe_token(t)}")
        b = self.block()
        if b.params:
            raise RalSyntaxError(f"the body of {what} takes no parameters", b.line, b.col)
        return b

    def cond(self, what: str) -> Node:
        t = self.peek()
        if t.kind in _PHRASE_END or t.kind == "{":
            raise self.fail(f"expected a condition after {what}")
        return self.atom()

    def if_(self) -> Node:
        t = self.next()
        conds = [self.cond("if")]
        bodies = [self.body("if")]
        else_body: Block | None = None
        while self.skip_nl_before("else"):
            self.next()
            if self.is_word("if"):
                self.next()
                conds.append(self.cond("else if"))
                bodies.append(self.body("else if"))
                continue
            else_body = self.body("else")
            break
        return If(conds, bodies, else_body, t.line, t.col)

    def for_(self) -> Node:
        t = self.next()
        nt = self.expect("word", "a loop variable after for")
        if not NAME_RE.match(str(nt.value)):
            raise self.fail(f"bad loop variable {nt.value!r}", nt)
        if not self.is_word("in"):
            raise self.fail(f"expected in after for {nt.value}")
        self.next()
        it = self.cond("in")
        return For(str(nt.value), it, self.body("for"), t.line, t.col)

    def try_(self) -> Node:
        t = self.next()
        body = self.body("try")
        if not self.skip_nl_before("catch"):
            raise self.fail("expected catch NAME { ... } after try { ... }")
        self.next()
        nt = self.expect("word", "a name after catch")
        if not NAME_RE.match(str(nt.value)):
            raise self.fail(f"bad name {nt.value!r} after catch", nt)
        return Try(body, str(nt.value), self.body("catch"), t.line, t.col)

    def command(self) -> Node:
        head = self.atom()
        args: list[Node] = []
        toks = self.toks
        while True:
            k = toks[self.i].kind
            if k in _PHRASE_END:
                break
            if k in ("]", ",", "|"):
                raise self.fail(f"unexpected {describe_token(toks[self.i])}")
            args.append(self.atom())
        if not args and not (isinstance(head, Lit) and head.bare):
            return head
        return Cmd(head, args, head.line, head.col)

    # -- atoms ---------------------------------------------------------------------------
    def atom(self) -> Node:
        t = self.peek()
        k = t.kind
        if k in _PIECE:
            first = self.piece()
            nxt = self.peek()
            if nxt.sp or nxt.kind not in _PIECE:
                return first
            parts = [first]
            while not self.peek().sp and self.peek().kind in _PIECE:
                parts.append(self.piece())
            return Concat(parts, t.line, t.col)
        if k == "[":
            return self.nested(self.list_or_map)
        if k == "{":
            return self.nested(self.block)
        if k == "(":
            return self.nested(self.paren)
        raise self.fail(f"unexpected {describe_token(t)}")

    def nested(self, fn: Callable[[], Node]) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"nesting deeper than {MAX_NESTING} levels")
        try:
            return fn()
        finally:
            self.depth -= 1

    def piece(self) -> Node:
        t = self.next()
        k = t.kind
        if k == "word":
            return word_value(str(t.value), t.line, t.col)
        if k == "sq":
            return Lit(t.value, t.line, t.col)
        if k == "str":
            parts = t.value
            assert isinstance(parts, list)
            if len(parts) == 1 and isinstance(parts[0], str):
                return Lit(parts[0], t.line, t.col)
            return Interpolation(
                [p if isinstance(p, str) else Var(p[0], p[1], p[2]) for p in parts], t.line, t.col
            )
        node: Node = Var(str(t.value), t.line, t.col)
        while self.peek().kind == "[" and not self.peek().sp:
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.fail(f"nesting deeper than {MAX_NESTING} levels")
            b = self.next()
            if self.peek().kind not in _PIECE:
                raise self.fail("expected an index inside [ ]")
            key = self.atom()
            self.expect("]", "] after the index")
            self.depth -= 1
            node = Index(node, key, b.line, b.col)
        return node

    def paren(self) -> Node:
        t = self.next()
        if self.peek().kind == ")":
            raise self.fail("empty ( )")
        p = self.phrase(allow_let=False)
        self.expect(")", ") to close (")
        return Paren(p, t.line, t.col)

    def block(self) -> Block:
        t = self.next()
        self.skip_nl()
        params: list[str] = []
        if self.peek().kind == "|":
            self.next()
            while self.peek().kind != "|":
                pt = self.expect("word", "a parameter name")
                if not NAME_RE.match(str(pt.value)):
                    raise self.fail(f"bad parameter name {pt.value!r}", pt)
                if pt.value in params:
                    raise self.fail(f"duplicate parameter {pt.value}", pt)
                params.append(str(pt.value))
                if self.peek().kind == ",":
                    self.next()
                elif self.peek().kind != "|":
                    raise self.fail("expected , or | in the parameter list")
            self.next()
        body = self.program("}")
        close = self.next()
        src = self.text[t.pos : close.end]
        return Block(tuple(params), body, src, t.line, t.col)

    def list_or_map(self) -> Node:
        t = self.next()
        toks = self.toks
        if (
            toks[self.i].kind == "word"
            and toks[self.i].value == ":"
            and toks[self.i + 1].kind == "]"
        ):
            self.i += 2
            return MapLit([], [], t.line, t.col)
        items: list[Node] = []
        keys: list[str] = []
        values: list[Node] = []
        while toks[self.i].kind != "]":
            kt = toks[self.i]
            key: str | None = None
            if kt.kind == "word" and len(str(kt.value)) > 1 and str(kt.value).endswith(":"):
                key = str(kt.value)[:-1]
                self.i += 1
            elif kt.kind in ("str", "sq"):
                c = toks[self.i + 1]
                if c.kind == "word" and c.value == ":" and not c.sp:
                    if kt.kind == "str":
                        parts = kt.value
                        assert isinstance(parts, list)
                        if not (len(parts) == 1 and isinstance(parts[0], str)):
                            raise self.fail("a map key cannot interpolate", kt)
                        key = parts[0]
                    else:
                        key = str(kt.value)
                    self.i += 2
            if key is not None:
                if items:
                    raise self.fail("a literal mixes list items and map entries", kt)
                if toks[self.i].kind in (",", "]"):
                    raise self.fail(f"expected a value for key {key}")
                keys.append(key)
                values.append(self.atom())
            else:
                if keys:
                    raise self.fail("a literal mixes list items and map entries", kt)
                items.append(self.atom())
            k = toks[self.i].kind
            if k == ",":
                self.i += 1
            elif k != "]":
                raise self.fail(f"expected , or ] in a list, found {describe_token(toks[self.i])}")
        self.i += 1
        if keys:
            if len(set(keys)) != len(keys):
                raise RalSyntaxError("duplicate key in a map literal", t.line, t.col)
            return MapLit(keys, values, t.line, t.col)
        return ListLit(items, t.line, t.col)


def describe_token(t: Token) -> str:
    if t.kind == "eof":
        return "end of input"
    if t.kind == "nl":
        return "end of line"
    if t.kind == "word":
        return f"{t.value!r}"
    if t.kind == "var":
        return f"${t.value}"
    if t.kind in ("str", "sq"):
        return "a string"
    return t.kind


def parse(text: str, line: int = 1, col: int = 1) -> list[Node]:
    """Parse a whole program; raises :class:`RalSyntaxError` with line:col."""
    p = Parser(text, line, col)
    return p.program("eof")


def parse_block(source: str, line: int, col: int) -> Block:
    """Re-parse a closure's source span (``{ ... }``) placed at its original line:col."""
    p = Parser(source, line, col)
    if p.peek().kind != "{":
        raise p.fail("a closure source must start with {")
    b = p.block()
    if p.peek().kind != "eof":
        raise p.fail("trailing text after a closure source")
    return b


__all__ = ["MAX_NESTING", "parse", "parse_block", "word_value"]
