"""Imported last by the fork server (``actors.process.PRELOAD``): what every agent process,
shell host and worker would otherwise do for itself after its fork, done once before any fork.

- Caches filled lazily on first use are filled here, so a child inherits them: the system
  prompt's files (:func:`runtime.prompt.preload`). With them and ``prctl`` loaded at import
  (:mod:`actors.process`), a forked agent process imports no module before its ``Born``
  (``tests/agent_host/test_spawn_path.py`` checks what it inherits).
- Every dataclass of the runtime and the actors has the slot names pickle looks up cached
  (``copyreg._slotnames`` stores ``__slotnames__`` on the class the first time an instance
  is pickled): an agent process pickles its last event batch and its ``EndReport`` at its end,
  and it cost each of the 100 agents of a cancel cascade five such first-time look-ups, each a
  walk of the class's MRO and a write to a class its parent shares (a copied page, and the
  type's attribute cache invalidated).
- A few ral calls run in a throwaway session (:func:`run_ral`): the interpreter's code is
  then specialised (CPython 3.11 rewrites a function's bytecode in place as it warms up) and
  the type attribute cache holds what a shell host looks up, so a host forked afterwards
  writes fewer of the pages it shares with the fork server. Measured (100 and 300 idle
  agents, two runs each way, interleaved with main): ~50 fewer minor faults per shell host
  and ~20 per agent process, PSS per agent 12.84 -> 12.54 MiB.
- The free blocks of pymalloc's partly used pools are taken (:func:`fill_free_blocks`), so a
  child's new objects go to pools of its own instead of one per shared page.
- The C heap's free pages are given back (:func:`trim_malloc`).
- The garbage collector's heap is frozen (:func:`gc.freeze`): every object the fork server
  holds moves to the permanent generation, so a child's collections never walk (and write
  the GC headers of) the tens of thousands of objects it inherited, which would copy their
  pages one by one (copy-on-write) during its first milliseconds. That is CPython's advice for
  a pre-fork server.

Importing this module anywhere else is harmless (the caches are filled, and a frozen object is
still freed by reference counting; the ral warm-up and the filling run only in a process of a
single thread) but pointless: only the fork server's children profit.

Measured (cProfile of 31 back-to-back spawns, 2 cores, load average ~40): an agent process
spent ~10 ms of its spawn importing ``ctypes``, ``importlib.resources`` readers, ``zipfile``
and reading the prompt files; a shell host ~4 ms importing ``ctypes``.
"""

from __future__ import annotations

import copyreg
import dataclasses
import gc
import os
import sys
import tempfile
import threading

from exarch_actors.runtime.prompt import preload


def cache_slot_names() -> int:
    """Cache pickle's slot names on every dataclass of the loaded ``runtime`` and ``actors``
    modules; how many it cached (~1 ms for 137 classes, once per fork server)."""
    cached = 0
    for name, module in list(sys.modules.items()):
        if module is None or module.__name__ != name:
            continue
        if not name.startswith(("exarch_actors.runtime.", "exarch_actors.actors.")):
            continue
        for value in list(vars(module).values()):
            if (
                isinstance(value, type)
                and value.__module__ == name
                and "__slotnames__" not in value.__dict__
                and dataclasses.is_dataclass(value)
            ):
                copyreg._slotnames(value)  # type: ignore[attr-defined]
                cached += 1
    return cached


WARM_RAL = (
    'let n = add 1 (mul 2 3); "n=$n"',
    'for i in (range 3) { let x = "c-$i" }',
    '[a: 1, b: [2, 3], c: "d"]',
    "let rec fact = { |n| if (lt $n 2) { 1 } else { mul $n (fact (sub $n 1)) } }; fact 5",
)
"""Phrases :func:`run_ral` runs: in-memory only (no program, no file, no sleep, no worker),
so the fork server starts nothing and keeps no state of theirs but warm caches."""

WARM_RUNS = 20
"""Each phrase this many times: past CPython 3.11's warm-up threshold (8 calls) for a code
object to be specialised."""


