"""Fixtures for drills: in-process fleet runs with fault natives on, in a temporary directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from exarch_actors.cli.runner import RunOutcome, RunSpec, run_headless
from exarch_actors.runtime.providers.scenario import load_scenario
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import eventually


@pytest.fixture(autouse=True)
def faults_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("EXARCH_FAULTS", "1")
    yield


def run_scenario_text(tmp: Path, toml: str, name: str = "run") -> RunOutcome:
    """Run a scenario to its end in this process; the session is ``tmp/name``."""
    path = tmp / f"{name}.toml"
    path.write_text(toml)
    spec = RunSpec("scripted", None, load_scenario(path), session_dir=str(tmp / name))
    return run_headless(spec)


@dataclass
class LiveRun:
    """A fleet running on a background thread; ``fleet`` once it has started."""

    session: Path
    thread: threading.Thread
    fleet: Any = None
    result: RunOutcome | None = None
    error: BaseException | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def finish(self, timeout: float = 30.0) -> RunOutcome:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not end"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def start_live(tmp: Path, toml: str, name: str = "live") -> LiveRun:
    path = tmp / f"{name}.toml"
    path.write_text(toml)
    spec = RunSpec("scripted", None, load_scenario(path), session_dir=str(tmp / name))
    live = LiveRun(tmp / name, threading.Thread(target=lambda: None))

    def on_start(fleet: Any) -> None:
        live.fleet = fleet
        live.started.set()

    def target() -> None:
        try:
            live.result = run_headless(spec, on_start=on_start)
        except BaseException as e:
            live.error = e
        finally:
            live.started.set()

    live.thread = threading.Thread(target=target, name=f"live-{name}")
    live.thread.start()
    assert live.started.wait(30)
    return live


CRASH_SCENARIO = """
[fleet]
prompt = "two helpers"

[[agents.trunk]]
ral = ["let base = 40", "agent quick 'fast'", "agent slow 'slow'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = 2

[[agents.trunk]]
ral = ["reply (add $base 2)"]

[[agents.quick]]
ral = ["let q = 1; reply q"]

[[agents.slow]]
ral = ["let s1 = 1"]

[[agents.slow]]
ral = ["sleep 30; let never = 1"]

[[agents.slow]]
ral = ["let s2 = 2; reply s"]
"""


def settled_ids(session: Path) -> set[str]:
    return {
        r["id"]
        for r in read_jsonl(session / "spawn-journal.jsonl").records
        if r["kind"] == "cancelled"
        or (r["kind"] == "settled" and r.get("retainedExecution") != "pending")
    }


def _died_on_transcript(transcript: Path, name: str) -> bool:
    if not transcript.exists():
        return False
    return any(
        '"kind": "Died"' in raw and f'"{name}"' in raw
        for raw in transcript.read_text().splitlines()
    )


def spawn_run(
    scenario: Path, session: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``exarch-actors run SCENARIO --session-dir SESSION FLAGS`` as a real control process,
    for a test to SIGKILL; the caller waits for it. Its output goes to :func:`run_log` (what a
    failing assertion quotes: a run that ended wrong under load says why)."""
    argv = ["run", str(scenario), "--session-dir", str(session), *flags]
    with run_log(session).open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def run_log(session: Path) -> Path:
    """Where :func:`spawn_run` writes the output of the run of ``session`` (beside it)."""
    return session.with_name(session.name + ".log")


def run_story(session: Path) -> str:
    """The end of a spawned run's output and of its transcript: the message of an assertion
    about how the run ended."""
    parts = []
    for path in (run_log(session), session / "transcript.jsonl"):
        text = path.read_text(errors="replace") if path.exists() else "(none)"
        parts.append(f"--- {path.name} (end) ---\n{text[-3000:]}")
    return "\n".join(parts)


def kill_mid_run(tmp_path: Path, *flags: str) -> Path:
    """A session whose control process was SIGKILLed mid-run: ``quick`` settled, ``slow`` in the
    middle of a 30 s call, no ``result.json``. ``flags`` go to ``run``."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(CRASH_SCENARIO)
    session = tmp_path / "session"
    proc = spawn_run(scenario, session, *flags, env={**os.environ, "EXARCH_FAULTS": "1"})
    try:
        events = session / "agents" / "slow" / "events.jsonl"
        transcript = session / "transcript.jsonl"
        # quick's ``Died`` follows its settlement on the transcript (actors/fleet.py settles
        # first): a kill between the two left no Died for the tests that damage it
        assert eventually(
            lambda: (
                "quick" in settled_ids(session)
                and _died_on_transcript(transcript, "quick")
                and "sleep 30" in (events.read_text() if events.exists() else "")
            ),
            20,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (session / "result.json").exists()
    return session


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One :func:`kill_mid_run` session per module, its dead run's processes killed; copy it
    with :func:`copy_session` before touching it."""
    from exarch_actors.runtime.state.run_processes import leftover_processes

    session = kill_mid_run(tmp_path_factory.mktemp("crashed"))
    for proc in leftover_processes(SessionDir(session)):
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    return session


def copy_session(session: Path, into: Path) -> Path:
    out = into / "session"
    shutil.copytree(session, out, symlinks=True)
    return out


FINISHED_SCENARIO = """
[fleet]
prompt = "two children"

[[agents.trunk]]
ral = ["agent a 'one'", "agent b 'two'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = 2

[[agents.trunk]]
ral = ["reply 42"]

[[agents.a]]
ral = ["let x = 1; reply 1"]

[[agents.b]]
ral = ["let y = 2; reply 2"]
"""


@pytest.fixture(scope="module")
def finished_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished two-child run per module; copy it with :func:`copy_session`."""
    out = run_scenario_text(tmp_path_factory.mktemp("finished"), FINISHED_SCENARIO)
    assert out.outcome == "replied" and out.reply == "42"
    return out.session.root


def exarch_cli(*args: str) -> Result:
    """``exarch-actors ARGS`` in this process, through the command group as a user runs it
    (invoking a subcommand object directly would leave click's cached help option without the
    group's ``-h``). Fails the test on any exception but the command's own exit."""
    from exarch_actors.cli.main import main

    res = CliRunner().invoke(main, list(args), prog_name="exarch-actors")
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError("".join(traceback.format_exception(res.exception)))
    assert "Traceback" not in res.output, res.output
    return res
