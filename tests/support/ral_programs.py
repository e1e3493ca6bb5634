"""Generated ral programs and a bounded runner: the fuzz test (tests/ral/test_ral_fuzz.py) and
its longer run (benchmarks/ral_fuzz.py) share them; and the few fixed programs that tests of the
in-process session and of the shell host both run (:func:`rendering_after_marker`).

Two kinds of input: grammar-shaped programs (strings with escapes and interpolation, lists,
maps, blocks, lets, closures, ``for``, ``if``, ``try``, ``return``, natives with odd arguments)
and text that is mostly not ral (random characters weighted towards the ones the lexer cares
about, and grammar programs with random edits).

A run has no exec grant and no file root (every program and file builtin is refused), and a
watchdog cancels it after a budget, so a generated infinite computation (``let rec f = { f; f
}``) ends like any cancelled run. The check accepts only typed outcomes: a result, or a ral
error of kind syntax, elaboration, runtime or cancelled. Any other exception escapes the run and
fails the caller with the program that raised it.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from exarch_actors.cli.ral import json_text
from exarch_actors.runtime.ral.codec import TOO_DEEP, decode_value, encode_value
from exarch_actors.runtime.ral.context import DynamicContext, Grants
from exarch_actors.runtime.ral.errors import CodecError, ValueTooLarge
from exarch_actors.runtime.ral.natives import NATIVES
from exarch_actors.runtime.ral.session import RECURSION_FLOOR, RunResult, Session
from exarch_actors.runtime.ral.values import render, values_equal

# A session raises the recursion limit when it is made; raise it first, so that Hypothesis,
# which restores the limit it found after each example, does not warn on every run.
sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_FLOOR))

KINDS = frozenset({"syntax", "elaboration", "runtime", "cancelled"})
"""The error kinds a run may end with; anything else is a finding."""

_NAMES = ("a", "b", "f", "g", "xs", "m", "n", "acc", "k-1")
_NATIVES = tuple(sorted(n for n in NATIVES if n != "sleep"))
_SIGNIFICANT = list("\"'\\$#{}[]()|;,: \t\n=-.0123456789abcxyz_\0é")

# -- grammar-shaped programs ---------------------------------------------------------------------
#
# Built from a seed with plain ``random`` rather than from Hypothesis combinators: measured here,
# a combinator-built program cost ~4.5 ms of generation, a seeded one well under 0.1 ms, and the
# fuzz must fit 10,000 examples in about 30 s of CPU. Hypothesis draws that seed (so a failure
# replays from its database) and the check reports the failing program's text.

_SMALL_INTS = [str(i) for i in range(-3, 13)]
_ODD_INTS = ["100", "1000", str(2**63), str(-(2**64)), str(10**30)]
_FLOATS = ["0.0", "1.5", "-2.25", "1.0e3", "1.0e308", "3.0e-5"]
_WORDS = ["x", "-", "a-b", "/tmp", "ok", "=", ":", "k:", "in", "rec", "else", "k-1"]
_DQ_PIECES = ["\\n", "\\t", "\\\\", '\\"', "\\$", "\\d", "$", "$a", "${b}", "$xs", "\\\n"]
_DQ_PIECES += ["abc", " ", "é", "\0", ""]
_SQ_CHARS = 'abc $\\"\n\0'
_CONSTS = ["true", "false", "unit", "[:]", "[]"]
_KEYS = ["a", "b", "k-1", '"x y"', "'q'", "x", "-"]


class Programs:
    """A random grammar-shaped program generator over one ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def program(self, depth: int) -> str:
        sep = self.r.choice(["\n", "; ", "\n\n"])
        return sep.join(self.phrase(depth) for _ in range(self.r.randint(1, 4)))

    def phrase(self, depth: int) -> str:
        r = self.r
        k = r.randrange(12)
        if k < 4:
            return self.command(depth)
        if k == 4:
            return self.atom(depth)
        if k == 5:
            rhs = self.command(depth) if r.random() < 0.6 else self.atom(depth)
            return f"let {r.choice(_NAMES)} = {rhs}"
        if k == 6:
            return f"let rec {r.choice(_NAMES)} = {self.block(depth)}"
        if k == 7:
            return f"if {self.cond(depth)} {{ {self.body(depth)} }} else {{ {self.body(depth)} }}"
        if k == 8:
            return f"for {r.choice(_NAMES)} in {self.cond(depth)} {{ {self.body(depth)} }}"
        if k == 9:
            return f"try {{ {self.body(depth)} }} catch e {{ {self.body(depth)} }}"
        if k == 10:
            return f"return {self.atom(depth)}"
        return f"let {r.choice(_NAMES)} = {self.atom(depth)}"

    def cond(self, depth: int) -> str:
        """What ``if`` and ``for ... in`` take: an atom other than a block."""
        return (
            f"({self.command(depth - 1)})" if depth > 0 and self.r.random() < 0.5 else self.leaf()
        )

    def body(self, depth: int) -> str:
        return self.program(depth - 1) if depth > 0 else self.leaf()

    def command(self, depth: int) -> str:
        r = self.r
        k = r.randrange(10)
        if k < 6:
            head = r.choice(_NATIVES)
        elif k < 8:
            head = r.choice(_NAMES)
        elif k == 8:
            head = "$" + r.choice(_NAMES)
        else:
            head = self.block(depth)
        args = [self.atom(depth) for _ in range(r.randint(0, 4))]
        return " ".join([head, *args])

    def block(self, depth: int) -> str:
        params = self.r.sample(_NAMES[:-1], self.r.randint(0, 3))
        opening = "{ |" + ", ".join(params) + "| " if params else "{ "
        return opening + self.body(depth) + " }"

    def atom(self, depth: int) -> str:
        r = self.r
        if depth <= 0 or r.random() < 0.45:
            return self.leaf()
        k = r.randrange(6)
        if k == 0:
            return "[" + ", ".join(self.atom(depth - 1) for _ in range(r.randint(0, 4))) + "]"
        if k == 1:
            keys = r.sample(_KEYS, r.randint(1, 3))
            kvs = [f"{k}: {self.atom(depth - 1)}" for k in keys]
            return "[" + ", ".join(kvs) + "]"
        if k == 2:
            return f"${r.choice(_NAMES)}[{r.choice([self.leaf(), '0', '-1', 'a'])}]"
        if k == 3:
            return self.block(depth - 1)
        return f"({self.command(depth - 1)})"

    def leaf(self) -> str:
        r = self.r
        k = r.randrange(10)
        if k < 2:
            return "$" + r.choice(_NAMES)
        if k == 2:
            return r.choice(_SMALL_INTS) if r.random() < 0.9 else r.choice(_ODD_INTS)
        if k == 3:
            return r.choice(_FLOATS)
        if k == 4:
            return r.choice(_WORDS)
        if k == 5:
            return '"' + "".join(r.choice(_DQ_PIECES) for _ in range(r.randint(0, 4))) + '"'
        if k == 6:
            return "'" + "".join(r.choice(_SQ_CHARS) for _ in range(r.randint(0, 5))) + "'"
        if k == 7:
            return r.choice(_CONSTS)
        return r.choice(_SMALL_INTS)


