"""A fleet's grants: ``run --grant-exec/--grant-root`` confine the trunk and every descendant,
a scenario's ``[grants.PATTERN]`` tables narrow the agents they name, and no child is ever
wider than its parent. Real ``exarch-actors run`` subprocesses, real shells, real programs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from exarch_actors.runtime.ral.grants import GrantPolicy, Grants
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.agent.conftest import Live, Run, exarch
from tests.support.waiting import wait_for

PROBE = (
    "concat (try { printf exec-ok } catch e { $e[message] }) ' | '"
    " (try { ls / } catch e { $e[message] }) ' | '"
    " (try { read-text {IN} } catch e { $e[message] }) ' | '"
    " (try { read-text {OUT} } catch e { $e[message] })"
)


def _scenario(tmp_path: Path, grants: str = "") -> str:
    """trunk spawns kid, kid spawns grandkid; each replies with what the probe found."""
    (tmp_path / "R").mkdir(exist_ok=True)
    (tmp_path / "R" / "in.txt").write_text("inside-ok")
    (tmp_path / "out.txt").write_text("outside-secret")
    probe = PROBE.replace("{IN}", str(tmp_path / "R" / "in.txt")).replace(
        "{OUT}", str(tmp_path / "out.txt")
    )

    def agent(name: str, child: str | None) -> str:
        spawn = (
            f"""
            [[agents.{name}]]
            ral = ["agent {child} 'probe'"]

            [[agents.{name}]]
            text = "waiting"
            stop = "end_turn"
            repeat = 2
            """
            if child
            else ""
        )
        return (
            spawn
            + f"""
            [[agents.{name}]]
            ral = ["reply ({probe})"]
            """
        )

    return (
        '[fleet]\nprompt = "probe the grants"\n'
        + agent("trunk", "kid")
        + agent("kid", "grandkid")
        + agent("grandkid", None)
        + grants
    )


def _replies(run: Run) -> dict[str, list[str]]:
    """Each agent's probe: [printf, ls, read inside, read outside] as the agent saw them."""
    out = {"trunk": run.stdout.strip()}
    for r in run.jsonl("spawn-journal.jsonl"):
        if r["kind"] == "execution-result" and r.get("reply") is not None:
            out[r["id"]] = r["reply"]
    return {name: [p.strip() for p in text.split(" | ")] for name, text in out.items()}


