"""Money in real runs: the fleet yield's dollar figures from a loopback OpenAI-compatible server
that reports cached tokens, and a fleet stopped by ``--budget`` with every child settled."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from exarch_actors.runtime.providers.prices import FREE_DATE
from tests.agent.conftest import Run, exarch, read_records
from tests.support.protocol_servers import Exchange, ProtocolServer, openai_chunks, sse

RUN_GUARD = 120.0
"""Seconds a budget run (three agents, each a process with its shell under ``--agents
process``) may take before it is called hung: a guard, never a latency claim. Five copies on
one core at load 13-30 took 7-26 s each, so at load 100-250 the suite's 60 s was within reach."""


def reply_42(prompt: int, completion: int, cached: int) -> Exchange:
    chunks = openai_chunks("", [("c1", "ral", '{"script": "reply 42"}')], usage=None, done=False)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return Exchange(chunks=[*chunks, sse({"choices": [], "usage": usage}), sse("[DONE]")])


def test_fleet_yield_carries_each_agents_cost_in_dollars_with_cached_tokens_apart(
    tmp_path: Path,
) -> None:
    server = ProtocolServer().start()
    try:
        # the headless trunk replies twice (its first reply is turned back once to verify)
        server.script(reply_42(1000, 100, 400), reply_42(1200, 50, 1000))
        session = tmp_path / "session"
        p = exarch(
            [
                "run",
                "--provider=openai",
                f"--base-url={server.url}/v1",
                "--model=local",
                "--price=local=2,8,0,0.5",
                f"--session-dir={session}",
                "--json",
                "Reply with 42.",
            ],
            cwd=tmp_path,
        )
    finally:
        server.stop()
    assert p.returncode == 0, p.stderr
    cost = json.loads((session / "result.json").read_text())["fleetYield"]["cost"]
    # 600 plain x $2 + 400 cached x $0.5 + 100 out x $8, then 200 x $2 + 1000 x $0.5 + 50 x $8
    # per million tokens: 2200 + 1300 millionths of a dollar
    assert cost["usd"] == "0.003500"
    assert cost["agents"]["trunk"]["usd"] == "0.003500"
    assert cost["agents"]["trunk"]["cacheRead"] == 1400
    assert cost["cacheRead"] == 1400 and cost["unknownAgents"] == 0
    assert json.loads(p.stdout)["fleetYield"]["cost"] == cost


def test_a_scripted_run_costs_a_known_zero_and_says_it_is_free(
    run_scenario: Callable[..., Run],
) -> None:
    # the scripted provider's "model" is the scenario's file name, which no table prices: its
    # cost once showed as `$? (known $0.000000)`; it bills no one, so it is a known $0
    run = run_scenario(
        """
        [fleet]
        prompt = "x"
        [[agents.trunk]]
        usage_tokens = 100
        ral = ["reply 1"]
        [[agents.trunk]]
        ral = ["reply 1"]
        """
    )
    assert run.code == 0, run.stderr
    cost = run.result["fleetYield"]["cost"]
    assert cost["usd"] == "0.000000" and cost["unknownAgents"] == 0
    assert cost["pricesDate"] == FREE_DATE
    assert cost["agents"]["trunk"]["unmeteredRoundTrips"] == 0
    assert cost["agents"]["trunk"]["unpricedModels"] == []


