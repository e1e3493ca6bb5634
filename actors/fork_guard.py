"""Imported by the fork server (``actors.process.PRELOAD``): a fork request its client abandons
is refused, not fatal.

CPython's fork server (3.8-3.13, ``multiprocessing.forkserver.main``) reads each request's file
descriptors with ``reduction.recvfds`` and survives only an ``OSError`` whose errno is
``ECONNABORTED``. A client that connects and dies before it sends them -- an agent process
SIGKILLed while it starts its shell host, a shell host killed while it starts a worker -- makes
``recvfds`` raise ``EOFError``, and malformed ancillary data ``RuntimeError`` or
``ValueError``: the exception leaves the server's loop and the fork server exits. Every agent
process, shell host and worker of the run then dies with it (``PR_SET_PDEATHSIG``), and the
next start launches a new fork server at another address. Seen: a CI run's trunk SIGKILLed by
a test died with exit code 255 (its fork server gone), and one agent's death took the whole
fleet's processes; reproduced by connecting to the fork server and closing at once.

Here, in the fork server only, ``reduction.recvfds`` is wrapped so that such a request raises
``OSError(ECONNABORTED)``: the server drops that connection and serves the next one. A request
with fewer than the two descriptors every request carries is refused the same way, its
descriptors closed. Importing this module in any other process changes nothing.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from multiprocessing import forkserver, reduction
from typing import Any

_recvfds = reduction.recvfds
"""The stdlib's, which :func:`_recvfds_or_abort` calls."""


def _recvfds_or_abort(sock: socket.socket, size: int) -> list[int]:
    """``reduction.recvfds``, with what would end the fork server's loop turned into the
    ``OSError(ECONNABORTED)`` it survives."""
    try:
        fds: list[int] = _recvfds(sock, size)
    except (EOFError, RuntimeError, ValueError, AssertionError) as e:
        raise OSError(errno.ECONNABORTED, f"fork request abandoned ({type(e).__name__})") from None
    if len(fds) < 2:  # every request sends its status pipe's two ends first
        for fd in fds:
            os.close(fd)
        raise OSError(errno.ECONNABORTED, "fork request without its status pipe")
    return fds


def in_fork_server() -> bool:
    """Whether this code runs inside ``multiprocessing.forkserver.main`` (its preload)."""
    main_code = forkserver.main.__code__
    frame: Any = sys._getframe()
    while frame is not None:
        if frame.f_code is main_code:
            return True
        frame = frame.f_back
    return False


def refuse_abandoned_requests() -> bool:
    """Wrap ``reduction.recvfds`` if this is the fork server; whether it did."""
    if not in_fork_server():
        return False
    reduction.recvfds = _recvfds_or_abort
    return True


INSTALLED = refuse_abandoned_requests()
"""Whether this process is a fork server that refuses abandoned requests (True only there)."""