@pytest.mark.slow
def test_run_grant_exec_confines_the_trunk_and_every_descendant(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    run = run_scenario(_scenario(tmp_path), "--grant-exec", "printf")
    assert run.code == 0, run.stderr
    replies = _replies(run)
    assert set(replies) == {"trunk", "kid", "grandkid"}
    for name, (printf, ls, inside, outside) in replies.items():
        assert printf == "exec-ok", name
        assert ls == "not granted: exec ls", name
        assert inside == "inside-ok" and outside == "outside-secret", name


@pytest.mark.slow
def test_run_grant_root_confines_the_file_builtins_of_the_trunk_and_every_descendant(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    run = run_scenario(_scenario(tmp_path), "--grant-root", str(tmp_path / "R"))
    assert run.code == 0, run.stderr
    replies = _replies(run)
    assert set(replies) == {"trunk", "kid", "grandkid"}
    for name, (printf, ls, inside, outside) in replies.items():
        assert printf == "exec-ok" and ls != "not granted: exec ls", name
        assert inside == "inside-ok", name
        assert outside.startswith("not granted: read-text") and "secret" not in outside, name


def test_a_scenario_grants_table_narrows_its_agent_and_that_agents_children(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    grants = '\n[grants.kid]\nexec = ["printf"]\nroots = ["R"]\n'
    run = run_scenario(_scenario(tmp_path, grants))
    assert run.code == 0, run.stderr
    replies = _replies(run)
    trunk = replies["trunk"]
    assert trunk[1] != "not granted: exec ls" and trunk[3] == "outside-secret"
    for name in ("kid", "grandkid"):
        printf, ls, inside, outside = replies[name]
        assert printf == "exec-ok" and ls == "not granted: exec ls", name
        assert inside == "inside-ok" and outside.startswith("not granted: read-text"), name


def test_a_scenario_table_never_widens_the_command_line_or_the_parent(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    grants = (
        '\n[grants.kid]\nexec = ["printf", "ls"]\nroots = ["R"]\n'
        '\n[grants.grandkid]\nroots = ["."]\n'  # wider than kid's R: still only R
    )
    run = run_scenario(_scenario(tmp_path, grants), "--grant-exec", "printf")
    assert run.code == 0, run.stderr
    replies = _replies(run)
    for name in ("kid", "grandkid"):
        printf, ls, inside, outside = replies[name]
        assert printf == "exec-ok" and ls == "not granted: exec ls", name
        assert inside == "inside-ok" and outside.startswith("not granted: read-text"), name


def test_a_pattern_table_narrows_every_agent_it_matches(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    run = run_scenario(_scenario(tmp_path, '\n[grants."*kid"]\nexec = []\n'))
    assert run.code == 0, run.stderr
    replies = _replies(run)
    assert replies["trunk"][0] == "exec-ok"
    assert replies["kid"][0] == replies["grandkid"][0] == "not granted: exec printf"


@pytest.mark.slow
def test_the_resolved_grants_are_recorded_in_run_json_for_resume(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    run = run_scenario(
        _scenario(tmp_path, "\n[grants.kid]\nexec = []\n"),
        "--grant-exec",
        "printf",
        "--grant-root",
        str(tmp_path / "R"),
    )
    assert run.code == 0, run.stderr
    grants = json.loads((run.session / "run.json").read_text())["grants"]
    name, path, real = grants["base"]["exec"][0]
    assert real == os.path.realpath(path)
    assert name == "printf" and path.startswith("/") and path.endswith("/printf")
    assert grants["base"]["roots"] == [str((tmp_path / "R").resolve())]
    assert grants["agents"] == [["kid", {"exec": [], "roots": None}]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--grant-exec", "no-such-prog-x9"), "--grant-exec: cannot grant exec no-such-prog-x9"),
        (("--grant-exec", "*"), "there is no wildcard"),
        (("--grant-root", "/no/such/dir"), "--grant-root: cannot grant root /no/such/dir"),
    ],
)
def test_run_refuses_a_grant_it_cannot_make_with_exit_2_before_anything_starts(
    run_scenario: Callable[..., Run], tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    run = run_scenario(_scenario(tmp_path), *args)
    assert run.code == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert not run.session.exists()


def test_a_scenario_grant_of_a_missing_program_exits_2_naming_its_line(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    text = _scenario(tmp_path, '\n[grants.kid]\nexec = ["no-such-prog-x9"]\n')
    line = text.split("\n").index('exec = ["no-such-prog-x9"]') + 1
    run = run_scenario(text)
    assert run.code == 2, run.stderr
    assert f"scenario.toml:{line}: grants.kid.exec: cannot grant exec no-such-prog-x9" in run.stderr
    assert not run.session.exists()


@pytest.mark.slow
def test_a_mistyped_key_in_a_grants_table_is_printed_as_a_warning(
    run_scenario: Callable[..., Run], tmp_path: Path
) -> None:
    run = run_scenario(_scenario(tmp_path, '\n[grants.kid]\nroot = ["R"]\n'))
    assert run.code == 0, run.stderr
    assert "grants.kid.root: unknown key (ignored)" in run.stderr


BRANCH = """
[[agents.trunk]]
ral = ["try { ls / } catch e { $e[message] }"]

[[agents.trunk]]
text = "trunk here"

[[agents."trunk-branch"]]
ral = ["concat (printf exec-ok) ' | ' (try { ls / } catch e { $e[message] })"]

[[agents."trunk-branch"]]
text = "branch here"

[[agents."trunk-branch"]]
ral = ["concat (printf exec-ok) ' | ' (try { ls / } catch e { $e[message] })"]

[[agents."trunk-branch"]]
text = "branch again"
"""


def _io_values(live: Live, agent: str) -> list[str]:
    return [str(r["value"]) for r in live.kinds("Io") if r["agent"] == agent]


def test_a_branch_is_narrowed_by_its_table_and_stays_narrowed_after_clear(
    live_fleet: Callable[..., Live],
) -> None:
    """A branch forks its parent's snapshot; a matching table narrows it, and ``/clear``
    (which reboots its shell from the initial context) must not hand it back full grants."""
    policy = GrantPolicy(
        Grants.granting(exec=["printf", "ls"]),
        (("trunk-branch", Grants.granting(exec=["printf"])),),
    )
    live = live_fleet(BRANCH, grants=policy)
    live.steer("hello")
    live.wait_idle(1)
    assert "not granted" not in _io_values(live, "trunk")[0]
    live.steer("/branch")
    wait_for(lambda: "trunk-branch" in live.fleet.agents, 10, "the branch")
    for turn, note in ((1, "go"), (2, "again")):
        if turn == 2:
            live.steer("/clear", agent="trunk-branch")
        live.steer(note, agent="trunk-branch")
        live.wait_idle(turn, agent="trunk-branch")
        values = _io_values(live, "trunk-branch")
        assert len(values) == turn, values
        value = values[-1]
        assert value.endswith("exec-ok | not granted: exec ls"), (turn, value)


RESUMED = """
[fleet]
prompt = "go"

[grants.late]
exec = []

[[agents.trunk]]
ral = ["agent slow 'x'"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = 2

[[agents.trunk]]
ral = ["reply 'done'"]

[[agents.slow]]
ral = ["sleep 30"]

[[agents.slow]]
ral = ["agent late 'probe'"]

[[agents.slow]]
text = "waiting"
stop = "end_turn"
repeat = 2

[[agents.slow]]
ral = ["reply 'slow done'"]

[[agents.late]]
ral = ["reply (concat (try { printf exec-ok } catch e { $e[message] }))"]
"""


@pytest.mark.slow
def test_a_resumed_run_keeps_the_grants_resolved_when_it_began(tmp_path: Path) -> None:
    """After SIGKILL of the control process, ``resume`` reads the resolved grants from
    run.json: a child first spawned after the resume is still narrowed by its table."""
    from exarch_actors.actors.resume import resume_run

    scenario = tmp_path / "s.toml"
    scenario.write_text(RESUMED)
    session = tmp_path / "session"
    args = ["run", str(scenario), "--session-dir", str(session), "--grant-exec", "printf"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        events = session / "agents" / "slow" / "events.jsonl"
        wait_for(lambda: events.exists() and "sleep 30" in events.read_text(), 30, "slow's sleep")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    out = resume_run(SessionDir(session))
    assert out.outcome == "replied", out
    late = [
        r
        for r in read_jsonl(session / "spawn-journal.jsonl").records
        if r["kind"] == "execution-result" and r["id"] == "late"
    ]
    assert [r["reply"] for r in late] == ["not granted: exec printf"]


@pytest.mark.slow
def test_chat_refuses_a_grant_it_cannot_make_with_exit_2_before_the_screen_opens(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "chat.toml"
    scenario.write_text('[[agents.trunk]]\ntext = "hi"\n')
    p = exarch(
        ["chat", str(scenario), "--grant-exec", "no-such-prog-x9", "--session-dir", "s"],
        cwd=tmp_path,
    )
    assert p.returncode == 2
    assert "--grant-exec: cannot grant exec no-such-prog-x9: not found on PATH" in p.stderr
    assert not (tmp_path / "s").exists()
