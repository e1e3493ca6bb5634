"""``exarch-actors trace``: a session as Chrome trace JSON (docs/observability.md), checked
against the format's rules and against the session's own journal and transcript."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import exarch_actors
from exarch_actors.actors.resume import resume_run
from exarch_actors.runtime.observe.chrome_trace import nest
from exarch_actors.runtime.observe.spans import Span
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.drills.conftest import kill_mid_run
from tests.observe.conftest import FANOUT, exarch, flow_pairs, tracks, valid_chrome_trace


def records(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path).records


@pytest.mark.parametrize("agents", ["thread", "process"])
def test_the_trace_of_fanout_shows_trunk_lo_and_hi_with_their_spawn_and_reply_flows(
    tmp_path: Path, agents: str
) -> None:
    session = tmp_path / "s"
    result = exarch_actors.run(str(FANOUT), session_dir=session, agents=agents)
    assert result.reply == "499500"
    out = tmp_path / "fanout.trace.json"
    done = exarch("trace", str(session), "-o", str(out))
    assert done.returncode == 0, done.stderr
    events = valid_chrome_trace(json.loads(out.read_text()))
    tid = tracks(events)
    assert set(tid) == {"trunk", "trunk/lo", "trunk/hi"}
    trunk, lo, hi = tid["trunk"], tid["trunk/lo"], tid["trunk/hi"]
    assert flow_pairs(events, "spawn") == sorted([(trunk, lo), (trunk, hi)])
    assert flow_pairs(events, "reply") == sorted([(lo, trunk), (hi, trunk)])
    cats = Counter((e["tid"], e["cat"]) for e in events if e["ph"] == "X")
    for child in (lo, hi):
        assert cats[(child, "agent")] == 1 and cats[(child, "ral")] == 1
        assert cats[(child, "model")] == 1 and cats[(child, "turn")] == 1


def test_the_trace_has_one_span_or_flow_per_record_of_the_journal_and_transcript(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "fan.toml"
    scenario.write_text(
        '[fleet]\nprompt = "go"\n\n[[agents.trunk]]\n'
        'ral = [\'for i in (range 12) { agent "k-$i" "reply" }\']\n\n'
        '[[agents.trunk]]\nral = ["let ends = agent-wait; reply (len (keys $ends))"]\n\n'
        '[[agents.trunk]]\nral = ["reply 12"]\n\n'
        '[[agents."k-*"]]\nral = ["let x = boom-not-a-command", "reply 1"]\n'
    )
    session = tmp_path / "s"
    exarch_actors.run(str(scenario), session_dir=session, agents="thread")
    events = valid_chrome_trace(exarch_actors.trace(session))
    journal = records(session / "spawn-journal.jsonl")
    transcript = records(session / "transcript.jsonl")
    spawned = [r for r in journal if r["kind"] == "spawned"]
    settled = [r for r in journal if r["kind"] == "settled"]
    assert len(spawned) == len(settled) == 12
    spans = Counter(e["cat"] for e in events if e["ph"] == "X")
    kinds = Counter(r["kind"] for r in transcript)
    assert len(tracks(events)) == 1 + len(spawned)
    assert spans["agent"] == kinds["Born"]
    assert spans["ral"] == kinds["Io"]
    assert spans["model"] == kinds["ModelCall"]
    assert len(flow_pairs(events, "spawn")) == len(spawned)
    replies = [r for r in settled if r["reason"] == "replied"]
    assert len(flow_pairs(events, "reply")) == len(replies)
    errors = [e for e in events if e["ph"] == "i" and e["cat"] == "error"]
    assert len(errors) == sum(1 for r in transcript if r["kind"] == "Io" and r["error"])


def test_a_resumed_session_is_one_trace_with_both_incarnations_of_the_trunk(
    tmp_path: Path,
) -> None:
    session = kill_mid_run(tmp_path, "--agents", "thread")
    resume_run(SessionDir(session))
    events = valid_chrome_trace(exarch_actors.trace(session))
    tid = tracks(events)
    assert set(tid) == {"trunk", "trunk/quick", "trunk/slow"}
    lives = [e for e in events if e["ph"] == "X" and e["cat"] == "agent"]
    trunk_lives = [e for e in lives if e["tid"] == tid["trunk"]]
    assert len(trunk_lives) == 2
    assert trunk_lives[0]["args"]["cause"] == "control process died"
    resumed = [e for e in events if e["ph"] == "i" and e["cat"] == "resume"]
    assert {e["tid"] for e in resumed} >= {tid["trunk"]}
    assert flow_pairs(events, "reply") == sorted(
        [(tid["trunk/quick"], tid["trunk"]), (tid["trunk/slow"], tid["trunk"])]
    )


def test_nest_clips_a_request_stamped_before_its_turn_into_it() -> None:
    spans = [
        Span("a", "agent", "a", 0.0, 10.0),
        Span("a", "turn", "turn 1", 1.0, 5.0),
        Span("a", "model", "chat m", 0.9995, 2.0),  # a millisecond stamp put it before the turn
        Span("a", "ral", "echo", 1.9, 6.0),  # overlaps the request and outlives the turn
    ]
    placed = {s.kind: (start, end) for s, start, end in nest(spans)}
    assert placed["model"] == (1.0, 2.0)
    assert placed["ral"] == (2.0, 5.0)


@pytest.mark.parametrize("command", ["trace", "report"])
def test_trace_and_report_of_a_directory_that_holds_no_run_exit_2(
    tmp_path: Path, command: str
) -> None:
    done = exarch(command, str(tmp_path), "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and "not a session directory" in done.stderr
    assert not (tmp_path / "out").exists()