ral_warmed = False
"""Whether this process ran :func:`run_ral` (the fork server: what its children inherit)."""


def run_ral() -> None:
    """Run :data:`WARM_RAL` in a throwaway session, as a shell host would after its fork.
    The recursion limit a session raises is put back (an agent process keeps the
    interpreter's own). A session starts no thread (its workers start only for ``spawn``),
    so the fork server still forks from a single thread. A failure only leaves the warm-up
    undone: an exception out of this module's import would end the fork server (the stdlib
    skips only an ``ImportError`` of a preloaded module)."""
    global ral_warmed
    limit = sys.getrecursionlimit()
    try:
        from exarch_actors.runtime.ral.session import Session

        session = Session()
        try:
            for _ in range(WARM_RUNS):
                for source in WARM_RAL:
                    session.run(source)
        finally:
            session.close()
        ral_warmed = True
    except Exception:
        pass
    finally:
        sys.setrecursionlimit(limit)


def free_blocks() -> dict[int, int]:
    """pymalloc's free blocks in partly used pools, per size class in bytes, read from
    ``sys._debugmallocstats`` (CPython's, written to the C ``stderr``: fd 2 is pointed at a
    temporary file for the call). Empty where there is no such report."""
    report = getattr(sys, "_debugmallocstats", None)
    if report is None:
        return {}
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            report()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found: dict[int, int] = {}
    for line in text.splitlines():  # "class size num-pools blocks-in-use avail-blocks"
        parts = line.split()
        if len(parts) == 5 and all(p.isdigit() for p in parts):
            found[int(parts[1])] = int(parts[4])
    return found


_FILLERS: list[object] = []
"""The objects :func:`fill_free_blocks` placed, kept for the fork server's life."""


def fill_free_blocks() -> int:
    """Fill every free block of pymalloc's partly used pools with an object kept for good;
    how many it placed.

    A child places its new small objects first in the free blocks of the pools it inherited
    partly used, each in a page it shares with the fork server and its siblings: one object
    copies a whole 4 KiB page. With those blocks taken, a child's new objects go to pools of
    its own, side by side. Measured (100 idle agents, two runs each way, interleaved):
    ~4,000 objects placed, ~50 fewer faults per agent process and ~40 per shell host, PSS
    12.66 -> 12.32 MiB per agent. Filling the arenas' unused pools as well saved nothing more
    (a child's objects then go to an arena of its own: same pages, 12.35 MiB). A 16-byte
    block takes a bare ``object()``, a 32-byte one a float, a larger one ``bytes`` of the
    class's size."""
    placed = 0
    try:
        stats = free_blocks()
    except (OSError, ValueError):  # no temporary file, no fd 2: nothing filled, nothing lost
        return 0
    for size, free in stats.items():
        for _ in range(free):
            _FILLERS.append(_filler(size, placed))
            placed += 1
    return placed


def _filler(size: int, n: int) -> object:
    if size <= 16:
        return object()
    if size <= 32:
        return float(n)
    return bytes(size - BYTES_HEADER)


BYTES_HEADER = sys.getsizeof(b"x") - 1
"""A ``bytes`` object's size beyond its payload (33 on 64-bit CPython 3.11)."""


malloc_trimmed = False
"""Whether :func:`trim_malloc` gave the C heap's free pages back (glibc only)."""


def trim_malloc() -> bool:
    """Give the free pages inside the C heap back to the kernel (glibc's ``malloc_trim``).

    A child that reuses a free chunk of the heap it inherited then writes to a fresh page of
    its own, not to a page it shares (and copies) with the fork server. Measured (100 idle
    agents, two runs each way, interleaved): ~15 fewer faults per agent process and ~10 per
    shell host, PSS 12.38 -> 12.28 MiB per agent. Elsewhere than glibc: nothing."""
    global malloc_trimmed
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    malloc_trimmed = True
    return True


preload()
cache_slot_names()
if threading.active_count() == 1:  # the fork server; elsewhere the warm-up is pointless
    run_ral()
    fill_free_blocks()  # last: the warm-up's own objects are in place by now
    trim_malloc()
gc.freeze()
