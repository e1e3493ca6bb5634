"""The fleet's MCP client: one connection per configured server, owned by the fleet.

Every agent's ``mcp`` call ends here, in the control process, whichever backend runs the agent:
its shell host asks its desk (an enquiry), the desk asks the agent's site, and the site -- the
fleet itself, or an agent process's channel to it -- asks this hub (``docs/mcp.md``).

Invariants:

- **One server per fleet, started lazily.** A stdio server starts at the first request any agent
  makes of it (never at the fleet's start) and is shared by every agent; an HTTP server is
  connected to the same way. All connections live on one event-loop thread of the hub.
- **Confined like a shell.** A stdio server is started through ``actors/mcp_launch.py`` with the
  fleet's scrubbed environment and the kernel rules of a shell of the run's base grants
  (:class:`McpLaunch`); it dies with the fleet (``PR_SET_PDEATHSIG`` on the loop thread, and
  :meth:`McpHub.close` stops it).
- **Restarted when it crashes.** A connection whose transport ended (its process died, its HTTP
  stream broke) is replaced at the next request; the requests in flight when it ended fail with
  :class:`McpServerCrashed`. Nothing about a caller's cancel or its shell's panic leaves a
  connection half used: a cancelled request is abandoned with ``notifications/cancelled`` and
  the connection stays good for the next one.
- **Cancel at once.** :meth:`McpHub.cancel` cancels the request's task from any thread; the SDK
  sends ``notifications/cancelled`` to the server as the task unwinds.
- **Recorded and replayed.** With a sink every result (and every failure without a result) is
  handed to it as an :class:`~runtime.mcp.replies.McpReply`; a server the :class:`ReplyBook`
  serves is never started: its recorded replies answer instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.mcp.config import McpServer
from exarch_actors.runtime.mcp.errors import (
    McpRequestFailed,
    McpServerCrashed,
    McpServerUnavailable,
    McpServerUnknown,
)
from exarch_actors.runtime.mcp.replies import LIST, McpReply, McpRequest, ReplyBook, arguments_key
from exarch_actors.runtime.mcp.values import ToolLine, call_value, tool_lines, tools_value

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
"""Seconds a server may take to start and finish its handshake."""

CLOSE_TIMEOUT = 10.0
"""Seconds :meth:`McpHub.close` waits for the servers to stop (the SDK's own shutdown closes
stdin, waits 2 s, then kills the process tree)."""

LAUNCHER = str(Path(__file__).with_name("mcp_launch.py"))

Then = Callable[[Any], None]
"""Called once with the ral value of a request, or the exception that ended it."""

Sink = Callable[[str, McpReply], None]
"""Where a recording run's results go (server name, reply)."""


@dataclass(frozen=True)
class McpLaunch:
    """How a stdio server starts: the environment every server gets (already scrubbed of the
    run's secrets), the kernel rules (``Ruleset.to_dict()``; None: unconfined), the working
    directory when the server names none, and where each server's stderr is kept."""

    env: Mapping[str, str] = field(default_factory=dict)
    rules: Mapping[str, Any] | None = None
    cwd: str | None = None
    errlog: Path | None = None


class _Watched:
    """A transport's read stream that tells its link when the server's side ended."""

    def __init__(self, inner: Any, ended: Callable[[], None]) -> None:
        self._inner = inner
        self._ended = ended

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except Exception:
            self._ended()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except Exception:  # StopAsyncIteration included: the server's side ended
            self._ended()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Watched:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


