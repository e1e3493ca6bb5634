"""fsync functions for the durability tests: real fsyncs that count, or that wait on an Event
first (a slow disk), passed to :func:`runtime.state.durability.bind` / ``AppendFile`` -- the file
system is the real one."""

from __future__ import annotations

import os
import threading

from tests.support.waiting import HANG_GUARD


class CountingFsync:
    """A real fsync that counts, and remembers how far each one reached."""

    def __init__(self) -> None:
        self.calls = 0
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        os.fsync(fd)
        with self._lock:
            self.calls += 1
            self.sizes.append(size)


class GatedFsync(CountingFsync):
    """A real fsync that first blocks on ``release`` (a slow disk), saying when it is entered."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        self.entered.set()
        assert self.release.wait(HANG_GUARD), "the gated fsync was never released"
        super().__call__(fd)
