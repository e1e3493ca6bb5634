"""Record a real run, replay it offline: the issue's "done when", end to end.

A fleet (a trunk whose first reply makes two tool calls in parallel, one of them spawning a child
that makes two parallel calls of its own) runs against a loopback OpenAI-compatible server with
``--record``. The recording then plays offline (no server, no key) to the same output; ``replay``
finds nothing diverged; after one file the child reads is changed, ``replay`` reports exactly that
call and exits 1; and a recording whose process was SIGKILLed mid-run still replays its prefix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.runtime.providers.scenario import load_scenario
from exarch_actors.runtime.state.durable import read_jsonl
from tests.agent.conftest import ROOT, exarch
from tests.replay.conftest import AgentRoutedServer, calls, exarch_json, say
from tests.support.protocol_servers import Exchange
from tests.support.waiting import wait_for

SUM = "let total = fold { |a, x| add $a (int $x) } 0 (lines (read-text numbers.txt)); echo $total"
TASK = "Sum the numbers in numbers.txt and reply with the sum."


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "title.txt").write_text("inventory")
    (work / "numbers.txt").write_text("3\n4\n5")
    return work


def _script_trunk_start(server: AgentRoutedServer) -> None:
    server.script_for(
        "trunk",
        calls(
            ("call_t1", "read-text title.txt"),
            ("call_t2", f"agent kid '{TASK}'"),
            text="Reading the title while a helper sums.",
        ),
    )


def _script_kid(server: AgentRoutedServer) -> None:
    server.script_for(
        "kid",
        calls(("call_k1", SUM), ("call_k2", "pwd")),
        calls(("call_k3", "reply $total")),
    )


def _script_workflow(server: AgentRoutedServer) -> None:
    _script_trunk_start(server)
    _script_kid(server)
    server.script_for(
        "trunk",
        say("Waiting for the helper."),
        calls(("call_t3", 'reply "inventory: 12"')),
        calls(("call_t4", 'reply "inventory: 12"')),
    )


def _record_args(server: AgentRoutedServer, session: Path, recording: Path) -> list[str]:
    return [
        "run",
        "--provider",
        "openai",
        "--base-url",
        server.url + "/v1",
        "--model",
        "loopback-model",
        "--api-key",
        "sk-test-secret-key",
        "--session-dir",
        str(session),
        "--record",
        str(recording),
        "Make an inventory.",
    ]


def _offline_env() -> dict[str, str]:
    return {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": "", "OPENAI_BASE_URL": "http://127.0.0.1:9"}


def _tool_results(session: Path, agent: str) -> list[tuple[str, bool]]:
    return [
        (r["message"]["content"], r["message"]["is_error"])
        for r in read_jsonl(session / "agents" / agent / "events.jsonl").records
        if r["kind"] == "tool_result"
    ]


def _recorded(routed_server: AgentRoutedServer, tmp_path: Path) -> tuple[Path, Path, Path]:
    work = _workdir(tmp_path)
    _script_workflow(routed_server)
    session, recording = tmp_path / "recorded", tmp_path / "inventory.toml"
    code, out, err = exarch_json(_record_args(routed_server, session, recording), work)
    assert code == 0, err
    assert out["reply"] == "inventory: 12"
    return work, session, recording


@pytest.mark.slow
def test_a_recorded_fleet_replays_offline_to_the_same_output_and_replay_finds_no_divergence(
    routed_server: AgentRoutedServer, tmp_path: Path
) -> None:
    work, session, recording = _recorded(routed_server, tmp_path)
    parallel = [r for r in routed_server.requests if r.body["messages"][-1]["role"] == "tool"]
    assert parallel, "the model's replies were answered with tool results"
    text = recording.read_text()
    assert "sk-test-secret-key" not in text and "authorization" not in text.lower()
    assert (session / "recording.toml").read_text() == text
    scenario = load_scenario(recording)
    assert scenario.warnings == ()
    assert scenario.recording is not None
    assert (scenario.recording["provider"], scenario.recording["model"]) == (
        "openai",
        "loopback-model",
    )
    first = scenario.agents["trunk"][0]
    assert first.ral == ("read-text title.txt", f"agent kid '{TASK}'")
    assert first.ids == ("call_t1", "call_t2"), "the model's call ids are kept"
    assert first.usage_tokens == 12 and first.usage_output_tokens == 5
    assert scenario.agents["kid"][0].ral == (SUM, "pwd")

    served = len(routed_server.requests)
    code, played, err = exarch_json(
        ["run", str(recording), "--session-dir", str(tmp_path / "played")],
        work,
        env=_offline_env(),
    )
    assert code == 0, err
    assert len(routed_server.requests) == served, "the replay made no request"
    original = json.loads((session / "result.json").read_text())
    assert (played["outcome"], played["reply"]) == (original["outcome"], original["reply"])
    for key in ("spawned", "done", "down", "cancelled", "neverSettled"):
        assert played["fleetYield"][key] == original["fleetYield"][key], key
    assert played["fleetYield"]["spend"]["kid"]["tokensIn"] == 24, "usage replayed too"
    for agent in ("trunk", "kid"):
        assert _tool_results(tmp_path / "played", agent) == _tool_results(session, agent)

    code, report, err = exarch_json(
        ["replay", str(session), "--session-dir", str(tmp_path / "again")],
        work,
        env=_offline_env(),
    )
    assert code == 0, err
    assert report["divergences"] == [] and report["diverged"] is False
    assert report["agents"] == 2 and report["calls"] == 7
    on_disk = json.loads((tmp_path / "again" / "replay-report.json").read_text())
    assert on_disk == report
    assert len(routed_server.requests) == served


@pytest.mark.slow
def test_replay_reports_exactly_the_call_that_read_a_changed_file_and_exits_1(
    routed_server: AgentRoutedServer, tmp_path: Path
) -> None:
    work, session, _ = _recorded(routed_server, tmp_path)
    (work / "numbers.txt").write_text("3\n4\n6")
    p = exarch(["replay", str(session), "--session-dir", str(tmp_path / "changed")], cwd=work)
    assert p.returncode == 1, p.stderr
    report = json.loads((tmp_path / "changed" / "replay-report.json").read_text())
    (only,) = report["divergences"]
    assert (only["agent"], only["kind"], only["call"], only["call_id"]) == (
        "kid",
        "result",
        1,
        "call_k1",
    )
    assert only["script"] == SUM and only["parts"] == ["stdout"]
    assert only["then"].endswith("[stdout]\n12\n") and only["now"].endswith("[stdout]\n13\n")
    shown = p.stdout
    assert "kid: call 1 returned a different stdout (call_k1)" in shown
    assert "12" in shown and "13" in shown
    assert "diverged: 1 of 2 agents" in shown
    assert not (session / "replay-report.json").exists(), "the recorded session is never written"


def _kill_when(proc: subprocess.Popen[Any], cond: Any, what: str) -> None:
    try:
        wait_for(cond, 30, what)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_recording_sigkilled_mid_run_still_replays_its_prefix(
    routed_server: AgentRoutedServer, tmp_path: Path
) -> None:
    work = _workdir(tmp_path)
    _script_trunk_start(routed_server)
    _script_kid(routed_server)
    routed_server.script_for("trunk", Exchange(hang=True))  # the trunk's second reply never comes
    session, recording = tmp_path / "recorded", tmp_path / "inventory.toml"
    cmd = [sys.executable, "-c", "from exarch_actors.cli.main import main; main()"]
    proc = subprocess.Popen(
        [*cmd, *_record_args(routed_server, session, recording)],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _kill_when(
        proc,
        lambda: (
            len(routed_server.requests_of("trunk")) == 2 and _answered(session, "kid", "call_k3")
        ),
        "the kid's reply recorded and the trunk waiting on its second reply",
    )
    assert not (session / "result.json").exists(), "the run was killed before it ended"

    scenario = load_scenario(recording)
    assert scenario.warnings == ()
    assert len(scenario.agents["trunk"]) == 1 and len(scenario.agents["kid"]) == 2

    code, report, err = exarch_json(
        ["replay", str(session), "--session-dir", str(tmp_path / "prefix")],
        work,
        env=_offline_env(),
    )
    assert code == 0, err
    assert report["divergences"] == [] and report["thenFinished"] is False
    assert report["notes"] == [
        "the recorded run did not finish: it is compared as a prefix of the replay"
    ]
    assert _tool_results(tmp_path / "prefix", "kid") == _tool_results(session, "kid")
    assert _tool_results(tmp_path / "prefix", "trunk")[:2] == _tool_results(session, "trunk")

    code, played, err = exarch_json(
        ["run", str(recording), "--session-dir", str(tmp_path / "played")],
        work,
        env=_offline_env(),
    )
    assert code == 0, err
    assert played["outcome"] == "quiesced", "the recording ends where the run was killed"
    assert played["lastText"] == "Reading the title while a helper sums."
    assert played["fleetYield"]["done"] == 1, "the child's recorded replies played in full"
    trunk_inbox = read_jsonl(tmp_path / "played" / "agents" / "trunk" / "events.jsonl").records
    assert any(r.get("source") == "agent_result" and "12" in r["text"] for r in trunk_inbox)


def _answered(session: Path, agent: str, call_id: str) -> bool:
    """Whether ``agent``'s event log holds the result of ``call_id``."""
    return any(
        r["kind"] == "tool_result" and r["message"]["tool_call_id"] == call_id
        for r in read_jsonl(session / "agents" / agent / "events.jsonl").records
    )