BUDGET = """
    [fleet]
    prompt = "Two helpers, then wait."

    [[agents.trunk]]
    usage_tokens = 1000
    ral = ["agent a 'Work slowly.'", "agent b 'Work slowly.'"]

    [[agents.trunk]]
    usage_tokens = 1000
    text = "waiting"
    stop = "end_turn"

    [[agents.a]]
    usage_tokens = 1000
    ral = ["sleep 30"]

    [[agents.b]]
    usage_tokens = 1000
    ral = ["sleep 30"]
"""


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_GUARD)
@pytest.mark.parametrize("agents", ["thread", "process"])
def test_budget_cancels_the_fleet_settles_every_child_and_exits_1(
    run_scenario: Callable[..., Run], tmp_path: Path, agents: str
) -> None:
    # 1000 tokens at $1000 per million: a dollar a round trip; the third one reaches $3.
    # With agents as processes each agent's round trips are charged across its channel.
    budget = ("--price", "scenario=1000,0", "--budget", "3")
    run = run_scenario(BUDGET, *budget, "--agents", agents, timeout=RUN_GUARD)
    assert run.code == 1, run.stderr
    assert "outcome: budget" in run.stderr
    # round trips already in flight when the budget is reached still count: $3 or a little over
    spent = re.search(r"error: budget reached: spent \$(\S+) of \$3\.000000", run.stderr)
    assert spent is not None, run.stderr
    assert Decimal(spent.group(1)) >= 3
    result = run.result
    assert result["outcome"] == "budget"
    fy = result["fleetYield"]
    assert fy["spawned"] == 2 and fy["neverSettled"] == 0
    assert fy["cost"]["budgetReached"] is True and fy["cost"]["budgetUsd"] == "3.000000"
    assert Decimal(fy["cost"]["usd"]) == Decimal(spent.group(1))
    settled = {
        r["id"]
        for r in read_records(run.session / "spawn-journal.jsonl")
        if r.get("kind") in ("settled", "cancelled")
    }
    assert settled == {"a", "b"}
    check = exarch(["check", str(run.session)], cwd=tmp_path, timeout=RUN_GUARD)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.slow
def test_a_budget_on_a_scripted_run_is_accepted_as_free_with_a_note(
    run_scenario: Callable[..., Run],
) -> None:
    # `--budget 1` on a scenario once said `needs a price for model 'fanout'`
    run = run_scenario(
        '[fleet]\nprompt = "x"\n[[agents.trunk]]\nusage_tokens = 100\n'
        'ral = ["reply 1"]\n[[agents.trunk]]\nral = ["reply 1"]\n',
        "--budget",
        "1",
    )
    assert run.code == 0, run.stderr
    assert "needs a price" not in run.stderr
    assert "note: --budget 1: a scripted run costs nothing ($0)" in run.stderr
    cost = run.result["fleetYield"]["cost"]
    assert (cost["usd"], cost["budgetReached"]) == ("0.000000", False)


def openai_reply(text: str, script: str | None, prompt: int, completion: int) -> Exchange:
    calls = [("c1", "ral", json.dumps({"script": script}))] if script else []
    chunks = openai_chunks(text, calls, usage=(prompt, completion))
    return Exchange(chunks=chunks)


@pytest.mark.slow
def test_a_compaction_summary_is_a_round_trip_whose_cost_is_counted(tmp_path: Path) -> None:
    server = ProtocolServer().start()
    try:
        server.script(
            openai_reply("", "echo hi", 900, 10),  # 910 of a 1000-token window: compaction due
            openai_reply("the summary", None, 1000, 20),  # the summary request
            openai_reply("", "reply 42", 100, 5),
            openai_reply("", "reply 42", 100, 5),  # the headless trunk verifies once
        )
        session = tmp_path / "session"
        p = exarch(
            [
                "run",
                "--provider=openai",
                f"--base-url={server.url}/v1",
                "--model=local",
                "--window-tokens=1000",
                "--price=local=1,1",
                f"--session-dir={session}",
                "Reply with 42.",
            ],
            cwd=tmp_path,
        )
        summary_request = server.requests[1].body["messages"][-1]["content"]
    finally:
        server.stop()
    assert p.returncode == 0, p.stderr
    assert summary_request.startswith("Summarise the conversation")
    trunk = json.loads((session / "result.json").read_text())["fleetYield"]["cost"]["agents"]
    assert trunk["trunk"]["roundTrips"] == 4
    assert trunk["trunk"]["usd"] == "0.002140"  # (910 + 1020 + 105 + 105) tokens at $1/M


@pytest.mark.slow
def test_fleet_stops_at_its_budget_too_and_its_yield_table_shows_the_cost(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(textwrap.dedent(BUDGET))
    session = tmp_path / "session"
    p = exarch(
        [
            "fleet",
            str(scenario),
            "--no-live",
            "--price=scenario=1000,0",
            "--budget=$3",
            f"--session-dir={session}",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 1, p.stderr
    assert "outcome: budget" in p.stderr
    assert "prices of 2025-11" in p.stderr  # the yield table's cost column
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "budget" and result["fleetYield"]["neverSettled"] == 0
