"""The elaborator: checks scopes, computes ``occ`` and compiles each node to a Python closure.

One pass over the tree, one visit per node (counted in :data:`STATS` so tests can prove the
harvest is linear). For each node it

- refuses a ``$name`` that no scope binds (``undefined variable name``), before anything runs;
- computes ``occ``: the names the node mentions (variable occurrences and command-head names,
  bound or not), unioned from the children's already-computed sets; the run's referenced names
  are the union of its phrases' ``occ`` (:func:`harvest`), so a stored closure body is never
  walked again;
- resolves every name statically to an activation depth (or to "global": Σ, then a program on PATH)
  and compiles to a closure ``ev(activation) -> value`` — per-node dispatch is decided here, once.

Scopes mirror activations (:mod:`runtime.ral.calls`) one to one. A closure captures, at
creation, exactly the outer bindings its body resolves outward -- its free variables and the
command heads that resolve to bindings -- by value; so rebinding or removing a session name later
never changes what a closure holds (the session scope is copy-on-write from every closure's
point of view).

``use PATH`` is compiled here too: it reads, parses and compiles the file when it runs
(:func:`use_file`), so the elaborator is the one place that turns source into code.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from exarch_actors.runtime.ral.calls import (
    MAX_DEPTH,
    Activation,
    BlockCode,
    Ev,
    ReturnSignal,
    apply,
    call_closure,
    call_native,
    index_value,
)
from exarch_actors.runtime.ral.errors import RalError, RalSyntaxError
from exarch_actors.runtime.ral.files import read_bytes
from exarch_actors.runtime.ral.interp import Interp, check_cancel
from exarch_actors.runtime.ral.nodes import (
    EMPTY,
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
from exarch_actors.runtime.ral.parser import parse
from exarch_actors.runtime.ral.values import UNIT, Closure, render, type_name


class Stats:
    """Node visits by the elaborator (each node is visited exactly once per compile)."""

    visits = 0


STATS = Stats()


class NameSet(Protocol):
    """What elaboration does with a scope's bound names: ask and add."""

    def __contains__(self, name: object, /) -> bool: ...

    def add(self, name: str, /) -> None: ...


class Overlay:
    """A bound set over a live collection of names, adding to a set of its own: the session
    scope of one compile without copying the scope (copying 100,000 names cost ~3 ms a run)."""

    __slots__ = ("added", "base")

    def __init__(self, base: Collection[str]) -> None:
        self.base = base
        self.added: set[str] = set()

    def __contains__(self, name: object) -> bool:
        return name in self.added or name in self.base

    def add(self, name: str) -> None:
        self.added.add(name)


class Scope:
    """An elaboration scope, one per runtime activation."""

    __slots__ = ("captures", "kind", "names", "parent")

    def __init__(self, kind: str, names: NameSet, parent: Scope | None) -> None:
        self.kind = kind  # "session" | "frame" | "closure"
        self.names = names
        self.parent = parent
        self.captures: dict[str, int] = {}


def resolve(scope: Scope, name: str) -> int | None:
    """Activation depth at which ``name`` lives at runtime, or None for global (Σ / PATH)."""
    d = 0
    s = scope
    while True:
        if name in s.names:
            return d
        if s.kind == "closure":
            if name in s.captures:
                return d
            if s.parent is None:
                return None
            outer = resolve(s.parent, name)
            if outer is None:
                return None
            s.captures[name] = outer
            return d
        if s.parent is None:
            return None
        s = s.parent
        d += 1


def getter(name: str, depth: int) -> Ev:
    if depth == 0:
        return lambda f: f.vars[name]
    if depth == 1:
        return lambda f: f.parent.vars[name]  # type: ignore[union-attr]

    def deep(f: Activation) -> Any:
        g: Any = f
        for _ in range(depth):
            g = g.parent
        return g.vars[name]

    return deep


# -- the elaborator --------------------------------------------------------------------------


