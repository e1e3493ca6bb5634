"""A network run that cannot work says why: a missing key is refused at once (exit 2), a dead
server or an HTTP 401/403 fails with the provider's reason on stderr, 401/403 are never retried,
and the key and endpoint come from the providers' usual variables. Against real HTTP servers on
127.0.0.1 and a closed port."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.agent.conftest import exarch
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    anthropic_chunks,
    openai_chunks,
)

KEY_VARS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
URL_VARS = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


@pytest.fixture(autouse=True)
def no_provider_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key and no endpoint from this machine's environment unless a test sets one."""
    for name in (*KEY_VARS.values(), *URL_VARS.values(), "EXARCH_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _base(server: ProtocolServer, provider: str) -> str:
    return server.url + "/v1" if provider == "openai" else server.url


def _replies(provider: str, text: str) -> Exchange:
    if provider == "openai":
        return Exchange(chunks=openai_chunks(text=text))
    return Exchange(chunks=anthropic_chunks(text=text))


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_no_api_key_for_the_hosted_service_is_refused_at_once_but_a_local_server_needs_none(
    provider: str, protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    p = exarch(
        ["run", "--provider", provider, "--model", "m", "hi"],
        cwd=tmp_path,
    )
    assert p.returncode == 2, p.stderr
    assert f"no API key: set {KEY_VARS[provider]} or pass --api-key" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / ".exarch").exists(), "a refused run writes no session directory"

    protocol_server.script(_replies(provider, "hello from a local model"))
    base = _base(protocol_server, provider)
    p = exarch(
        ["run", "--chat", "--provider", provider, "--model", "m", "--base-url", base, "hi"],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "hello from a local model"
    (req,) = protocol_server.requests
    headers = {k.lower() for k in req.headers}
    assert "authorization" not in headers and "x-api-key" not in headers


def test_a_refused_connection_fails_the_run_and_prints_the_reason_on_stderr(
    tmp_path: Path,
) -> None:
    port = _closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    args = ["run", "--provider", "openai", "--model", "m", "--api-key", "k", "--retries", "0"]
    p = exarch([*args, "--base-url", url, "hi"], cwd=tmp_path)
    assert p.returncode == 1
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [
        f"error: openai:m transport failure: ConnectionRefusedError: [Errno 111] connect to "
        f"127.0.0.1:{port}: ECONNREFUSED"
    ], p.stderr
    assert "outcome: failed" in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("status", [401, 403])
def test_a_401_or_403_is_never_retried_and_the_run_prints_why(
    status: int, protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    body = json.dumps({"error": {"message": "invalid credentials"}}).encode()
    protocol_server.script(
        Exchange(status=status, body=body),
        Exchange(chunks=openai_chunks(text="a retry would have got this")),
    )
    url = protocol_server.url + "/v1"
    args = ["run", "--provider", "openai", "--model", "m", "--base-url", url, "hi"]
    p = exarch(args, cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert len(protocol_server.requests) == 1, "never retried"
    (error,) = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert f"answered HTTP {status}" in error and "invalid credentials" in error
    assert error.endswith("(no API key: set OPENAI_API_KEY or pass --api-key)")
    assert "a retry would have got this" not in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_key_and_the_endpoint_come_from_the_providers_usual_variables(
    provider: str, protocol_server: ProtocolServer, tmp_path: Path
) -> None:
    protocol_server.script(_replies(provider, "configured by the environment"))
    env = {KEY_VARS[provider]: "key-from-env", URL_VARS[provider]: _base(protocol_server, provider)}
    args = ["run", "--chat", "--provider", provider, "--model", "m", "hi"]
    p = exarch(args, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "configured by the environment"
    (req,) = protocol_server.requests
    headers = {k.lower(): v for k, v in req.headers.items()}
    sent = headers.get("authorization") or headers.get("x-api-key")
    assert sent in ("Bearer key-from-env", "key-from-env")
