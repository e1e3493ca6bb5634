"""``--record`` keeps every MCP result in the recording, so ``replay`` (and ``run`` of the
recording) play the run offline with the server gone."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

from exarch_actors.runtime.providers.scenario import load_scenario
from tests.agent.conftest import exarch
from tests.mcp.conftest import SERVER


def _scenario(tmp_path: Path) -> tuple[Path, Path, Path]:
    server = tmp_path / "server.py"
    shutil.copy(SERVER, server)
    log = tmp_path / "server.log"
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        textwrap.dedent(
            f"""
            [fleet]
            prompt = "add with the server"

            [mcp.t]
            command = {str(sys.executable)!r}
            args = [{str(server)!r}, {str(log)!r}]

            [[agents.trunk]]
            ral = ['let tools = mcp-tools t; let r = mcp t add [a: 20, b: 22]; echo (get $r sum)']

            [[agents.trunk]]
            ral = ['try {{ mcp t fail [message: nope] }} catch e {{ echo (get $e message) }}']

            [[agents.trunk]]
            ral = ['reply (get $r sum)']
            """
        )
    )
    return scenario, server, log


def test_a_recorded_run_replays_offline_with_the_server_absent(tmp_path: Path) -> None:
    scenario, server, log = _scenario(tmp_path)
    recording = tmp_path / "rec.toml"
    first = exarch(
        ["run", str(scenario), "--session-dir", "s1", "--record", str(recording)],
        cwd=tmp_path,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "42"
    recorded = load_scenario(recording)
    replies = recorded.mcp_replies["t"]
    assert [(r.method, r.tool) for r in replies] == [
        ("tools/list", None),
        ("tools/call", "add"),
        ("tools/call", "fail"),
    ]
    assert recorded.mcp[0].transport == "recorded"  # the command is not in the recording

    server.unlink()  # the server is gone: nothing can start it
    log.unlink()
    replay = exarch(["replay", "s1", "--session-dir", "s2"], cwd=tmp_path, timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    played = exarch(
        ["run", str(recording), "--session-dir", "s3"], cwd=tmp_path, timeout=120
    )
    assert played.returncode == 0, played.stderr
    assert played.stdout.strip() == "42"
    assert not log.exists()


def test_a_replay_that_calls_what_the_recording_lacks_is_a_clear_ral_error(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        textwrap.dedent(
            """
            [[mcp.t.replies]]
            method = "tools/call"
            tool = "add"
            arguments = '{"a": 1, "b": 2}'
            result = '{"content": [], "structuredContent": {"sum": 3}}'
            stop = "result"

            [fleet]
            prompt = "go"

            [[agents.trunk]]
            ral = ['''
            let ok = mcp t add [b: 2, a: 1]
            try { mcp t add [a: 9, b: 9] } catch e { reply [ok: $ok, e: (get $e message)] }
            ''']
            """
        )
    )
    run = exarch(["run", str(scenario), "--session-dir", "s"], cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "[sum: 3]" in run.stdout
    assert "the recording has no reply left for add" in run.stdout
