"""End-to-end headless runs through the real command, shells and scripted provider."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.agent.conftest import ROOT, Run


@pytest.mark.slow
def test_the_readme_fanout_example_replies_with_the_verified_total(
    run_scenario: Callable[..., Run],
) -> None:
    toml = (ROOT / "examples" / "fanout.toml").read_text()
    run = run_scenario(toml)
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == str(sum(range(1000)))
    result = run.result
    assert result["outcome"] == "replied"
    assert result["fleetYield"]["spawned"] == 2
    assert result["fleetYield"]["done"] == 2
    assert result["fleetYield"]["neverSettled"] == 0
    born = {r["agent"] for r in run.kinds("transcript.jsonl", "Born")}
    died = {r["agent"] for r in run.kinds("transcript.jsonl", "Died")}
    assert born == died == {"trunk", "lo", "hi"}
    for name in ("trunk", "lo", "hi"):
        assert (run.session / "agents" / name / "snapshot.msgpack").is_file()
    work = [r for r in run.kinds("transcript.jsonl", "Io") if "EXARCH_SCRATCH" in r["script"]]
    assert work, "the trunk's first call is recorded on the bus"
    scratch = (run.session / "scratch" / "trunk").resolve()
    assert work[0]["value"].split("\n")[-1].strip() == str(scratch)
    assert sorted(p.name for p in scratch.iterdir()) == ["hi.sum", "lo.sum"]


def test_a_trunk_that_never_replies_is_nudged_to_reply_and_then_quiesces(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "say hi"

        [[agents.trunk]]
        text = "hi"
        """
    )
    assert run.code == 0, run.stderr
    assert run.result["outcome"] == "quiesced"
    nudges = [e for e in run.events("trunk") if e["kind"] == "nudge"]
    assert nudges and nudges[0]["nudge"] == "must_reply"


def test_a_malformed_scenario_exits_2_naming_the_file_position(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "x"
        [[agents.trunk]]
        stop = "sideways"
        """
    )
    assert run.code == 2
    assert "stop" in run.stderr and "scenario.toml" in run.stderr
