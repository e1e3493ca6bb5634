"""One owner per session directory: a run that is alive is never written into by a second
command (``resume``, ``run --session-dir``, ``drill --session-dir``), each refused with exit 2
and a message naming the live run's pid and directory; a run whose control process was
SIGKILLed holds nothing, so ``resume`` carries it on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import exarch, read_records
from tests.support.terminal import ROOT
from tests.support.waiting import wait_for

GATED = """
    [fleet]
    prompt = "x"

    [[agents.trunk]]
    ral = ["let rec wait = { || try { read-text gate } catch e { sleep 0.05; wait } }", "wait"]

    [[agents.trunk]]
    ral = ["reply done"]

    [[agents.trunk]]
    ral = ["reply done"]
"""
"""A trunk whose first ral call waits until the test creates ``gate``: alive as long as the
test needs it, with no clock in it."""


class LiveRun:
    """``exarch-actors run GATED --session-dir session`` in a subprocess, until ``gate`` exists."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.dir = tmp_path
        (tmp_path / "gated.toml").write_text(textwrap.dedent(GATED))
        self.session = tmp_path / "session"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from cli.main import main; main()",
                "run",
                "gated.toml",
                "--session-dir",
                "session",
                *args,
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_busy(self) -> None:
        """Until the trunk is in its waiting ral call (its shell has a host process)."""

        def calling() -> bool:
            transcript = self.session / "transcript.jsonl"
            kinds = [r.get("kind") for r in read_records(transcript)] if transcript.exists() else []
            return "Born" in kinds and self.proc.poll() is None

        wait_for(calling, 30, "the live run's trunk to be born")

    def finish(self) -> tuple[int, str, str]:
        (self.dir / "gate").write_text("open")
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveRun]:
    run = LiveRun(tmp_path)
    try:
        yield run
    finally:
        run.reap()


def _refused_as_live(p: subprocess.CompletedProcess[str], live: LiveRun) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "session is live: a run is still running in" in p.stderr
    assert f"pid {live.proc.pid}" in p.stderr
    assert "session" in p.stderr.split("running in", 1)[1]
    assert "Traceback" not in p.stderr


@pytest.mark.timeout(180)
def test_resume_and_a_second_run_on_a_live_session_are_refused_and_the_live_run_completes_untouched(
    live: LiveRun,
) -> None:
    live.wait_busy()
    resumed = exarch(["resume", "session"], cwd=live.dir)
    _refused_as_live(resumed, live)
    second = exarch(["run", "gated.toml", "--session-dir", "session"], cwd=live.dir)
    _refused_as_live(second, live)
    assert live.proc.poll() is None, "the live run is still running after both refusals"

    code, out, err = live.finish()
    assert code == 0, err
    assert out.strip() == "done"
    assert "outcome: replied" in err
    assert "panic" not in err and "rolled back" not in err
    records = read_records(live.session / "record.jsonl")
    assert not [r for r in records if r.get("kind") == "Rollback"], "the live shell never died"
    assert json.loads((live.session / "result.json").read_text())["outcome"] == "replied"


@pytest.mark.timeout(120)
def test_a_drill_into_a_live_session_is_refused_naming_the_live_run(live: LiveRun) -> None:
    live.wait_busy()
    drill = exarch(
        ["drill", "--seed", "1", "--session-dir", "session", "--duration", "1"], cwd=live.dir
    )
    _refused_as_live(drill, live)
    assert not list(live.session.glob("round-*")), "the drill wrote nothing into it"
    code, out, _ = live.finish()
    assert (code, out.strip()) == (0, "done")


@pytest.mark.timeout(180)
def test_resume_carries_on_a_run_whose_control_process_was_sigkilled(live: LiveRun) -> None:
    live.wait_busy()
    live.proc.send_signal(signal.SIGKILL)
    live.proc.communicate(timeout=30)
    (live.dir / "gate").write_text("open")
    resumed = exarch(["resume", "session"], cwd=live.dir, timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    assert "session is live" not in resumed.stderr
    assert "resumed: trunk rebuilt" in resumed.stderr
    assert resumed.stdout.strip() == "done"


@pytest.mark.timeout(180)
def test_a_run_recording_into_a_file_a_live_run_records_is_refused_and_the_file_holds_one_run(
    tmp_path: Path,
) -> None:
    live = LiveRun(tmp_path, "--record", "rec.toml")
    try:
        live.wait_busy()
        (tmp_path / "other.toml").write_text(textwrap.dedent(GATED))
        second = exarch(
            ["run", "other.toml", "--session-dir", "other", "--record", "rec.toml"], cwd=tmp_path
        )
        assert second.returncode == 2, second.stderr
        assert "another live run is recording into rec.toml;" in second.stderr
        assert not (tmp_path / "other").exists(), "refused before a session was made"
        code, out, _ = live.finish()
        assert (code, out.strip()) == (0, "done")
    finally:
        live.reap()
    recorded = (tmp_path / "rec.toml").read_text()
    assert recorded == (live.session / "recording.toml").read_text()
    assert recorded.count("[[agents.trunk]]") == 3, "one run's three replies, none interleaved"
    replayed = exarch(["run", "rec.toml", "--session-dir", "replayed"], cwd=tmp_path)
    assert (replayed.returncode, replayed.stdout.strip()) == (0, "done")
