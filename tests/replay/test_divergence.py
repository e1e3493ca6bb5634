"""The divergence comparison (runtime/replay/divergence.py): the first difference per agent, in
the order result, calls, spawn, end; an unfinished recorded run compared as a prefix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.replay.divergence import (
    AgentFacts,
    Ending,
    RecordedCall,
    SessionFacts,
    agent_calls,
    compare,
    read_facts,
    sections,
)
from exarch_actors.runtime.replay.volatile import Normaliser
from exarch_actors.runtime.state.session_dir import SessionDir


def _call(i: int, content: str, script: str = "echo x", error: bool = False) -> RecordedCall:
    return RecordedCall(i, f"c{i}", "ral", script, content, error)


def _session(*agents: AgentFacts, finished: bool = True, root: str = "/s/then") -> SessionFacts:
    return SessionFacts(root, {a.name: a for a in agents}, tuple(a.name for a in agents), finished)


TRUNK = AgentFacts(
    "trunk",
    (_call(1, "[value]\n1"), _call(2, "[value]\nunit", "agent kid 'go'")),
    ("kid",),
    Ending("replied", "done"),
)
KID = AgentFacts("kid", (_call(1, "[stdout]\n3\n"),), (), Ending("replied", "3"))
THEN = _session(TRUNK, KID)


def test_the_same_facts_have_no_divergence_and_every_call_is_counted() -> None:
    report = compare(THEN, replace(THEN, root="/s/now"))
    assert report.divergences == () and not report.diverged
    assert (report.agents, report.calls) == (2, 3)


def test_a_changed_stdout_is_the_agents_divergence_with_both_sides_and_the_part_named() -> None:
    kid = replace(KID, calls=(_call(1, "[stdout]\n4\n"),), ending=Ending("replied", "4"))
    (d,) = compare(THEN, _session(TRUNK, kid)).divergences
    assert (d.agent, d.kind, d.call, d.call_id, d.parts) == ("kid", "result", 1, "c1", ("stdout",))
    assert (d.then, d.now) == ("[stdout]\n3\n", "[stdout]\n4\n")


def test_only_the_first_divergence_of_an_agent_is_reported() -> None:
    trunk = replace(
        TRUNK,
        calls=(_call(1, "[value]\n2"), _call(2, "[error]\nboom", "agent kid 'go'", True)),
        ending=Ending("failed", None),
    )
    (d,) = compare(THEN, _session(trunk, KID)).divergences
    assert (d.agent, d.call) == ("trunk", 1)


def test_a_different_script_at_the_same_position_is_reported_as_such() -> None:
    kid = replace(KID, calls=(_call(1, "[stdout]\n3\n", "echo 3"),))
    (d,) = compare(THEN, _session(TRUNK, kid)).divergences
    assert d.summary == "call 1 ran another script" and (d.then, d.now) == ("echo x", "echo 3")


def test_more_calls_now_diverge_after_a_finished_run_but_not_after_an_unfinished_one() -> None:
    kid = replace(KID, calls=(*KID.calls, _call(2, "[value]\nunit", "reply 3")))
    (d,) = compare(THEN, _session(TRUNK, kid)).divergences
    assert (d.kind, d.then, d.now, d.call, d.script) == ("calls", "1", "2", 2, "reply 3")
    unfinished = replace(THEN, finished=False)
    report = compare(unfinished, _session(TRUNK, kid))
    assert report.divergences == () and report.notes


def test_fewer_calls_now_diverge_even_after_an_unfinished_run() -> None:
    trunk = replace(TRUNK, calls=TRUNK.calls[:1])
    (d,) = compare(replace(THEN, finished=False), _session(trunk, KID)).divergences
    assert (d.agent, d.kind) == ("trunk", "calls")


def test_a_child_spawned_under_another_name_is_a_spawn_divergence_and_two_agent_ones() -> None:
    kid2 = replace(KID, name="kid2")
    trunk = replace(TRUNK, children=("kid2",))
    found = {(d.agent, d.kind) for d in compare(THEN, _session(trunk, kid2)).divergences}
    assert found == {("trunk", "spawn"), ("kid", "agent"), ("kid2", "agent")}


def test_an_agent_the_unfinished_run_never_reached_is_not_a_divergence() -> None:
    then = _session(replace(TRUNK, children=(), ending=None), finished=False)
    assert compare(then, THEN).divergences == ()


def test_a_different_reply_is_an_end_divergence_when_every_call_matched() -> None:
    kid = replace(KID, ending=Ending("replied", "4"))
    (d,) = compare(THEN, _session(TRUNK, kid)).divergences
    assert (d.kind, d.summary, d.then, d.now) == (
        "end",
        "replied otherwise",
        "replied: 3",
        "replied: 4",
    )


def test_results_that_differ_only_in_their_session_directory_do_not_diverge() -> None:
    then = _session(replace(KID, calls=(_call(1, "[value]\n/s/then/scratch/kid"),)))
    now = _session(replace(KID, calls=(_call(1, "[value]\n/s/now/scratch/kid"),)), root="/s/now")
    assert compare(then, now).diverged
    assert not compare(then, now, Normaliser(roots=("/s/then", "/s/now"))).diverged


facts = st.lists(st.lists(st.text(max_size=8), min_size=1, max_size=4), min_size=1, max_size=4).map(
    lambda agents: _session(
        *(
            AgentFacts(f"a{i}", tuple(_call(j + 1, c) for j, c in enumerate(calls)))
            for i, calls in enumerate(agents)
        )
    )
)


@given(facts, st.data())
def test_changing_one_result_gives_exactly_one_divergence_naming_that_agent_and_call(
    then: SessionFacts, data: st.DataObject
) -> None:
    assert compare(then, then).divergences == ()
    name = data.draw(st.sampled_from(then.order))
    agent = then.agents[name]
    k = data.draw(st.integers(0, len(agent.calls) - 1))
    calls = list(agent.calls)
    calls[k] = replace(calls[k], content=calls[k].content + "!")
    now = replace(then, agents={**then.agents, name: replace(agent, calls=tuple(calls))})
    (d,) = compare(then, now).divergences
    assert (d.agent, d.kind, d.call) == (name, "result", k + 1)


def test_an_event_log_yields_each_result_with_the_call_that_asked_for_it() -> None:
    events: list[dict[str, Any]] = [
        {"kind": "user", "text": "go"},
        {
            "kind": "assistant",
            "message": {
                "tool_calls": [
                    {"id": "a", "name": "ral", "arguments": {"script": "echo 1"}},
                    {"id": "b", "name": "browse", "arguments": {}},
                ]
            },
        },
        {"kind": "tool_result", "message": {"tool_call_id": "a", "content": "[stdout]\n1\n"}},
        {
            "kind": "tool_result",
            "message": {"tool_call_id": "b", "content": "[error]\nunknown", "is_error": True},
        },
    ]
    assert agent_calls(events) == (
        RecordedCall(1, "a", "ral", "echo 1", "[stdout]\n1\n", False),
        RecordedCall(2, "b", "browse", None, "[error]\nunknown", True),
    )


def test_a_digested_result_splits_into_its_sections() -> None:
    assert sections("[value]\n42\n[stdout]\nhi\n\n[stderr]\nwarn") == {
        "value": "42",
        "stdout": "hi\n",
        "stderr": "warn",
    }


def test_children_are_read_in_the_order_their_parent_asked_for_them_not_the_order_born(
    tmp_path: Path,
) -> None:
    # On a Ray cluster each child's node writes its own Born: hi may be born before lo although
    # the trunk asked for lo first (the spawn journal's order). Replayed locally they are born
    # lo, hi: reading Born order made that a spawn divergence in CI.
    def line(**r: Any) -> str:
        return json.dumps(r) + "\n"

    session = SessionDir(tmp_path)
    session.transcript.write_text(
        line(kind="Born", agent="trunk", parent=None)
        + line(kind="Born", agent="hi", parent="trunk")
        + line(kind="Born", agent="lo", parent="trunk")
        + line(kind="Born", agent="orphan", parent="trunk")  # never journalled: still counted
    )
    session.journal.write_text(
        line(kind="spawned", seq=0, id="lo", parent="trunk", prompt="a")
        + line(kind="spawned", seq=1, id="hi", parent="trunk", prompt="b")
    )
    facts = read_facts(session)
    assert facts.agents["trunk"].children == ("lo", "hi", "orphan")
    assert facts.order == ("trunk", "hi", "lo", "orphan")
