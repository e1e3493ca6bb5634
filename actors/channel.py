"""The I/O side of the agent-host channel (the protocol itself is
``runtime/fleet/agent_channel.py``).

One :class:`AgentChannel` per end of the duplex ``Connection`` between the control process and
an agent host. It has one **reader** -- a thread of its own, or, for the control side of a
local agent process, the fleet's hub thread that reads every such channel
(:mod:`actors.channel_hub`) -- and a locked writer:

- a reply (``reply_to`` set) wakes the thread waiting in :meth:`AgentChannel.request`;
- a **control frame** (steer, interrupt, cancel, shutdown) is handed to ``on_control`` on the
  reader thread itself -- it bypasses every mailbox and queue, so a cancel reaches the eval
  root while the host's main thread is busy in the very run it cancels;
- any other **request** goes to ``on_request(envelope)``, which answers with :meth:`reply`
  now or later from any thread (a handler that raises is answered with ``Failed``);
- a **notification** (born, died, events) goes to ``on_notify``;
- end of file (the peer exited or was killed) fails every waiting request with
  :class:`PeerGone` and calls ``on_eof(detail)`` once.

Invariants: callbacks run on the reader thread and must not block on this channel (a handler
that needs to run work queues it); every request ends in exactly one of a reply,
:class:`ReplyTimeout` or :class:`PeerGone` -- none is ever dropped in silence; a frame that
cannot be decoded is counted and reported to ``on_bad_frame`` and the reader carries on (it
names no request, so nothing else can be done with it). Threads: exactly one (the reader),
which exits at end of file or :meth:`close`; none on a hub.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from exarch_actors.actors.channel_hub import ChannelHub
from exarch_actors.actors.frames import Channel, ChannelClosed
from exarch_actors.runtime.fleet.agent_channel import (
    CONTROL_KINDS,
    ChannelMessage,
    ChannelProtocolError,
    Correlator,
    Envelope,
    Failed,
    PeerGone,
    ReplyTimeout,
    decode,
    encode,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
"""Seconds a request waits for its reply unless the caller says otherwise."""


def _ignore(_: object) -> None:
    return None


Then = Callable[[ChannelMessage | None, BaseException | None], None]
"""What a caller that does not wait for a reply is called back with: the reply, or the error."""


class _Waiter:
    __slots__ = ("error", "event", "reply", "then")

    def __init__(self, then: Then | None) -> None:
        self.event = threading.Event()
        self.reply: ChannelMessage | None = None
        self.error: BaseException | None = None
        self.then = then
        """Called on the reader thread with the reply or the error, once one is known."""

    def settle(self) -> None:
        self.event.set()
        if self.then is not None:
            try:
                self.then(self.reply, self.error)
            except Exception:  # a callback bug must not stop the reader
                log.exception("channel: a reply's callback failed")


class AgentChannel:
    """One end of an agent-host channel (see the module docstring)."""

    def __init__(
        self,
        conn: Connection,
        *,
        peer: str,
        on_control: Callable[[ChannelMessage], None] = _ignore,
        on_request: Callable[[Envelope], object] | None = None,
        on_notify: Callable[[ChannelMessage], None] = _ignore,
        on_eof: Callable[[str], None] = _ignore,
        on_bad_frame: Callable[[ChannelProtocolError], None] = _ignore,
    ) -> None:
        self.peer = peer
        self._ch = Channel(conn)
        self._on_control = on_control
        self._on_request = on_request
        self._on_notify = on_notify
        self._on_eof = on_eof
        self._on_bad_frame = on_bad_frame
        self._lock = threading.Lock()
        self._corr = Correlator()
        self._waiters: dict[int, _Waiter] = {}
        self._eof: str | None = None
        self.closed = threading.Event()
        """Set once the reader has seen end of file (or :meth:`close` ran)."""
        self.bad_frames = 0
        self.timeouts = 0
        self._reader = threading.Thread(target=self._read, name=f"channel-{peer}", daemon=True)
        self._hub: ChannelHub | None = None
        self._eof_detail = "end of file"

    def start(self, hub: ChannelHub | None = None) -> AgentChannel:
        """Start reading: on a reader thread of its own, or on ``hub``'s
        (:mod:`actors.channel_hub`: the control side of local agent processes)."""
        if hub is not None:
            self._hub = hub
            hub.add(self)
        else:
            self._reader.start()
        return self

    def fileno(self) -> int:
        return self._ch.fileno()

    # -- sending ------------------------------------------------------------------------------

    def send(self, msg: ChannelMessage) -> None:
        """Send a notification or control frame; :class:`ChannelClosed` if the peer is gone."""
        self._ch.send_bytes(encode(Envelope(msg)))

    def try_send(self, msg: ChannelMessage) -> bool:
        try:
            self.send(msg)
        except ChannelClosed:
            return False
        return True

    def reply(self, request_id: int, msg: ChannelMessage) -> bool:
        """Answer request ``request_id``; False if the peer is gone (it learns nothing more)."""
        try:
            self._ch.send_bytes(encode(Envelope(msg, reply_to=request_id)))
        except ChannelClosed:
            return False
        return True

    def request(self, msg: ChannelMessage, timeout: float = DEFAULT_TIMEOUT) -> ChannelMessage:
        """Send ``msg`` as a request and wait for its reply.

        Raises :class:`ReplyTimeout` (the reply did not come in time; a late one is counted in
        :attr:`late_replies`) or :class:`PeerGone` (the channel ended first). A ``Failed``
        reply is returned as is: the caller decides how to surface the peer's error.
        """
        return self.begin(msg, timeout)()

    def begin(
        self,
        msg: ChannelMessage,
        timeout: float = DEFAULT_TIMEOUT,
        then: Then | None = None,
    ) -> Callable[[], ChannelMessage]:
        """Send ``msg`` as a request now (:class:`PeerGone` at once if the channel has ended);
        the returned call waits for its reply as :meth:`request` does. The frame is in the pipe
        when this returns, so a caller can send it under a lock and wait outside it. ``then``,
        for a caller that does not wait: called on the reader thread with the reply (or the
        :class:`PeerGone` of an end of file) as soon as it is known; it must not block."""
        waiter = _Waiter(then)
        with self._lock:
            if self._eof is not None:
                raise PeerGone(msg.KIND, 0, self.peer, self._eof)
            rid = self._corr.open(msg.KIND, time.monotonic(), timeout)
            self._waiters[rid] = waiter
        try:
            self._ch.send_bytes(encode(Envelope(msg, id=rid)))
        except ChannelClosed as e:
            with self._lock:
                self._waiters.pop(rid, None)
                self._corr.close(rid)
            raise PeerGone(msg.KIND, rid, self.peer, str(e)) from None
        return lambda: self._await(msg, rid, waiter, timeout)

    def _await(
        self, msg: ChannelMessage, rid: int, waiter: _Waiter, timeout: float
    ) -> ChannelMessage:
        if not waiter.event.wait(timeout):
            with self._lock:
                expired = {i for i, _ in self._corr.expire(time.monotonic())}
                if rid in expired or not waiter.event.is_set():
                    self._waiters.pop(rid, None)
                    self.timeouts += 1
                    raise ReplyTimeout(msg.KIND, rid, timeout, self.peer)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.reply is not None
        return waiter.reply

    @property
    def late_replies(self) -> int:
        with self._lock:
            return self._corr.late

    # -- reading ------------------------------------------------------------------------------

    def _read(self) -> None:
        detail = "end of file"
        while True:
            try:
                data = self._ch.recv_bytes()
            except ChannelClosed as e:
                detail = str(e)
                break
            self._handle(data)
        self._finish(detail)

    def pump(self) -> bool:
        """On the hub's thread, this socket readable: dispatch the whole frames one read
        brings (none while a frame is still partial); False at end of file."""
        try:
            bodies = self._ch.recv_ready()
        except ChannelClosed as e:
            self._eof_detail = str(e)
            return False
        for data in bodies:
            self._handle(data)
        return True

    def finish_pumped(self) -> None:
        """The hub unregistered this channel at its end of file."""
        self._finish(self._eof_detail)

    def lost_before_read(self, detail: str) -> None:
        """The hub could not register this channel (closed before its first read)."""
        self._finish(detail)

    def _handle(self, data: bytes) -> None:
        try:
            env = decode(data)
        except ChannelProtocolError as e:
            self.bad_frames += 1
            self._call(self._on_bad_frame, e)
            return
        self._dispatch(env)

    def _dispatch(self, env: Envelope) -> None:
        msg = env.message
        if env.reply_to is not None:
            with self._lock:
                waited = self._corr.close(env.reply_to)
                waiter = self._waiters.pop(env.reply_to, None)
            if waited and waiter is not None:
                waiter.reply = msg
                waiter.settle()
            return
        if msg.KIND in CONTROL_KINDS:
            self._call(self._on_control, msg)
        elif env.id is not None:
            if self._on_request is None:
                self.reply(env.id, Failed("NoHandler", f"{self.peer}: no handler for {msg.KIND}"))
                return
            try:
                self._on_request(env)
            except Exception as e:  # a handler bug is answered, never swallowed
                log.exception("channel %s: handler for %s failed", self.peer, msg.KIND)
                self.reply(env.id, Failed(type(e).__name__, str(e)))
        else:
            self._call(self._on_notify, msg)

    def _call(
        self,
        fn: Callable[[ChannelProtocolError], None] | Callable[[ChannelMessage], None],
        arg: object,
    ) -> None:
        try:
            fn(arg)  # type: ignore[arg-type]
        except Exception:  # a callback bug must not stop the reader (cancel still has to land)
            log.exception("channel %s: callback failed", self.peer)

    def _finish(self, detail: str) -> None:
        with self._lock:
            self._eof = detail
            waiting = [
                (rid, kind, self._waiters.pop(rid, None)) for rid, kind in self._corr.drain()
            ]
        for rid, kind, waiter in waiting:
            if waiter is not None:
                waiter.error = PeerGone(kind, rid, self.peer, detail)
                waiter.settle()
        self.closed.set()
        try:
            self._on_eof(detail)
        except Exception:
            log.exception("channel %s: on_eof failed", self.peer)

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close this end: the peer and this end's reader both see end of file. Idempotent.

        The socket is shut down before it is closed: closing an fd does not wake a thread
        blocked reading it, a shutdown does."""
        if not self._ch.closed:
            with contextlib.suppress(OSError, ValueError):
                fd = self._ch.fileno()
                with socket.socket(fileno=os.dup(fd)) as s:
                    s.shutdown(socket.SHUT_RDWR)
        hub = self._hub
        # a callback closing its own channel: the hub unregisters it here, its reader
        if hub is not None and hub.is_reader() and hub.forget(self):
            self._finish("closed locally")
        self.join(5.0)
        self._ch.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the reader to see the end of file (its own thread, or the hub's)."""
        hub = self._hub
        if hub is not None:
            if not hub.is_reader():
                self.closed.wait(timeout)
            return
        if self._reader.is_alive() and self._reader is not threading.current_thread():
            self._reader.join(timeout)

    @property
    def eof(self) -> str | None:
        with self._lock:
            return self._eof
