"""``exarch-actors replay`` and ``--record`` as a user meets them: refusals (exit 2), a child
spawned under another name, the deadline, the volatile-part rules, ``fleet --record``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.runtime.providers.scenario import load_scenario
from tests.agent.conftest import exarch

NAMED_CHILD = """
[fleet]
prompt = "start the helper named in name.txt"

[[agents.trunk]]
ral = ["agent (read-text name.txt) 'say hi'; echo started"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"

[[agents.trunk]]
ral = ["reply done"]

[[agents.trunk]]
ral = ["reply done"]

[[agents.helper-a]]
ral = ["reply hi"]
"""


def _record(tmp_path: Path, toml: str, *extra: str, command: str = "run") -> tuple[Path, Path]:
    """Run ``toml`` with ``--record`` in ``tmp_path/work``; the work dir and the session."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    scenario = tmp_path / "s.toml"
    scenario.write_text(textwrap.dedent(toml))
    session = tmp_path / "recorded"
    args = [command, str(scenario), "--record", str(tmp_path / "rec.toml")]
    p = exarch([*args, "--session-dir", str(session), *extra], cwd=work)
    assert p.returncode == 0, p.stderr
    return work, session


def _replay(session: Path, out: Path, *args: str, cwd: Path) -> tuple[int, dict[str, Any], str]:
    p = exarch(["replay", str(session), "--session-dir", str(out), *args], cwd=cwd, timeout=120)
    report = json.loads((out / "replay-report.json").read_text()) if out.exists() else {}
    return p.returncode, report, p.stdout + p.stderr


def test_a_directory_without_a_recording_is_refused_with_exit_2(tmp_path: Path) -> None:
    p = exarch(["replay", str(tmp_path)], cwd=tmp_path)
    assert p.returncode == 2
    assert "has no recording.toml: record a run with --record FILE.toml" in p.stderr
    assert not (tmp_path / ".exarch").exists(), "a refused replay starts nothing"


def test_a_replay_never_writes_into_the_session_it_replays(tmp_path: Path) -> None:
    work, session = _record(tmp_path, '[fleet]\nprompt = "x"\n[[agents.trunk]]\nral = "reply 1"\n')
    before = sorted(p.name for p in session.iterdir())
    p = exarch(["replay", str(session), "--session-dir", str(session)], cwd=work)
    assert p.returncode == 2
    assert "never writes into the session it replays" in p.stderr
    assert sorted(p.name for p in session.iterdir()) == before


def test_a_recording_made_in_the_chat_ui_is_refused_by_replay_with_how_to_play_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "recording.toml").write_text(
        '[recording]\nprovider = "openai"\ninteractive = true\n'
    )
    p = exarch(["replay", str(tmp_path)], cwd=tmp_path)
    assert p.returncode == 2
    assert "was recorded in the chat UI" in p.stderr and "exarch-actors chat" in p.stderr


def test_record_into_a_missing_directory_is_refused_before_any_session_exists(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text('[fleet]\nprompt = "x"\n[[agents.trunk]]\nral = "reply 1"\n')
    p = exarch(["run", str(scenario), "--record", "no/such/dir/r.toml"], cwd=tmp_path)
    assert p.returncode == 2
    assert "no/such/dir is not a directory" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.toml"]


@pytest.mark.slow
def test_a_child_spawned_under_another_name_is_a_spawn_divergence_and_the_replay_ends(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "name.txt").write_text("helper-a")
    _, session = _record(tmp_path, NAMED_CHILD)
    (work / "name.txt").write_text("helper-b")
    code, report, out = _replay(session, tmp_path / "replayed", cwd=work)
    assert code == 1, out
    found = {(d["agent"], d["kind"], d["then"], d["now"]) for d in report["divergences"]}
    assert found == {
        ("trunk", "spawn", "helper-a", "helper-b"),
        ("helper-a", "agent", "present", "absent"),
        ("helper-b", "agent", "absent", "present"),
    }
    assert "trunk: spawn 1 differs" in out


def test_a_replay_past_its_deadline_is_cancelled_and_counts_as_diverged(tmp_path: Path) -> None:
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "recording.toml").write_text(
        '[recording]\nprovider = "openai"\n[fleet]\nprompt = "x"\n'
        '[[agents.trunk]]\nral = ["sleep 60"]\n'
    )
    code, report, out = _replay(recorded, tmp_path / "late", "--deadline", "1", cwd=tmp_path)
    assert code == 1, out
    (late,) = report["divergences"]
    assert (late["agent"], late["kind"]) == ("*", "deadline")
    assert "the replay did not finish within 1 s: cancelled" in out


VOLATILE = """
[fleet]
prompt = "what time is it"

[[agents.trunk]]
ral = ["sh -c 'date -u +%Y-%m-%dT%H:%M:%S.%NZ; echo pid $$'"]

[[agents.trunk]]
ral = ["reply ok"]

[[agents.trunk]]
ral = ["reply ok"]
"""


@pytest.mark.slow
def test_timestamps_and_pids_diverge_unless_the_ignore_rules_blank_them(tmp_path: Path) -> None:
    work, session = _record(tmp_path, VOLATILE)
    code, report, out = _replay(session, tmp_path / "strict", cwd=work)
    assert code == 1, out
    (d,) = report["divergences"]
    assert (d["agent"], d["call"], d["parts"]) == ("trunk", 1, ["value"])
    code, report, out = _replay(session, tmp_path / "time", "--ignore", "time", cwd=work)
    assert code == 1, "the pid still differs"
    assert "<time>" in report["divergences"][0]["then"]
    code, report, out = _replay(
        session, tmp_path / "both", "--ignore", "time", "--ignore", "pid", cwd=work
    )
    assert code == 0, out
    assert report["ignore"] == ["session", "time", "pid"]
    assert "no divergence: 3 ral calls of 1 agent returned" in out


def test_fleet_record_writes_the_recording_with_each_child_under_its_name(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "name.txt").write_text("helper-a")
    _, session = _record(tmp_path, NAMED_CHILD, "--no-live", command="fleet")
    scenario = load_scenario(tmp_path / "rec.toml")
    assert scenario.recording is not None and scenario.recording["provider"] == "scripted"
    assert scenario.agents["helper-a"][0].ral == ("reply hi",)
    assert "# helper-a, reply 1 (spawned by trunk)" in (session / "recording.toml").read_text()
