"""Syntax tree of a ral program. Every node carries a 1-based ``line``/``col``.

``occ`` (the names a node mentions) is filled in by the elaborator, once per node: a frozenset
that a parent unions from its children's already-computed sets (see ``runtime.ral.compile``).
"""

from __future__ import annotations

from typing import Any

EMPTY: frozenset[str] = frozenset()


class Node:
    __slots__ = ("col", "line", "occ")

    def __init__(self, line: int, col: int) -> None:
        self.line = line
        self.col = col
        self.occ: frozenset[str] = EMPTY


class Lit(Node):
    """A literal: number, bool, unit, a bare word in argument position, a '...' string."""

    __slots__ = ("bare", "value")

    def __init__(self, value: Any, line: int, col: int, bare: bool = False) -> None:
        super().__init__(line, col)
        self.value = value
        self.bare = bare  # a bare word that is not a number/bool/unit: a command name in head


class Var(Node):
    __slots__ = ("name",)

    def __init__(self, name: str, line: int, col: int) -> None:
        super().__init__(line, col)
        self.name = name


class Index(Node):
    """``$xs[0]``, ``$m[key]``, ``$m[$k]`` (chains: ``$m[a][0]``)."""

    __slots__ = ("key", "target")

    def __init__(self, target: Node, key: Node, line: int, col: int) -> None:
        super().__init__(line, col)
        self.target = target
        self.key = key


class Interpolation(Node):
    """A ``"..."`` string with at least one ``$name`` to interpolate."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[str | Var], line: int, col: int) -> None:
        super().__init__(line, col)
        self.parts = parts


class Concat(Node):
    """Adjacent word pieces with no space between (``$dir/file``): joined as a string."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Node], line: int, col: int) -> None:
        super().__init__(line, col)
        self.parts = parts


class ListLit(Node):
    __slots__ = ("items",)

    def __init__(self, items: list[Node], line: int, col: int) -> None:
        super().__init__(line, col)
        self.items = items


class MapLit(Node):
    __slots__ = ("keys", "values")

    def __init__(self, keys: list[str], values: list[Node], line: int, col: int) -> None:
        super().__init__(line, col)
        self.keys = keys
        self.values = values


class Block(Node):
    """``{ |a, b| ... }``: a closure literal, or the body of if/for/try (then ``params`` is ())."""

    __slots__ = ("body", "code", "params", "source")

    def __init__(
        self, params: tuple[str, ...], body: list[Node], source: str, line: int, col: int
    ) -> None:
        super().__init__(line, col)
        self.params = params
        self.body = body
        self.source = source
        self.code: Any = None  # the compiled BlockCode, set by the elaborator


class Paren(Node):
    __slots__ = ("phrase",)

    def __init__(self, phrase: Node, line: int, col: int) -> None:
        super().__init__(line, col)
        self.phrase = phrase


class Cmd(Node):
    """``HEAD ARG ...``; ``name`` is set when HEAD is a bare word."""

    __slots__ = ("args", "head", "name")

    def __init__(self, head: Node, args: list[Node], line: int, col: int) -> None:
        super().__init__(line, col)
        self.head = head
        self.args = args
        self.name: str | None = head.value if isinstance(head, Lit) and head.bare else None


class Let(Node):
    __slots__ = ("expr", "name", "rec")

    def __init__(self, name: str, expr: Node, rec: bool, line: int, col: int) -> None:
        super().__init__(line, col)
        self.name = name
        self.expr = expr
        self.rec = rec


class If(Node):
    __slots__ = ("bodies", "conds", "else_body")

    def __init__(
        self,
        conds: list[Node],
        bodies: list[Block],
        else_body: Block | None,
        line: int,
        col: int,
    ) -> None:
        super().__init__(line, col)
        self.conds = conds
        self.bodies = bodies
        self.else_body = else_body


class For(Node):
    __slots__ = ("body", "iterable", "var")

    def __init__(self, var: str, iterable: Node, body: Block, line: int, col: int) -> None:
        super().__init__(line, col)
        self.var = var
        self.iterable = iterable
        self.body = body


class Try(Node):
    __slots__ = ("body", "handler", "var")

    def __init__(self, body: Block, var: str, handler: Block, line: int, col: int) -> None:
        super().__init__(line, col)
        self.body = body
        self.var = var
        self.handler = handler


class Use(Node):
    __slots__ = ("path",)

    def __init__(self, path: Node, line: int, col: int) -> None:
        super().__init__(line, col)
        self.path = path


class Return(Node):
    __slots__ = ("expr",)

    def __init__(self, expr: Node | None, line: int, col: int) -> None:
        super().__init__(line, col)
        self.expr = expr