class Elaborator:
    """Compiles nodes against a scope chain. ``lenient`` (re-parsed closures) defers unbound
    ``$name`` checks to runtime, since the scope they were checked in is gone."""

    def __init__(self, sigma: set[str] | frozenset[str], lenient: bool = False) -> None:
        self.sigma = sigma
        self.lenient = lenient

    def program(self, phrases: list[Node], scope: Scope) -> list[Ev]:
        return [self.node(p, scope) for p in phrases]

    def node(self, n: Node, scope: Scope) -> Ev:
        STATS.visits += 1
        return _DISPATCH[type(n)](self, n, scope)

    # atoms
    def lit(self, n: Lit, scope: Scope) -> Ev:
        v = n.value
        return lambda f: v

    def var(self, n: Var, scope: Scope) -> Ev:
        name = n.name
        n.occ = frozenset((name,))
        d = resolve(scope, name)
        if d is not None:
            return getter(name, d)
        if not self.lenient and name not in self.sigma:
            raise RalSyntaxError(f"undefined variable {name}", n.line, n.col, "elaboration")
        line, col = n.line, n.col
        return lambda f: f.it.global_value(name, line, col)

    def index(self, n: Index, scope: Scope) -> Ev:
        tgt = self.node(n.target, scope)
        key = self.node(n.key, scope)
        n.occ = n.target.occ | n.key.occ
        line, col = n.line, n.col

        def ev(f: Activation) -> Any:
            return index_value(tgt(f), key(f), line, col)

        return ev

    def interpolation(self, n: Interpolation, scope: Scope) -> Ev:
        parts: list[Any] = []
        names: list[str] = []
        for p in n.parts:
            if isinstance(p, str):
                parts.append(p)
            else:
                parts.append(self.node(p, scope))
                names.append(p.name)
        n.occ = frozenset(names)
        return _joiner(parts)

    def concat(self, n: Concat, scope: Scope) -> Ev:
        evs = [self.node(p, scope) for p in n.parts]
        n.occ = _union(n.parts)
        return _joiner(evs)

    def list_(self, n: ListLit, scope: Scope) -> Ev:
        evs = [self.node(x, scope) for x in n.items]
        n.occ = _union(n.items)
        if all(isinstance(x, Lit) for x in n.items):
            const = [
                x.value for x in n.items if isinstance(x, Lit)
            ]  # lists are never mutated in place: share it
            return lambda f: const
        return lambda f: [e(f) for e in evs]

    def map_(self, n: MapLit, scope: Scope) -> Ev:
        keys = n.keys
        evs = [self.node(x, scope) for x in n.values]
        n.occ = _union(n.values)
        if not keys:
            return lambda f: {}
        return lambda f: dict(zip(keys, [e(f) for e in evs]))

    def paren(self, n: Paren, scope: Scope) -> Ev:
        ev = self.node(n.phrase, scope)
        n.occ = n.phrase.occ
        return ev

    def block(self, n: Block, scope: Scope, rec_name: str | None = None) -> Ev:
        names = set(n.params)
        if rec_name is not None:
            names.add(rec_name)
        inner = Scope("closure", names, scope)
        run = self.sequence(n.body, inner)
        n.occ = _union(n.body)
        caps = tuple((name, getter(name, d)) for name, d in inner.captures.items())
        code = BlockCode(n.params, run, caps, n.source, n.line, n.col, n.occ)
        n.code = code
        if not caps:
            return lambda f: Closure(code, {}, rec_name)
        return lambda f: Closure(code, {name: g(f) for name, g in caps}, rec_name)

    # phrases
    def cmd(self, n: Cmd, scope: Scope) -> Ev:
        args = [self.node(a, scope) for a in n.args]
        line, col = n.line, n.col
        name = n.name
        if name is not None:
            STATS.visits += 1  # the head word
            n.occ = frozenset((name,)).union(*(a.occ for a in n.args))
            d = resolve(scope, name)
            if d is None:
                return _global_cmd(name, args, line, col)
            get = getter(name, d)

            def local_cmd(f: Activation) -> Any:
                v = get(f)
                if type(v) is Closure:
                    return call_closure(f.it, v, [a(f) for a in args], line, col, name)
                return apply(f.it, v, [a(f) for a in args], line, col, name)

            return local_cmd
        head_node = n.head
        if isinstance(head_node, Lit):
            raise RalSyntaxError(
                f"{render(head_node.value, nested=True)} is not a command", line, col, "elaboration"
            )
        head = self.node(head_node, scope)
        n.occ = _union([head_node, *n.args])

        def dyn_cmd(f: Activation) -> Any:
            return apply(f.it, head(f), [a(f) for a in args], line, col)

        return dyn_cmd

    def let(self, n: Let, scope: Scope) -> Ev:
        name = n.name
        if n.rec:
            assert isinstance(n.expr, Block)
            STATS.visits += 1
            ev = self.block(n.expr, scope, rec_name=name)
        else:
            ev = self.node(n.expr, scope)
        n.occ = n.expr.occ
        scope.names.add(name)
        if scope.kind == "session":

            def session_let(f: Activation) -> Any:
                f.it.define(name, ev(f))
                return UNIT

            return session_let

        def local_let(f: Activation) -> Any:
            f.vars[name] = ev(f)
            return UNIT

        return local_let

    def body(self, b: Block, scope: Scope, bind: tuple[str, ...] = ()) -> tuple[Ev, bool]:
        """An if/for/try body run inline; returns (runner, needs its own frame)."""
        STATS.visits += 1
        own = bool(bind) or any(isinstance(p, Let) for p in b.body)
        inner = Scope("frame", set(bind), scope) if own else scope
        run = self.sequence(b.body, inner)
        b.occ = _union(b.body)
        return run, own

    def inline(self, b: Block, scope: Scope) -> Ev:
        run, own = self.body(b, scope)
        if not own:
            return run
        return lambda f: run(Activation({}, f, f.it))

    def sequence(self, phrases: list[Node], scope: Scope) -> Ev:
        evs = [self.node(p, scope) for p in phrases]
        if not evs:
            return lambda f: UNIT
        if len(evs) == 1:
            only = evs[0]

            def one(f: Activation) -> Any:
                if f.it.stop:
                    check_cancel(f.it)
                return only(f)

            return one

        def seq(f: Activation) -> Any:
            it = f.it
            v: Any = UNIT
            for e in evs:
                if it.stop:
                    check_cancel(it)
                v = e(f)
            return v

        return seq

    def if_(self, n: If, scope: Scope) -> Ev:
        conds = [self.node(c, scope) for c in n.conds]
        bodies = [self.inline(b, scope) for b in n.bodies]
        other = self.inline(n.else_body, scope) if n.else_body is not None else None
        kids: list[Node] = [*n.conds, *n.bodies]
        if n.else_body is not None:
            kids.append(n.else_body)
        n.occ = _union(kids)
        if len(conds) == 1:
            c0, b0 = conds[0], bodies[0]
            if other is None:
                return lambda f: b0(f) if _truthy(c0(f)) else UNIT
            o = other
            return lambda f: b0(f) if _truthy(c0(f)) else o(f)
        pairs = list(zip(conds, bodies))

        def chain(f: Activation) -> Any:
            for c, b in pairs:
                if _truthy(c(f)):
                    return b(f)
            return other(f) if other is not None else UNIT

        return chain

    def for_(self, n: For, scope: Scope) -> Ev:
        seq_ev = self.node(n.iterable, scope)
        run, _ = self.body(n.body, scope, bind=(n.var,))
        n.occ = n.iterable.occ | n.body.occ
        var, line, col = n.var, n.line, n.col

        def loop(f: Activation) -> Any:
            it = f.it
            xs = seq_ev(f)
            t = type(xs)
            if t is dict:
                xs = list(xs)
            elif t is not list:
                raise RalError(f"for: cannot iterate a {type_name(xs)}", line, col)
            nf = Activation({}, f, it)
            vs = nf.vars
            for x in xs:
                if it.stop:
                    check_cancel(it)
                vs[var] = x
                run(nf)
            return UNIT

        return loop

    def try_(self, n: Try, scope: Scope) -> Ev:
        body = self.inline(n.body, scope)
        handler, _ = self.body(n.handler, scope, bind=(n.var,))
        n.occ = n.body.occ | n.handler.occ
        var = n.var

        def trying(f: Activation) -> Any:
            try:
                return body(f)
            except RalError as e:
                info = {"message": e.message, "line": e.line, "col": e.col}
                return handler(Activation({var: info}, f, f.it))

        return trying

    def use(self, n: Use, scope: Scope) -> Ev:
        path = self.node(n.path, scope)
        n.occ = n.path.occ
        line, col = n.line, n.col
        return lambda f: use_file(f.it, path(f), line, col)

    def return_(self, n: Return, scope: Scope) -> Ev:
        if n.expr is None:

            def ret_unit(f: Activation) -> Any:
                raise ReturnSignal(UNIT)

            return ret_unit
        ev = self.node(n.expr, scope)
        n.occ = n.expr.occ

        def ret(f: Activation) -> Any:
            raise ReturnSignal(ev(f))

        return ret


