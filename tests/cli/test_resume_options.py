"""``resume`` of a network run takes the shared provider options: the model and endpoint
override ``run.json``'s, and the key comes from the provider's usual variable (never from
``run.json``, which does not hold it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import exarch
from tests.support.protocol_servers import Exchange, ProtocolServer, openai_chunks
from tests.support.terminal import ROOT


def _reply_call(call_id: str, value: str) -> Exchange:
    script = json.dumps({"script": f"reply {value}"})
    return Exchange(chunks=openai_chunks(tool_calls=[(call_id, "ral", script)]))


@pytest.mark.slow
def test_resume_of_a_network_run_takes_a_new_endpoint_and_model_and_the_key_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    first, second = ProtocolServer().start(), ProtocolServer().start()
    try:
        first.script(Exchange(hang=True))
        session = tmp_path / "session"
        args = ["run", "--provider", "openai", "--model", "m1", "--api-key", "k1"]
        args += ["--base-url", first.url + "/v1", "--session-dir", str(session), "add 40 and 2"]
        control = subprocess.Popen(
            [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert first.wait_for_requests(1, timeout=30), "the run reached the first server"
        finally:
            os.killpg(control.pid, signal.SIGKILL)  # the control process dies, and its shells
            control.wait()
        assert not (session / "result.json").exists()

        second.script(_reply_call("c1", "42"), _reply_call("c2", "42"))
        p = exarch(
            ["resume", str(session), "--base-url", second.url + "/v1", "--model", "m2"],
            cwd=tmp_path,
            env={"OPENAI_API_KEY": "k2"},
        )
    finally:
        first.stop()
        second.stop()
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42"
    assert len(first.requests) == 1
    req = second.requests[0]
    assert req.body["model"] == "m2"
    assert {k.lower(): v for k, v in req.headers.items()}["authorization"] == "Bearer k2"
    assert json.loads((session / "result.json").read_text())["resumed"] is True
    assert "k1" not in (session / "run.json").read_text() + (session / "result.json").read_text()
