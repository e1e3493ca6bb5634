"""The chat over the openai provider pointed at a loopback server speaking Ollama's dialect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.scenario import Scenario
from tests.support.protocol_servers import Exchange, ProtocolServer, ollama_chunks
from tests.tui.conftest import chat


def test_a_chat_with_a_local_model_shows_its_call_its_reply_and_the_tables_window(
    tmp_path: Path,
) -> None:
    server = ProtocolServer().start()
    script = json.dumps({"script": "echo from-ral"})
    server.script(
        Exchange(chunks=ollama_chunks("Looking.", [("call_k3v9x2aa", "ral", script)])),
        Exchange(chunks=ollama_chunks("It said from-ral.")),
    )
    local = make_provider("openai", model="qwen2.5:7b", base_url=server.url + "/v1")

    def provider_for(_: Scenario) -> Callable[[str], Provider]:
        return local.for_agent

    async def scenario() -> None:
        async with chat(tmp_path, "", provider_for=provider_for) as c:
            await c.say("what does ral say?")
            await c.until(lambda: "It said from-ral." in c.text(), what="the reply")
            call = next(e for e in c.app.entries("trunk") if e.kind == "ral")
            assert call.text == "echo from-ral" and "from-ral" in (call.result or "")
            await c.until(lambda: "/32,768" in c.app.status_line, what="the window")
            assert "openai:qwen2.5:7b" in c.app.status_line

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