def _truthy(v: Any) -> bool:
    return not (v is False or v is UNIT)


def _union(nodes: list[Node] | list[Any]) -> frozenset[str]:
    occs = [x.occ for x in nodes if x.occ]
    if not occs:
        return EMPTY
    if len(occs) == 1:
        return occs[0]
    return frozenset().union(*occs)


def _text(v: Any) -> str:
    return v if type(v) is str else render(v)


def _joiner(parts: list[Any]) -> Ev:
    fixed: list[tuple[str, Any]] = [(p, None) if isinstance(p, str) else ("", p) for p in parts]

    def join(f: Activation) -> str:
        return "".join([s if e is None else _text(e(f)) for s, e in fixed])

    return join


def _global_cmd(name: str, args: list[Ev], line: int, col: int) -> Ev:
    def ev(f: Activation) -> Any:
        it = f.it
        argv = [a(f) for a in args]
        if name in it.sigma:
            return call_native(it, name, argv, line, col)
        return it.run_program(name, argv, line, col)

    return ev


def harvest(phrases: list[Node]) -> frozenset[str]:
    """The referenced names of a compiled program: the union of its phrases' ``occ``."""
    STATS.visits += len(phrases)
    return _union(phrases)


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while building a tree: every object made is live, so collections
    only rescan a growing heap. Measured on 100k phrases: compile 81 -> 11 µs/phrase, and the
    per-phrase cost stops growing with program size."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def compile_program(
    phrases: list[Node], scope: Scope, sigma: set[str] | frozenset[str], lenient: bool = False
) -> list[Ev]:
    """Elaborate and compile; raises :class:`RalSyntaxError` (kind ``elaboration``).

    ``sigma`` is what Σ answers now (natives and advertised desk verbs): a ``$name`` it holds is
    bound; a bare head never needs to be bound (it may be a program).
    """
    return Elaborator(sigma, lenient).program(phrases, scope)


