"""The durability policy reaches every writer of a session, is kept in ``run.json`` and is what
``resume`` keeps; ``check`` says what the policy promised."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exarch_actors.actors.resume import resume_run
from exarch_actors.cli.runner import RunSpec, run_headless
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.providers.scenario import load_scenario
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durability import Durability
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_read import ResumeRefused, read_run
from tests.drills.conftest import kill_mid_run
from tests.support.fsyncs import CountingFsync
from tests.support.records import rewrite_document

ROOT = Path(__file__).resolve().parents[2]


class NamingFsync(CountingFsync):
    """Counts fsyncs and names the file each one made durable."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __call__(self, fd: int) -> None:
        self.names.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        super().__call__(fd)


def _run(session: Path, policy: Durability) -> None:
    spec = RunSpec(
        "scripted",
        None,
        load_scenario(ROOT / "examples" / "fanout.toml"),
        session_dir=str(session),
        durability=policy,
    )
    out = run_headless(spec)
    assert out.outcome == "replied", out


def test_a_machine_run_group_commits_the_transcript_journal_event_logs_and_result(
    tmp_path: Path,
) -> None:
    session = tmp_path / "s"
    fsync = NamingFsync()
    files = durability.bind(session, Durability.MACHINE, fsync=fsync)  # the fleet shares it
    try:
        _run(session, Durability.MACHINE)
    finally:
        durability.unbind(files)
    names = set(fsync.names)
    for name in ("transcript.jsonl", "spawn-journal.jsonl", "events.jsonl", "commits.jsonl"):
        assert name in names, names
    assert any(n.startswith(".result.json.") for n in names), names  # before its rename
    assert any(n.startswith(".run.json.") for n in names), names
    appended = sum(1 for n in fsync.names if n.endswith(".jsonl"))
    assert 0 < appended <= files.records
    assert json.loads((session / "run.json").read_text())["durability"] == "machine"
    report = check_session(SessionDir(session))
    assert report.ok, json.dumps(report.to_json(), indent=1)
    assert report.durability is Durability.MACHINE


def test_a_process_run_makes_no_fsync_through_its_policy(tmp_path: Path) -> None:
    session = tmp_path / "s"
    fsync = NamingFsync()
    files = durability.bind(session, Durability.PROCESS, fsync=fsync)
    try:
        _run(session, Durability.PROCESS)
    finally:
        durability.unbind(files)
    assert fsync.names == []
    assert files.records > 0
    assert json.loads((session / "run.json").read_text())["durability"] == "process"
    report = check_session(SessionDir(session))
    assert report.ok and report.durability is Durability.PROCESS


@pytest.mark.slow
def test_resume_keeps_the_policy_run_json_names(tmp_path: Path) -> None:
    session = kill_mid_run(tmp_path, "--durability", "machine")
    assert json.loads((session / "run.json").read_text())["durability"] == "machine"
    fsync = CountingFsync()
    # Held under machine: a resume that chose process would be refused as a conflict.
    files = durability.bind(session, Durability.MACHINE, fsync=fsync)
    try:
        out = resume_run(SessionDir(session))
    finally:
        durability.unbind(files)
    assert out.outcome == "replied"
    assert fsync.calls > 0


def test_run_json_with_an_unknown_durability_is_refused_by_name(tmp_path: Path) -> None:
    _run(tmp_path / "s", Durability.PROCESS)
    rewrite_document(tmp_path / "s" / "run.json", durability="disk")
    with pytest.raises(ResumeRefused, match="durability 'disk' is not one of"):
        read_run(SessionDir(tmp_path / "s"))


def test_a_session_older_than_the_knob_reads_as_process(tmp_path: Path) -> None:
    _run(tmp_path / "s", Durability.PROCESS)
    rewrite_document(tmp_path / "s" / "run.json", durability=...)
    assert check_session(SessionDir(tmp_path / "s")).durability is Durability.PROCESS
