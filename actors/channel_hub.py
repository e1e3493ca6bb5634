"""One reader thread for the control side of every local agent process's channel.

An :class:`actors.channel.AgentChannel` started on a :class:`ChannelHub` has no reader thread
of its own: the hub waits on all of their sockets at once (``selectors``, epoll on Linux) and,
for each that is readable, reads what one ``read(2)`` brings and dispatches every whole frame
in it, in order, exactly as the channel's own reader would (its callbacks run on the hub
thread, under the same rule: they never block).

Why: with one reader thread per agent process, the control process of a 200-agent fleet held
~200 threads that each woke for every frame its agent sent -- one event batch per ral call --
and competed for the one GIL with the settlement pool and each other. Under full load they
fell behind by seconds: an agent's ``Ended`` was read 0.4-2.7 s after it was sent
(200 agents x 50 calls on 2 cores), the ends then settled in a burst with the cores idle,
and every lock held across a ``write(2)`` (the bus's, the journal's) formed a convoy of
threads waiting for the GIL. One hub thread reads every ready socket in turn without a hand-off
(docs/benchmarks.md).

Invariants:
- a read never blocks: the hub reads only a socket the selector reported readable, once, and
  keeps a partial frame in the channel's buffer for the next (:meth:`Channel.recv_ready`), so
  a host stopped halfway through writing a large frame stalls nobody;
- each channel's frames are dispatched in the order they were sent; at end of file the channel
  is unregistered before its ``on_eof`` runs, and :meth:`AgentChannel.close` waits for that
  before it closes the socket (a reused fd number never reaches the wrong channel);
- a callback that raises is logged and the hub carries on (as a channel's own reader does); a
  read that raises ends that channel alone, as an end of file;
- threads: exactly one, a daemon, from the first :meth:`add` until :meth:`close`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from collections import deque
from typing import Protocol

log = logging.getLogger(__name__)


class Pumped(Protocol):
    """What the hub reads: :class:`actors.channel.AgentChannel` on a hub."""

    peer: str

    def fileno(self) -> int: ...

    def pump(self) -> bool:
        """Dispatch the whole frames one read of the readable socket brings; False at end of
        file (the hub then unregisters it and calls :meth:`finish_pumped`)."""
        ...

    def finish_pumped(self) -> None: ...

    def lost_before_read(self, detail: str) -> None:
        """The hub could not register it (closed before its first read)."""
        ...


class ChannelHub:
    """The reader thread shared by many channels (see the module docstring)."""

    def __init__(self, name: str = "channel-hub") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._adds: deque[Pumped] = deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1

    def add(self, channel: Pumped) -> None:
        """Read ``channel`` from now on (its reader, until its end of file)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            if self._thread is None:
                self._start_locked()
            self._adds.append(channel)
        self._wake()

    def is_reader(self) -> bool:
        """Whether the calling thread is this hub's (a callback closing its own channel)."""
        return self._thread is threading.current_thread()

    def forget(self, channel: Pumped) -> bool:
        """On the hub's thread only: stop reading ``channel`` now (it is being closed by one of
        the hub's own callbacks); whether it was still read."""
        assert self.is_reader()
        selector = self._selector
        assert selector is not None
        try:
            key = selector.get_key(channel.fileno())
        except (KeyError, ValueError, OSError):
            return False
        if key.data is not channel:
            return False
        selector.unregister(key.fd)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop reading (channels still registered are left as they are: their owners close
        them) and end the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        self._wake()
        if thread is not threading.current_thread():
            thread.join(timeout)

    # -- the thread --------------------------------------------------------------------------

    def _start_locked(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: a wake is already due
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while True:
                for key, _ in selector.select():
                    channel: Pumped | None = key.data
                    if channel is None:
                        if not self._woken(selector):
                            return
                    elif not self._pumped(channel):  # end of file: done with the hub
                        with contextlib.suppress(KeyError, ValueError, OSError):
                            selector.unregister(key.fd)
                        channel.finish_pumped()
        finally:
            selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _pumped(self, channel: Pumped) -> bool:
        """``channel.pump()``; a read that raises (a bug, never a peer's bytes: those are
        typed refusals) ends that channel as if its peer had gone, and the hub reads on."""
        try:
            return channel.pump()
        except Exception:
            log.exception("%s: reading %s failed; it is treated as ended", self.name, channel.peer)
            return False

    def _woken(self, selector: selectors.BaseSelector) -> bool:
        """Register what was added; False once the hub is closed."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            adds, self._adds = self._adds, deque()
            closed = self._closed
        if closed:
            return False
        for channel in adds:
            try:
                selector.register(channel.fileno(), selectors.EVENT_READ, channel)
            except (KeyError, ValueError, OSError) as e:  # closed before it was registered
                log.debug("%s: %s not read: %s", self.name, channel.peer, e)
                channel.lost_before_read(str(e))
        return True
