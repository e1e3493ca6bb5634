"""The fleet's MCP site: what :class:`actors.fleet.Fleet` does for ``mcp`` and ``mcp-tools``.

The fleet decides; the hub (``actors/mcp_hub.py``) talks to servers. Here:

- **grants**: a request of an agent whose grants exclude the server is refused with
  :class:`~runtime.mcp.errors.NotGranted` before anything is sent; the grants are the ones the
  fleet decided for the agent (``Fleet._granted_spec``: parent ⊓ policy ⊓ snapshot), never
  what its shell reports;
- **the launch**: a stdio server gets the run's environment scrubbed of its secrets
  (``runtime/credentials.py``), ``$EXARCH_SESSION`` (so ``check`` finds one that outlived its
  run), and the kernel rules of a shell of the run's base grants in the run's sandbox mode
  (``runtime/shell/confinement.py``), decided once, at the first start;
- **the prompt**: the lines an agent's system prompt shows of the servers it may use;
- **ends**: an agent that ends abandons its requests; the fleet's close stops every server.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exarch_actors.runtime.constants import SESSION_ENV
from exarch_actors.runtime.mcp.config import McpServer
from exarch_actors.runtime.mcp.errors import McpSdkMissing, McpServerUnknown, NotGranted
from exarch_actors.runtime.mcp.replies import McpReply, McpRequest, ReplyBook
from exarch_actors.runtime.mcp.values import prompt_section
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.shell.confinement import (
    Sandbox,
    etc_entries,
    path_dirs,
    python_paths,
    ruleset,
)

if TYPE_CHECKING:
    from exarch_actors.actors.mcp_hub import McpHub, McpLaunch
    from exarch_actors.runtime.state.session_dir import SessionDir


@dataclass(frozen=True)
class McpSetup:
    """A run's MCP servers as the command decided them: the servers, the recorded replies a
    replay serves (by server), and where a recording run hands each result."""

    servers: tuple[McpServer, ...] = ()
    replies: Mapping[str, tuple[McpReply, ...]] = field(default_factory=dict)
    sink: Callable[[str, McpReply], None] | None = None


class McpSite:
    """One fleet's MCP servers behind its grants. Thread-safe; the hub is made at first use."""

    def __init__(
        self,
        setup: McpSetup,
        session: SessionDir,
        sandbox: Callable[[], Sandbox],
        config: Any,
    ) -> None:
        self.setup = setup
        self._session = session
        self._sandbox = sandbox
        self._config = config
        self._lock = threading.Lock()
        self._hub: McpHub | None = None
        self._closed = False

    @property
    def configured(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.setup.servers)

    def hub(self) -> McpHub:
        """The hub, made now if need be (its loop and servers start at its first request)."""
        from exarch_actors.actors.mcp_hub import McpHub

        with self._lock:
            if self._hub is None:
                if not self.setup.replies and importlib.util.find_spec("mcp") is None:
                    raise McpSdkMissing()
                book = ReplyBook(self.setup.replies) if self.setup.replies else None
                self._hub = McpHub(
                    self.setup.servers, self._launch(), book=book, sink=self.setup.sink
                )
            return self._hub

    def _launch(self) -> McpLaunch:
        from exarch_actors.actors.mcp_hub import McpLaunch

        env = self._config.secrets.scrub(os.environ)
        env[SESSION_ENV] = str(self._session.root.resolve())
        sandbox = self._sandbox()
        rules = ruleset(
            sandbox,
            self._config.grants.base,
            python=python_paths() + path_dirs(),
            etc=etc_entries(),
        )
        if rules is not None and sandbox.scratch:
            os.makedirs(sandbox.scratch, mode=0o700, exist_ok=True)
            env["TMPDIR"] = sandbox.scratch
        return McpLaunch(
            env=env,
            rules=None if rules is None else rules.to_dict(),
            cwd=self._config.cwd or os.getcwd(),
            errlog=self._session.mcp,
        )

    def begin(
        self, grants: Grants | None, request: McpRequest, then: Callable[[Any], None]
    ) -> None:
        """One request of its agent (whose grants the fleet decided: ``grants``)."""
        if request.server not in self.configured:
            raise McpServerUnknown(request.server, self.configured)
        if grants is not None and not grants.mcp_server(request.server):
            raise NotGranted(request.agent, request.server)
        self.hub().begin(request, then)

    def cancel(self, agent: str, call_id: str) -> None:
        with self._lock:
            hub = self._hub
        if hub is not None:
            hub.cancel(agent, call_id)

    def agent_ended(self, agent: str) -> None:
        """``agent`` ended: whatever it still had in flight is abandoned (its process may be
        gone without withdrawing anything)."""
        with self._lock:
            hub = self._hub
        if hub is not None:
            hub.cancel_agent(agent)

    def prompt_for(self, grants: Grants) -> str | None:
        """The system prompt's lines on the servers ``grants`` allow (tools when known)."""
        allowed = [s for s in self.setup.servers if grants.mcp_server(s.name)]
        if not allowed:
            return None
        with self._lock:
            hub = self._hub
        if hub is None and self.setup.replies:
            hub = self.hub()
        return prompt_section(
            (s.name, s.description, None if hub is None else hub.catalog(s.name)) for s in allowed
        )

    def close(self) -> None:
        with self._lock:
            hub, self._closed = self._hub, True
        if hub is not None:
            hub.close()


__all__ = ["McpSetup", "McpSite"]
