"""The invariant checker over real session directories, healthy and damaged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from exarch_actors.runtime.drills.invariant_check import NotASession, check_session
from exarch_actors.runtime.state.durable import append_jsonl, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import commit_record
from exarch_actors.runtime.state.snapshot import MobileSnapshot
from tests.drills.conftest import run_scenario_text
from tests.support.records import sealed

FANOUT = """
[fleet]
prompt = "go"

[[agents.trunk]]
ral = ["let a = 1", "agent kid 'work'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"

[[agents.trunk]]
ral = ["reply done"]

[[agents.kid]]
ral = ["let x = 1", "let y = 2"]

[[agents.kid]]
ral = ["reply ok"]
"""


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    out = run_scenario_text(tmp_path, FANOUT)
    assert out.outcome == "replied"
    return out.session.root


def _drop_from_kid_snapshot(healthy: Path, name: str) -> Path:
    """Rewrite the kid's final snapshot file without ``name``; returns the file's path."""
    path = healthy / "agents" / "kid" / "snapshot.msgpack"
    snap = MobileSnapshot.load(path)
    bindings = {k: v for k, v in snap.bindings.items() if k != name}
    MobileSnapshot(
        snap.agent, snap.epoch, bindings, snap.context, snap.ledger, snap.workers
    ).write_atomic(path)
    return path


def test_a_clean_fanout_holds_every_invariant_and_records_a_commit_per_clean_call(
    healthy: Path,
) -> None:
    report = check_session(SessionDir(healthy))
    assert report.ok, report.to_json()
    assert {r.name for r in report.held} == {
        "settled",
        "committed",
        "rejections",
        "registry-empty",
        "no-leftover-processes",
        "files-parse",
    }
    commits = [
        json.loads(line)
        for agent in ("trunk", "kid")
        for line in (healthy / "agents" / agent / "commits.jsonl").read_text().splitlines()
    ]
    assert {c["kind"] for c in commits} == {"Commit"}
    shared = healthy / "record.jsonl"  # each agent's own file: no lock shared by every host
    assert not shared.exists() or '"Commit"' not in shared.read_text()
    defined = {(c["agent"], n) for c in commits for n in c["defined"]}
    assert {("trunk", "a"), ("kid", "x"), ("kid", "y")} <= defined
    assert all(isinstance(c["pidStartedAt"], float) for c in commits)


def test_a_committed_binding_missing_from_the_final_snapshot_is_a_violation(
    healthy: Path,
) -> None:
    _drop_from_kid_snapshot(healthy, "y")
    report = check_session(SessionDir(healthy))
    committed = report.get("committed")
    assert committed.status == "violated"
    assert any("'y'" in d for d in committed.details)


def test_a_prune_record_after_the_commit_explains_a_missing_binding(healthy: Path) -> None:
    _drop_from_kid_snapshot(healthy, "y")
    append_jsonl(
        healthy / "record.jsonl", {"kind": "Prune", "agent": "kid", "names": ["y"], "epoch": 99}
    )
    assert check_session(SessionDir(healthy)).get("committed").status == "held"


def _kid_loses_y(healthy: Path, *, later_writes_fail: bool, control_died: bool) -> str:
    """Drop ``y`` from the kid's snapshot file and report the refused snapshot write of the
    call that committed it (as the shell actor does), and of every later kid commit when
    ``later_writes_fail`` (the file never caught up); when ``control_died``, the kid's
    incarnation ends as resume records a killed control process. Returns the committed
    invariant's status."""
    path = _drop_from_kid_snapshot(healthy, "y")
    commits = [
        r
        for r in read_jsonl(healthy / "agents" / "kid" / "commits.jsonl").records
        if r.get("kind") == "Commit" and r["agent"] == "kid"
    ]
    first = next(i for i, c in enumerate(commits) if "y" in c["defined"])
    assert len(commits) > first + 1, "the kid commits again after y (its reply)"
    failing = commits[first:] if later_writes_fail else commits[first : first + 1]
    notices = [
        {
            "kind": "Notice",
            "agent": "kid",
            "notice": "SnapshotWriteFailed",
            "text": "snapshot write failed: [Errno 21] Is a directory; will retry",
            "data": {"path": str(path), "epoch": c["epoch"]},
            "at": c["at"],
        }
        for c in failing
    ]
    out = []
    for r in read_jsonl(healthy / "transcript.jsonl").records:
        if r.get("kind") == "Died" and r.get("agent") == "kid":
            out += notices
            if control_died:
                r = {**r, "outcome": "failed", "cause": "control process died"}
        out.append(r)
    (healthy / "transcript.jsonl").write_bytes(b"".join(sealed(r) for r in out))
    return check_session(SessionDir(healthy)).get("committed").status


def test_a_refused_snapshot_write_then_the_control_process_dying_is_a_reported_loss(
    healthy: Path,
) -> None:
    assert _kid_loses_y(healthy, later_writes_fail=True, control_died=True) == "held"
    notes = check_session(SessionDir(healthy)).get("committed").notes
    assert any("control process died before a retry" in n for n in notes)


def test_a_refused_snapshot_write_that_a_later_checkpoint_retried_explains_nothing(
    healthy: Path,
) -> None:
    assert _kid_loses_y(healthy, later_writes_fail=False, control_died=True) == "violated"


def test_a_refused_snapshot_write_without_a_crash_explains_nothing(healthy: Path) -> None:
    # the close retries a dirty file and reports a final failure; without one, y had to land
    assert _kid_loses_y(healthy, later_writes_fail=True, control_died=False) == "violated"


def test_a_torn_tail_is_reported_but_is_not_a_violation(healthy: Path) -> None:
    with (healthy / "transcript.jsonl").open("ab") as f:
        f.write(b'{"kind": "Io", "agent": "tr')
    files = check_session(SessionDir(healthy)).get("files-parse")
    assert files.status == "held"
    assert any("torn" in n for n in files.notes)


def test_a_corrupt_inner_line_is_a_violation(healthy: Path) -> None:
    p = healthy / "agents" / "kid" / "events.jsonl"
    lines = p.read_bytes().split(b"\n")
    lines.insert(1, b"{not json")
    p.write_bytes(b"\n".join(lines))
    assert check_session(SessionDir(healthy)).get("files-parse").status == "violated"


def test_an_open_slot_and_a_missing_died_are_violations(healthy: Path) -> None:
    append_jsonl(
        healthy / "spawn-journal.jsonl",
        {"kind": "spawned", "seq": 1000, "id": "ghost", "parent": "trunk"},
    )
    append_jsonl(healthy / "transcript.jsonl", {"kind": "Born", "agent": "ghost"})
    report = check_session(SessionDir(healthy))
    assert report.get("settled").status == "violated"
    assert report.get("registry-empty").status == "violated"
    assert any("ghost" in d for d in report.get("settled").details)


@pytest.mark.parametrize("where", ["agents/kid/commits.jsonl", "record.jsonl"])
def test_a_live_process_named_by_the_run_is_a_leftover_and_a_reused_pid_is_not(
    healthy: Path, where: str
) -> None:
    # an agent's own commits file, and record.jsonl, where older sessions kept Commit records
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:

        class R:
            epoch = 1
            defined = ()

        record = commit_record("kid", R(), proc.pid)
        append_jsonl(healthy / where, record)
        bad = check_session(SessionDir(healthy)).get("no-leftover-processes")
        assert bad.status == "violated" and str(proc.pid) in bad.details[0]
        reused = {**record, "pidStartedAt": psutil.Process(proc.pid).create_time() - 3600}
        (healthy / where).write_text(
            "\n".join(
                line
                for line in (healthy / where).read_text().splitlines()
                if str(proc.pid) not in line
            )
            + "\n"
        )
        append_jsonl(healthy / where, reused)
        assert check_session(SessionDir(healthy)).get("no-leftover-processes").status == "held"
    finally:
        proc.kill()
        proc.wait()


def test_a_directory_that_is_not_a_session_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotASession):
        check_session(SessionDir(tmp_path))


def test_check_command_exits_1_on_a_violation_and_prints_json(healthy: Path) -> None:
    from click.testing import CliRunner

    from exarch_actors.cli.check import check_command

    ok = CliRunner().invoke(check_command, [str(healthy), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["ok"] is True
    (healthy / "result.json").unlink()
    bad = CliRunner().invoke(check_command, [str(healthy)])
    assert bad.exit_code == 1
    assert "violated" in bad.output
