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

    def __init__(self, tmp_path: Path, *args: str, session: str = "session") -> None:
        self.dir = tmp_path
        (tmp_path / "gated.toml").write_text(textwrap.dedent(GATED))
        self.session = tmp_path / session
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from exarch_actors.cli.main import main; main()",
                "run",
                "gated.toml",
                "--session-dir",
                session,
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


QUICK = '[fleet]\nprompt = "x"\n' + '[[agents.trunk]]\nral = ["reply 1"]\n' * 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sessions_lists_every_run_with_its_outcome_size_and_liveness_and_prune_spares_the_live_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "quick.toml").write_text(QUICK)
    for _ in range(2):
        done = exarch(["run", "quick.toml"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    live = LiveRun(tmp_path, session=".exarch/sessions/live-one")
    try:
        live.wait_busy()
        listed = exarch(["sessions", "--json"], cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        by_id = {s["id"]: s for s in json.loads(listed.stdout)["sessions"]}
        assert len(by_id) == 3
        assert by_id["live-one"]["live"] is True and by_id["live-one"]["pid"] == live.proc.pid
        assert by_id["live-one"]["outcome"] == "running"
        finished = [s for i, s in by_id.items() if i != "live-one"]
        assert all(s["outcome"] == "replied" and not s["live"] for s in finished)
        assert all(s["bytes"] > 0 for s in finished)

        table = exarch(["sessions"], cwd=tmp_path)
        assert f"pid {live.proc.pid}" in table.stdout and "running" in table.stdout

        pruned = exarch(["sessions", "--prune", "--keep", "0", "--json"], cwd=tmp_path)
        assert pruned.returncode == 0, pruned.stderr
        report = json.loads(pruned.stdout)
        assert sorted(s["id"] for s in report["removed"]) == sorted(s["id"] for s in finished)
        assert [s["id"] for s in report["sessions"]] == ["live-one"]
        assert live.session.is_dir() and live.proc.poll() is None, "the live run untouched"
        code, out, _ = live.finish()
        assert (code, out.strip()) == (0, "done")
    finally:
        live.reap()
    assert sorted(p.name for p in (tmp_path / ".exarch" / "sessions").iterdir()) == ["live-one"]


def test_prune_removes_only_what_passes_every_rule_and_never_a_live_session() -> None:
    import datetime as dt

    from exarch_actors.cli.sessions import SessionEntry, prune_candidates

    now = dt.datetime(2026, 1, 10, tzinfo=dt.UTC)

    def entry(name: str, days_old: int, live: bool = False) -> SessionEntry:
        return SessionEntry(Path(name), now - dt.timedelta(days=days_old), "replied", 1, None, live)

    newest_first = [entry("a", 0), entry("b", 2), entry("c", 8, live=True), entry("d", 9)]
    week = dt.timedelta(days=7)

    def names(chosen: list[SessionEntry]) -> list[str]:
        return [e.path.name for e in chosen]

    assert names(prune_candidates(newest_first, now, week, None)) == ["d"]
    assert names(prune_candidates(newest_first, now, None, 1)) == ["b", "d"]
    assert names(prune_candidates(newest_first, now, week, 3)) == ["d"]
    assert names(prune_candidates(newest_first, now, None, 0)) == ["a", "b", "d"]


def test_sessions_prune_without_a_rule_is_refused_with_exit_2(tmp_path: Path) -> None:
    p = exarch(["sessions", "--prune"], cwd=tmp_path)
    assert p.returncode == 2 and "--prune needs --older-than DURATION and/or --keep N" in p.stderr
    p = exarch(["sessions", "--prune", "--older-than", "soon"], cwd=tmp_path)
    assert p.returncode == 2 and "not a duration like 30m" in p.stderr
