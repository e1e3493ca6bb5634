"""Imported last by the fork server (``actors.process.PRELOAD``): what every agent process,
shell host and worker would otherwise do for itself after its fork, done once before any fork.

- Caches filled lazily on first use are filled here, so a child inherits them: the system
  prompt's files (:func:`runtime.prompt.preload`). With them and ``prctl`` loaded at import
  (:mod:`actors.process`), a forked agent process imports no module before its ``Born``
  (``tests/agent_host/test_spawn_path.py`` checks what it inherits).
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

import gc

from runtime.prompt import preload

preload()
gc.freeze()