PRELUDE = (
    "let a = 1; let b = 'two'; let f = { |x| $x }; let g = $add; let xs = [1, [2], 'z']; "
    "let m = [a: 1, b: [c: unit]]; let n = 3; let acc = []; let k-1 = variant ok 1.5\n"
)
"""Binds every name the generator uses, so most programs get past elaboration."""


def grammar_program(seed: int) -> str:
    """A grammar-shaped program nested up to two blocks deep; most start with :data:`PRELUDE`."""
    rng = random.Random(seed)
    text = Programs(rng).program(2)
    return PRELUDE + text if rng.random() < 0.8 else text


def mutated_program(seed: int) -> str:
    """A grammar program with a few random edits: the parser's error paths."""
    rng = random.Random(seed)
    text = Programs(rng).program(2)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randrange(4))
        op = rng.randrange(3)
        if op == 0:
            text = text[:i] + rng.choice(_SIGNIFICANT) + text[i:]
        elif op == 1:
            text = text[:i] + text[j:]
        else:
            text = text[:i] + text[i:j] * 2 + text[j:]
    return text


SEEDS = st.integers(min_value=0, max_value=2**64 - 1)

GRAMMAR = SEEDS.map(grammar_program)
"""Grammar-shaped programs (see :class:`Programs`)."""

TEXT = st.one_of(
    st.text(alphabet=st.one_of(st.sampled_from(_SIGNIFICANT), st.characters()), max_size=200),
    SEEDS.map(mutated_program),
)
"""Text that is mostly not ral: random characters, or a grammar program with random edits."""

# -- running -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    source: str
    result: RunResult
    seconds: float


def run_bounded(source: str, cwd: str, budget: float) -> Outcome:
    """Run ``source`` in a fresh session with no exec grant and no file root; the run is
    cancelled ``budget`` seconds after it starts. Raises whatever the run raises untyped."""
    ctx = DynamicContext(cwd=cwd, env={"PATH": cwd}, grants=Grants(frozenset(), ()))
    session = Session(context=ctx, faults=False)
    timer = threading.Timer(budget, session.cancel, args=("fuzz budget",))
    timer.daemon = True
    t0 = time.monotonic()
    timer.start()
    try:
        result = session.run(source)
    finally:
        seconds = time.monotonic() - t0
        timer.cancel()
        timer.join()
        session.close()
    return Outcome(source, result, seconds)


def check(o: Outcome, limit: float) -> None:
    """The fuzz contract: a typed outcome within ``limit`` seconds, and a result value that
    renders, prints as JSON, and survives the codec (or is refused as too deep, or as too large
    written out: a value that shares structure, ``[$a, $a]`` repeated)."""
    r = o.result
    assert o.seconds <= limit, f"run took {o.seconds:.2f} s (limit {limit} s): {o.source!r}"
    if r.error is not None:
        assert r.error.kind in KINDS, (r.error, o.source)
        return
    render(r.value)
    json_text(r.value)
    try:
        back = decode_value(encode_value(r.value))
    except ValueTooLarge:
        return
    except CodecError as e:
        assert str(e) == TOO_DEEP, (str(e), o.source)
        return
    assert values_equal(back, r.value), o.source


def rendering_after_marker(marker: Path) -> str:
    """A script that builds a value of 2**23 leaves in a local binding (nothing to encode),
    writes ``marker``, then renders the value."""
    return (
        f"try {{ let x = fold {{ |a, x| [$a, $a] }} [1] (range 23); "
        f'write-text "{marker}" go; echo $x }} catch e {{ fail $e[message] }}'
    )