def use_file(it: Interp, p: Any, line: int, col: int) -> Any:
    """``use PATH``: run a file in a fresh activation below the session scope; its harvest
    counts (reported to ``it.on_harvest`` before any of its phrases runs)."""
    try:
        text = read_bytes(it, p, "use").decode("utf-8")
    except UnicodeDecodeError as e:
        raise RalError(f"use: cannot read {p}: {e}", line, col) from None
    except RalError as e:
        raise RalError(e.message, line, col) from None
    rho = it.session_vars
    outer = Scope("session", set(rho), None) if rho is not None else None
    scope = Scope("frame", set(), outer)
    try:
        with no_gc():
            phrases = parse(text)
            evs = compile_program(phrases, scope, set(it.sigma))
    except RalSyntaxError as e:
        raise RalError(f"use {p}: {e.line}:{e.col} {e.message}", line, col) from None
    names = harvest(phrases)
    it.referenced |= names
    if it.on_harvest is not None:
        it.on_harvest(names)
    act = Activation({}, Activation(rho, None, it) if rho is not None else None, it)
    it.depth += 1
    try:
        if it.depth > MAX_DEPTH:
            raise RalError("recursion limit: use nested too deeply", line, col)
        v: Any = UNIT
        for ev in evs:
            if it.stop:
                check_cancel(it)
            v = ev(act)
        return v
    except ReturnSignal as r:
        return r.value
    finally:
        it.depth -= 1


_DISPATCH: dict[type, Callable[[Elaborator, Any, Scope], Ev]] = {
    Lit: Elaborator.lit,
    Var: Elaborator.var,
    Index: Elaborator.index,
    Interpolation: Elaborator.interpolation,
    Concat: Elaborator.concat,
    ListLit: Elaborator.list_,
    MapLit: Elaborator.map_,
    Block: Elaborator.block,
    Paren: Elaborator.paren,
    Cmd: Elaborator.cmd,
    Let: Elaborator.let,
    If: Elaborator.if_,
    For: Elaborator.for_,
    Try: Elaborator.try_,
    Use: Elaborator.use,
    Return: Elaborator.return_,
}
