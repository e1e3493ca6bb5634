"""The provider's key never reaches a shell, a program it runs, or any file the run leaves.

Real runs of the command in a subprocess (``exarch-actors run``), agents as processes and as
threads; a scripted agent tries every way a program has to the key (ral's ``env``, the whole
``env`` of a program, a granted ``sh``, the environment of the shell host itself through
``/proc``); then every file of the session directory and of the ``--record`` recording is
searched for the key's bytes. A loopback provider shows the agent process still sends it.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.agent.conftest import exarch, scenario_run
from tests.support.protocol_servers import Exchange, ProtocolServer, openai_chunks

KEY = "sk-test-0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c"
"""A fake key, long and unique enough that finding its bytes anywhere means it leaked."""

PROBES = [
    "env OPENAI_API_KEY",
    "env MY_COPY",
    "env MY_TOKEN",
    "/usr/bin/env",
    "sh -c 'echo key=$OPENAI_API_KEY copy=$MY_COPY token=$MY_TOKEN'",
    'sh -c \'tr "\\0" "\\n" < /proc/$PPID/environ\'',
]
"""ral's own ``env``; a program's whole environment; a granted shell; the shell host's
environment as the kernel shows it to any program it runs."""

SCENARIO = f"""
[fleet]
prompt = "Find the key."
secret_env = ["MY_TOKEN"]

[[agents.trunk]]
ral = {json.dumps(PROBES)}

[[agents.trunk]]
ral = ["reply done"]
"""

GRANTS = ("--grant-exec", "sh", "--grant-exec", "/usr/bin/env", "--grant-exec", "tr")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _holding(paths: list[Path], secret: str) -> list[str]:
    return [str(p) for p in paths if secret.encode() in p.read_bytes()]


def _tool_values(session: Path) -> list[str]:
    records = [
        json.loads(line) for line in (session / "transcript.jsonl").read_text().split("\n") if line
    ]
    return [str(r.get("value")) for r in records if r.get("kind") == "Io"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("agents", ["process", "thread"])
@pytest.mark.parametrize("how", ["environment", "flag"])
def test_no_shell_program_or_session_file_holds_the_key_however_it_was_given(
    tmp_path: Path, agents: str, how: str
) -> None:
    recording = tmp_path / "rec.toml"
    env = {"MY_COPY": KEY, "MY_TOKEN": "tok-4a5b6c7d8e9f"}
    args = ["--agents", agents, "--record", str(recording), *GRANTS]
    if how == "environment":
        env["OPENAI_API_KEY"] = KEY
    else:
        args += ["--api-key", KEY]
    run = scenario_run(tmp_path, SCENARIO, *args, env=env, timeout=100)
    assert run.code == 0, run.stderr

    values = _tool_values(run.session)[: len(PROBES)]  # then ``reply done``
    ral_key, ral_copy, ral_token, whole_env, shell, host_env = values
    assert ral_key.endswith("unit") and ral_copy.endswith("unit") and ral_token.endswith("unit")
    assert "PATH=" in whole_env and "OPENAI_API_KEY" not in whole_env
    assert "MY_COPY" not in whole_env and "MY_TOKEN" not in whole_env
    assert shell.endswith("key= copy= token=")
    assert "PATH=" in host_env and "OPENAI_API_KEY" not in host_env and KEY not in host_env
    assert "EXARCH_SESSION=" in whole_env, "every program carries the session's marker"

    files = [*_files(run.session), recording]
    assert _holding(files, KEY) == [], "the key was written to a file"
    assert _holding(files, "tok-4a5b6c7d8e9f") == [], "a --secret-env variable was written"
    spec = json.loads((run.session / "run.json").read_text())
    assert spec["secretEnv"] == ["MY_TOKEN"]


@pytest.mark.timeout(120)
def test_every_file_of_a_session_and_its_recording_is_private_to_the_user(tmp_path: Path) -> None:
    recording = tmp_path / "rec.toml"
    run = scenario_run(
        tmp_path, SCENARIO, "--agents", "process", "--record", str(recording), *GRANTS
    )
    assert run.code == 0, run.stderr
    files = [*_files(run.session), recording]
    dirs = [run.session, *(p for p in run.session.rglob("*") if p.is_dir())]
    assert any(p.name == "snapshot.msgpack" for p in files)
    assert any(p.parent.name == "scratch" for p in dirs)
    loose = [f"{p} {stat.filemode(p.stat().st_mode)}" for p in files if p.stat().st_mode & 0o077]
    loose += [f"{p} {stat.filemode(p.stat().st_mode)}" for p in dirs if p.stat().st_mode & 0o077]
    assert loose == []
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in dirs)


def test_a_bad_secret_env_name_is_refused_with_exit_2(tmp_path: Path) -> None:
    p = exarch(["run", "--secret-env", "A=B", "hi"], cwd=tmp_path)
    assert p.returncode == 2
    assert "--secret-env 'A=B': not an environment variable's name" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.timeout(120)
def test_the_agent_process_still_sends_the_key_and_the_model_never_sees_it(
    tmp_path: Path, protocol_server: ProtocolServer
) -> None:
    script = "sh -c 'echo key=$OPENAI_API_KEY'"
    calls = [script, "reply done", "reply done"]
    protocol_server.script(
        *[
            Exchange(chunks=openai_chunks(tool_calls=[(f"c{i}", "ral", json.dumps({"script": c}))]))
            for i, c in enumerate(calls)
        ]
    )
    base = protocol_server.url + "/v1"
    p = exarch(
        [
            *("run", "--agents", "process", "--provider", "openai", "--model", "m"),
            *("--base-url", base, "--session-dir", str(tmp_path / "s"), "Find the key."),
        ],
        cwd=tmp_path,
        env={"OPENAI_API_KEY": KEY},
        timeout=100,
    )
    assert p.returncode == 0, p.stderr
    assert len(protocol_server.requests) == 3
    for req in protocol_server.requests:
        headers = {k.lower(): v for k, v in req.headers.items()}
        assert headers["authorization"] == f"Bearer {KEY}"
        assert KEY.encode() not in req.raw, "the key went to the model inside a request"
    assert "key=" in protocol_server.requests[1].raw.decode()
    assert _holding(_files(tmp_path / "s"), KEY) == []