class _Link:
    """One server's connection, lived on the hub's loop; replaced when its transport ends."""

    def __init__(self, server: McpServer, launch: McpLaunch) -> None:
        self.server = server
        self.launch = launch
        self.generation = 0
        self._ready: asyncio.Future[Any] | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        """Held while a connection is replaced: two requests meeting a crashed server start
        one new connection, not two (the stop of the old one is awaited)."""
        self.ended = False

    def _transport(self) -> Any:
        from contextlib import asynccontextmanager

        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        server, launch = self.server, self.launch
        if server.command is not None:
            env = dict(launch.env) | dict(server.env)
            rules = json.dumps(None if launch.rules is None else dict(launch.rules))
            params = StdioServerParameters(
                command=sys.executable,
                args=[LAUNCHER, str(os.getpid()), rules, "--", server.command, *server.args],
                env=env,
                cwd=server.cwd or launch.cwd,
            )
            errlog: Any = sys.stderr
            if launch.errlog is not None:
                launch.errlog.mkdir(parents=True, exist_ok=True)
                errlog = open(launch.errlog / f"{server.name}.stderr", "a", encoding="utf-8")  # noqa: SIM115
            inner: Any = stdio_client(params, errlog=errlog)
        else:
            assert server.url is not None
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = (
                create_mcp_http_client(headers=dict(server.headers)) if server.headers else None
            )
            inner = streamable_http_client(server.url, http_client=client)

        def ended() -> None:
            self.ended = True

        @asynccontextmanager
        async def watched() -> Any:
            async with inner as streams:
                yield (_Watched(streams[0], ended), *streams[1:])

        return watched()

    async def client(self) -> Any:
        """The live client, started (or started again after a crash) now if need be."""
        async with self._starting:
            if self._ready is None or self.ended:
                await self.stop()
                self.ended = False
                self.generation += 1
                loop = asyncio.get_running_loop()
                self._ready = loop.create_future()
                self._stop = asyncio.Event()
                self._task = loop.create_task(self._run(self._ready, self._stop))
            ready = self._ready
        try:
            return await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT)
        except TimeoutError:
            self.ended = True
            raise McpServerUnavailable(
                f"mcp {self.server.name}: the server did not answer its handshake within "
                f"{START_TIMEOUT:g} s ({self.server.describe()})"
            ) from None

    async def _run(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(self._transport(), cache=None) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as e:
            self.ended = True
            if not ready.done():
                log_hint = ""
                if self.server.command is not None and self.launch.errlog is not None:
                    log_hint = f"; its log: {self.launch.errlog / f'{self.server.name}.stderr'}"
                ready.set_exception(
                    McpServerUnavailable(
                        f"mcp {self.server.name}: cannot start or reach the server "
                        f"({self.server.describe()}): {_reason(e)}{log_hint}"
                    )
                )
            if not isinstance(e, Exception):
                raise

    async def stop(self) -> None:
        """End the connection (the SDK stops a stdio server: stdin closed, then killed)."""
        task, stop = self._task, self._stop
        self._task = self._ready = self._stop = None
        if task is None or stop is None:
            return
        stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, CLOSE_TIMEOUT)


def _reason(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_reason(x) for x in e.exceptions)
    return str(e) or type(e).__name__


