"""``mcp`` and ``mcp-tools`` in flight: the desk's side of one MCP request, held by the shell
actor's pump while the shell host blocks in its enquiry (``actors/shell.py``), as an
``agent-wait`` is (``actors/desk_wait.py``).

The verbs are answered late: the desk asks its site (:meth:`actors.agent_site.AgentSite.
mcp_begin`), which holds no thread for the request; the fleet's hub (``actors/mcp_hub.py``)
answers on whatever thread the result arrives, which wakes the pump. Meanwhile the pump keeps
serving the host, so a cancel of the calling run reaches the request as an ``abandon`` and
:meth:`PendingMcp.withdraw` asks the site to cancel it at once (``notifications/cancelled``);
a run that ends without it -- its host killed by a terminal cancel, a panic -- withdraws it
too (the pump's ``finally``).

Invariants: a request is withdrawn at most once and answered at most once; an answer that
arrives after the withdrawal is dropped (nothing of an MCP result is owed to anyone, unlike an
``agent-wait``'s children).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.mcp.replies import CALL, LIST, McpRequest
from exarch_actors.runtime.mcp.values import arguments
from exarch_actors.runtime.ral.errors import DeskRefusal
from exarch_actors.runtime.ral.values import UNIT, render

if TYPE_CHECKING:
    from exarch_actors.actors.agent_site import AgentSite

log = logging.getLogger(__name__)

_ids = itertools.count(1)


def mcp_request(verb: str, args: list[Any]) -> tuple[str, str, str | None, dict[str, Any]]:
    """``mcp NAME TOOL [ARGS]`` / ``mcp-tools NAME`` as (server, method, tool, arguments); a
    typed refusal for anything else."""
    if verb == "mcp-tools":
        if len(args) != 1:
            raise DeskRefusal(f"mcp-tools takes NAME, got {len(args)} arguments")
        return render(args[0]), LIST, None, {}
    if len(args) not in (2, 3):
        raise DeskRefusal(f"mcp takes NAME TOOL [ARGS], got {len(args)} arguments")
    try:
        given = arguments(args[2] if len(args) == 3 else UNIT)
    except ExarchError as e:
        raise DeskRefusal(f"mcp {render(args[0])} {render(args[1])}: {e}") from None
    return render(args[0]), CALL, render(args[1]), given


class PendingMcp:
    """One MCP request of one agent: begun at construction; the pump polls :meth:`ready` when
    woken and calls :meth:`withdraw` when the host abandons it."""

    deadline: float | None = None
    """No deadline of its own: a slow tool is stopped by its caller's cancel."""

    def __init__(
        self, site: AgentSite, agent: str, verb: str, args: list[Any], wake: Callable[[], None]
    ) -> None:
        server, method, tool, given = mcp_request(verb, args)
        self._site = site
        self._agent = agent
        self._what = f"mcp {server}" + (f" {tool}" if tool is not None else "")
        self.call_id = f"{agent}:{os.getpid()}:{next(_ids)}"
        self._wake = wake
        self._lock = threading.Lock()
        self._outcome: tuple[Any] | BaseException | None = None
        self._withdrawn = False
        request = McpRequest(agent, self.call_id, server, method, tool, given)
        try:
            site.mcp_begin(request, self._then)
        except ExarchError as e:  # refused before it began (unknown, not granted)
            self._then(e)

    def _then(self, outcome: Any) -> None:
        """The site's answer (any thread): a ral value or the exception that ended it."""
        with self._lock:
            if self._outcome is not None or self._withdrawn:
                return
            self._outcome = outcome if isinstance(outcome, BaseException) else (outcome,)
        self._wake()

    def ready(self) -> dict[str, Any] | None:
        """The answer frame's fields once the answer is here, else None."""
        from exarch_actors.runtime.ral.codec import encode_value

        with self._lock:
            outcome = self._outcome
        if outcome is None:
            return None
        if isinstance(outcome, BaseException):
            text = str(outcome)
            prefix = "" if text.startswith(("mcp", "not granted")) else f"{self._what}: "
            return {"refusal": prefix + text}
        return {"value": encode_value(outcome[0])}

    def expire(self) -> None:
        """Never called (no deadline); present for the pump's protocol."""

    def withdraw(self) -> None:
        """The caller abandoned the request: cancel it now, once."""
        with self._lock:
            if self._withdrawn or self._outcome is not None:
                self._withdrawn = True
                return
            self._withdrawn = True
        try:
            self._site.mcp_cancel(self._agent, self.call_id)
        except Exception:  # a channel already gone: the fleet abandons the agent's requests
            log.debug("%s: mcp cancel not sent", self._agent, exc_info=True)  # when it ends

    def give_back_answer(self) -> None:
        """An answer the host never took: nothing to give back (an MCP result is owed to no
        one)."""
