"""A loopback OpenAI-compatible server that answers each agent from its own script.

Agents of a fleet call the model concurrently, so one queue in request order (what
:class:`~tests.support.protocol_servers.ProtocolServer` plays) would hand the trunk a reply meant
for its child. :class:`AgentRoutedServer` reads the agent's name from the system prompt the
runtime sends (``You are NAME, ...``) and plays that agent's queue; an agent with nothing left
gets a plain ``stop`` reply, so a run never fails for want of an exchange.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import exarch
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    RecordedRequest,
    openai_chunks,
)

_NAME = re.compile(r"^You are ([^,\s]+),")


def agent_of(req: RecordedRequest) -> str:
    messages = req.body.get("messages", []) if isinstance(req.body, dict) else []
    system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
    m = _NAME.match(system if isinstance(system, str) else "")
    return m.group(1) if m else "?"


def calls(*scripts: tuple[str, str], text: str = "") -> Exchange:
    """One streamed reply with the tool calls ``(id, script)``, in parallel, in one message."""
    return Exchange(
        chunks=openai_chunks(
            text=text,
            tool_calls=[(cid, "ral", json.dumps({"script": s})) for cid, s in scripts],
        )
    )


def say(text: str) -> Exchange:
    return Exchange(chunks=openai_chunks(text=text))


class AgentRoutedServer(ProtocolServer):
    """A :class:`ProtocolServer` with one queue of exchanges per agent name."""

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[str, deque[Exchange]] = {}

    def script_for(self, agent: str, *exchanges: Exchange) -> None:
        with self._lock:
            self.queues.setdefault(agent, deque()).extend(exchanges)

    def requests_of(self, agent: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if agent_of(r) == agent]

    def _record(self, req: RecordedRequest) -> Exchange:
        with self.request_seen:
            self.requests.append(req)
            self.request_seen.notify_all()
            queue = self.queues.get(agent_of(req))
            if queue:
                return queue.popleft()
        return say("(nothing left to say)")


@pytest.fixture
def routed_server() -> Iterator[AgentRoutedServer]:
    s = AgentRoutedServer()
    s.start()
    try:
        yield s
    finally:
        s.stop()


def exarch_json(args: list[str], cwd: Path, **kw: Any) -> tuple[int, dict[str, Any], str]:
    """``exarch-actors ARGS --json``: exit code, the JSON object on stdout, stderr."""
    p = exarch([*args, "--json"], cwd=cwd, **kw)
    try:
        data = json.loads(p.stdout) if p.stdout.strip() else {}
    except ValueError:
        raise AssertionError(f"not one JSON object on stdout: {p.stdout!r}\n{p.stderr}") from None
    return p.returncode, data, p.stderr
