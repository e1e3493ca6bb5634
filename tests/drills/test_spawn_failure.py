"""A spawn that fails never leaves anyone waiting, and a new run never reuses a run's directory.

Before the fix, a child whose admission failed after it was registered stayed in the registry for
ever: its parent's park verdict waited for a result that could not come, and the run hung (the
first-hour report: ``run --session-dir D`` into a finished ``D``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exarch_actors.cli.runner import RunOutcome
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import exarch_cli, start_live

TWICE = """
[fleet]
prompt = "spawn lo, then spawn lo again"

[[agents.trunk]]
ral = ["agent lo 'one'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"

[[agents.trunk]]
ral = ["agent lo 'again'"]

[[agents.trunk]]
ral = ["reply done"]

[[agents.lo]]
ral = ["reply 1"]
"""

ONE_CHILD = """
[fleet]
prompt = "spawn lo"

[[agents.trunk]]
ral = ["agent lo 'one'"]

[[agents.trunk]]
ral = ["reply done"]

[[agents.lo]]
ral = ["reply 1"]
"""


def _finish_or_fail(tmp: Path, toml: str) -> RunOutcome:
    """Run to the end on a thread; a run that would hang is cancelled and the test fails (so a
    regression costs 30 s, not the suite's timeout, and leaks nothing)."""
    live = start_live(tmp, toml)
    live.thread.join(30)
    if live.thread.is_alive():
        live.fleet.cancel_all("test: the run hung")
        live.finish()
        pytest.fail("the run hung waiting for a child that never started")
    return live.finish()


def _io_values(session: Path) -> list[str]:
    return [
        str(r.get("value"))
        for r in read_jsonl(session / "transcript.jsonl").records
        if r.get("kind") == "Io"
    ]


def test_a_child_whose_scratch_cannot_be_made_fails_its_spawn_call_and_nobody_waits_for_it(
    tmp_path: Path,
) -> None:
    session = tmp_path / "live"
    (session / "scratch").mkdir(parents=True)
    (session / "scratch" / "lo").write_text("a file where the child's scratch directory goes")
    out = _finish_or_fail(tmp_path, ONE_CHILD)
    assert out.outcome == "replied" and out.reply == "done"
    assert any("spawn failed: 'lo' could not be started" in v for v in _io_values(session))
    journal = read_jsonl(session / "spawn-journal.jsonl").records
    assert [r["kind"] for r in journal if r["id"] == "lo"][-1] == "settled"
    assert journal[-1]["status"] == "down" and "spawn failed" in journal[-1]["reason"]
    born = [r for r in read_jsonl(session / "transcript.jsonl").records if r["kind"] == "Born"]
    assert [r["agent"] for r in born] == ["trunk"], "a child that never started is never Born"
    report = check_session(SessionDir(session))
    assert report.ok, report.to_json()


def test_a_second_child_under_a_used_name_is_refused_by_name_and_the_run_ends(
    tmp_path: Path,
) -> None:
    out = _finish_or_fail(tmp_path, TWICE)
    assert out.outcome == "replied" and out.reply == "done"
    assert any(
        "name used: a child named 'lo' already ran in this run" in v
        for v in _io_values(out.session.root)
    )
    assert check_session(out.session).ok


def _run_cli(session: Path, scenario: Path) -> tuple[int, str]:
    res = exarch_cli("run", str(scenario), "--session-dir", str(session))
    return res.exit_code, res.output


def test_run_into_a_finished_session_directory_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    scenario = tmp_path / "one.toml"
    scenario.write_text(ONE_CHILD)
    session = tmp_path / "s"
    assert _run_cli(session, scenario)[0] == 0
    before = {p: p.read_bytes() for p in session.rglob("*") if p.is_file()}
    code, output = _run_cli(session, scenario)
    assert code == 2
    assert "session directory in use" in output and "finished run" in output
    assert "fresh directory" in output
    assert {p: p.read_bytes() for p in session.rglob("*") if p.is_file()} == before


def test_run_into_an_unfinished_session_directory_points_at_resume(tmp_path: Path) -> None:
    scenario = tmp_path / "one.toml"
    scenario.write_text(ONE_CHILD)
    session = tmp_path / "s"
    assert _run_cli(session, scenario)[0] == 0
    (session / "result.json").unlink()
    code, output = _run_cli(session, scenario)
    assert code == 2 and f"exarch-actors resume {session}" in output


def test_run_into_an_existing_empty_directory_is_a_fresh_run(tmp_path: Path) -> None:
    scenario = tmp_path / "one.toml"
    scenario.write_text(ONE_CHILD)
    session = tmp_path / "s"
    session.mkdir()
    assert _run_cli(session, scenario)[0] == 0
    assert (session / "result.json").exists()


def test_a_child_cleared_away_while_it_is_built_has_its_shell_stopped_and_nothing_outlives_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forces the interleaving a drill's clear-storm hit (2 drills in 7 of examples/chain.toml):
    ``/clear`` reaps the subtree at once, so a child still being built loses its name after its
    shell started and before the registry took its handles. That shell's actor was never
    stopped: its thread held the drill's exit for more than 5 minutes, and its host, blocked
    reading its pipe, was the drill's stray child (``no-stray-children``)."""
    import pykka

    from exarch_actors.actors.fleet import Fleet
    from exarch_actors.actors.shell import ShellActor

    start_shell = Fleet.start_shell

    def start_then_clear(self: Fleet, name: str, *args: object, **kw: object) -> object:
        parts = start_shell(self, name, *args, **kw)  # type: ignore[arg-type]
        if name == "lo":
            self.registry.clear_subtree("trunk")  # what /clear at the trunk does to lo
        return parts

    monkeypatch.setattr(Fleet, "start_shell", start_then_clear)
    out = _finish_or_fail(tmp_path, ONE_CHILD)
    assert out.outcome == "replied" and out.reply == "done"
    assert any("AgentEnded" in v or "ended" in v for v in _io_values(out.session.root))
    assert pykka.ActorRegistry.get_by_class(ShellActor) == []
    # and the conftest's check: no child process, no non-daemon thread (the actor's) left
