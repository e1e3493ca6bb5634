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
- The garbage collector's heap is frozen (:func:`gc.freeze`): every object the fork server
  holds moves to the permanent generation, so a child's collections never walk (and write
  the GC headers of) the tens of thousands of objects it inherited, which would copy their
  pages one by one (copy-on-write) during its first milliseconds. That is CPython's advice for
  a pre-fork server.

Importing this module anywhere else is harmless (the caches are filled, and a frozen object is
still freed by reference counting) but pointless: only the fork server's children profit.

Measured (cProfile of 31 back-to-back spawns, 2 cores, load average ~40): an agent process
spent ~10 ms of its spawn importing ``ctypes``, ``importlib.resources`` readers, ``zipfile``
and reading the prompt files; a shell host ~4 ms importing ``ctypes``.
"""

from __future__ import annotations

import copyreg
import dataclasses
import gc
import sys

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


preload()
cache_slot_names()
gc.freeze()