@pytest.mark.slow
def test_a_fleet_recorded_with_agents_as_processes_replays_offline_with_no_divergence(
    routed_server: AgentRoutedServer, tmp_path: Path
) -> None:
    # Each agent's provider runs in its own agent process; the recording is written by the
    # control side from the replies those processes forward to it.
    work = _workdir(tmp_path)
    _script_workflow(routed_server)
    session, recording = tmp_path / "recorded", tmp_path / "inventory.toml"
    args = _record_args(routed_server, session, recording)
    code, out, err = exarch_json([*args[:1], "--agents", "process", *args[1:]], work)
    assert code == 0, err
    assert out["reply"] == "inventory: 12"
    born = [r for r in read_jsonl(session / "transcript.jsonl").records if r["kind"] == "Born"]
    assert {r["agent"] for r in born} == {"trunk", "kid"}
    assert len({r["pid"] for r in born}) == 2, "each agent in a process of its own"
    scenario = load_scenario(recording)
    assert scenario.warnings == ()
    assert [m.ral for m in scenario.agents["kid"]] == [(SUM, "pwd"), ("reply $total",)]
    assert scenario.agents["trunk"][0].ral == ("read-text title.txt", f"agent kid '{TASK}'")
    assert "kid, reply 1 (spawned by trunk)" in recording.read_text(), "its parent named"

    served = len(routed_server.requests)
    code, report, err = exarch_json(
        ["replay", str(session), "--session-dir", str(tmp_path / "again")],
        work,
        env=_offline_env(),
    )
    assert code == 0, err
    assert report["divergences"] == [] and report["diverged"] is False
    assert report["agents"] == 2 and report["calls"] == 7
    assert len(routed_server.requests) == served, "the replay made no request"
    replayed = read_jsonl(tmp_path / "again" / "transcript.jsonl").records
    assert len({r["pid"] for r in replayed if r["kind"] == "Born"}) == 2, "replayed as processes"
    for agent in ("trunk", "kid"):
        assert _tool_results(tmp_path / "again", agent) == _tool_results(session, agent)