class McpHub:
    """The fleet's MCP servers (see the module docstring). Thread-safe."""

    def __init__(
        self,
        servers: Sequence[McpServer],
        launch: McpLaunch | None = None,
        *,
        book: ReplyBook | None = None,
        sink: Sink | None = None,
    ) -> None:
        self.servers = {s.name: s for s in servers}
        self._launch = launch or McpLaunch()
        self._book = book
        self._sink = sink
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._links: dict[str, _Link] = {}
        self._calls: dict[tuple[str, str], Future[Any]] = {}
        self._catalog: dict[str, tuple[ToolLine, ...]] = {}
        self._listing: dict[str, asyncio.Task[None]] = {}
        """Background listings in flight, by server (held: the loop keeps only weak refs)."""
        self._closed = False

    # -- what the fleet asks -------------------------------------------------------------------

    def names(self) -> tuple[str, ...]:
        return tuple(self.servers)

    def catalog(self, name: str) -> tuple[ToolLine, ...] | None:
        """The tools of ``name`` as last listed (by any agent, or recorded), else None."""
        with self._lock:
            known = self._catalog.get(name)
        if known is None and self._book is not None:
            listing = self._book.listing(name)
            if listing is not None:
                return tool_lines(listing)
        return known

    def link_generation(self, name: str) -> int:
        """How many times ``name``'s connection was started (0: never)."""
        with self._lock:
            link = self._links.get(name)
        return 0 if link is None else link.generation

    def begin(self, request: McpRequest, then: Then) -> None:
        """Start one request; ``then`` gets its ral value or its error, once, on any thread.
        An unknown server is refused here (:class:`McpServerUnknown`)."""
        server, method = request.server, request.method
        if server not in self.servers:
            raise McpServerUnknown(server, tuple(self.servers))
        if self._book is not None and self._book.serves(server):
            try:
                then(self._value(server, method, self._book.take(request)))
            except Exception as e:
                then(e)
            return
        loop = self._ensure_loop()
        key = (request.agent, request.call_id)
        args = dict(request.arguments)
        fut = asyncio.run_coroutine_threadsafe(
            self._request(server, method, request.tool, args), loop
        )
        with self._lock:
            self._calls[key] = fut

        def done(f: Future[Any]) -> None:
            with self._lock:
                if self._calls.get(key) is f:
                    del self._calls[key]
            if f.cancelled():
                return  # its caller withdrew it: nobody waits for an answer
            error = f.exception()
            if error is not None:
                then(error)
                return
            try:
                then(self._value(server, method, f.result()))
            except Exception as e:
                then(e)

        fut.add_done_callback(done)

    def cancel(self, agent: str, call_id: str) -> bool:
        """Abandon one request at once (``notifications/cancelled`` reaches the server)."""
        with self._lock:
            fut = self._calls.pop((agent, call_id), None)
        return fut is not None and fut.cancel()

    def cancel_agent(self, agent: str) -> int:
        """Abandon every request of ``agent`` (it ended, or its process is gone)."""
        with self._lock:
            keys = [k for k in self._calls if k[0] == agent]
            futs = [self._calls.pop(k) for k in keys]
        return sum(1 for f in futs if f.cancel())

    def close(self) -> None:
        """Abandon every request and stop every server; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            futs = list(self._calls.values())
            self._calls.clear()
            loop, thread = self._loop, self._thread
        for f in futs:
            f.cancel()
        if loop is None or thread is None:
            return
        stopping = asyncio.run_coroutine_threadsafe(self._stop_all(), loop)
        with contextlib.suppress(Exception):
            stopping.result(CLOSE_TIMEOUT + 2)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_TIMEOUT)

    # -- the loop ------------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise McpServerUnavailable("mcp: the fleet is closing; no server is reachable")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()
                    loop.close()

                self._thread = threading.Thread(target=run, name="mcp-hub", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def _link(self, server: str) -> _Link:
        with self._lock:
            link = self._links.get(server)
            if link is None:
                link = self._links[server] = _Link(self.servers[server], self._launch)
            return link

    async def _request(
        self, server: str, method: str, tool: str | None, args: dict[str, Any]
    ) -> McpReply:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        link = self._link(server)
        client = await link.client()
        if method != LIST:
            self._learn_tools(server, client)
        try:
            if method == LIST:
                result = await self._list(client)
            else:
                assert tool is not None
                got = await client.call_tool(tool, args)
                result = got.model_dump(mode="json", by_alias=True, exclude_none=True)
        except MCPError as e:
            if e.error.code == CONNECTION_CLOSED or link.ended:
                link.ended = True
                raise self._record_failure(
                    server,
                    method,
                    tool,
                    args,
                    McpServerCrashed(
                        f"mcp {server}: the server's connection ended during the call "
                        f"(restarted at the next call; its log: {self._log_hint(server)})"
                    ),
                ) from None
            raise self._record_failure(
                server, method, tool, args, McpRequestFailed(f"mcp {server}: {e.error.message}")
            ) from None
        except (OSError, EOFError) as e:
            link.ended = True
            raise self._record_failure(
                server, method, tool, args, McpServerCrashed(f"mcp {server}: {_reason(e)}")
            ) from None
        reply = McpReply(method, tool, arguments_key(args), result)
        if self._sink is not None:
            self._sink(server, reply)
        return reply

    def _learn_tools(self, server: str, client: Any) -> None:
        """A server's first request that is not a listing also lists its tools, in the
        background, so the prompts of agents made later show them (``mcp-tools`` need not be
        called first). Recorded like any listing; a failure only leaves the catalog empty."""
        with self._lock:
            if server in self._catalog or server in self._listing:
                return

        async def learn() -> None:
            try:
                result = await self._list(client)
                if self._sink is not None:
                    self._sink(server, McpReply(LIST, None, arguments_key({}), result))
                with self._lock:
                    self._catalog[server] = tool_lines(result)
            except Exception:
                log.debug("mcp %s: the background tools/list failed", server, exc_info=True)
            finally:
                with self._lock:
                    self._listing.pop(server, None)

        task = asyncio.get_running_loop().create_task(learn())
        with self._lock:
            self._listing[server] = task

    async def _list(self, client: Any) -> dict[str, Any]:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor)
            tools.extend(
                t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools
            )
            cursor = page.next_cursor
            if cursor is None:
                break
        return {"tools": tools}

    def _record_failure(
        self, server: str, method: str, tool: str | None, args: dict[str, Any], error: Exception
    ) -> Exception:
        if self._sink is not None:
            self._sink(server, McpReply(method, tool, arguments_key(args), error=str(error)))
        return error

    def _log_hint(self, server: str) -> str:
        if self._launch.errlog is None or self.servers[server].command is None:
            return "none kept"
        return str(self._launch.errlog / f"{server}.stderr")

    def _value(self, server: str, method: str, reply: McpReply) -> Any:
        if reply.result is None:
            raise McpServerCrashed(reply.error or f"mcp {server}: the call failed")
        if method == LIST:
            with self._lock:
                self._catalog[server] = tool_lines(reply.result)
            return tools_value(reply.result)
        return call_value(reply.result)

    async def _stop_all(self) -> None:
        with self._lock:
            links = list(self._links.values())
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)


__all__ = ["McpHub", "McpLaunch"]
