"""The per-call path of the process backend: what crosses the channel for each ral call.

Real agent processes from the fork server, a real scripted fleet; each test counts what the
control side was asked (``ProcessAgent.site_calls``) and reads what reached the fleet (its
spend, its transcript).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.runtime.providers.prices import Price, PriceTable
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.busy import busy_in_its_call
from tests.support.waiting import wait_for

CALLS = 6
"""Ral calls each worker makes before its reply (each one a priced round trip)."""

ONE_DOLLAR = PriceTable().with_prices(
    {"<scenario>": Price(Decimal(1000), Decimal(0), Decimal(0), Decimal(0))}
)
"""1000 input tokens at $1000 per million: a dollar a round trip."""


def _scenario(workers: int) -> str:
    spawns = "; ".join(f"agent w{i} 'work'" for i in range(workers))
    return f"""
[fleet]
prompt = "start"

[[agents.trunk]]
ral = ["{spawns}"]

[[agents.trunk]]
text = "started"
stop = "end_turn"
repeat = 20

[[agents."w*"]]
usage_tokens = 1000
ral = ["let v = add 1 2"]
repeat = {CALLS}

[[agents."w*"]]
usage_tokens = 1000
ral = ["reply $v"]
"""


@pytest.fixture
def fleet_of(tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []

    def start(workers: int, **config: Any) -> Fleet:
        playback = ScenarioPlayback(parse_scenario(_scenario(workers)))
        fleet = Fleet(
            SessionDir.at(tmp_path / f"session{len(fleets)}"),
            playback.provider,
            FleetConfig(agents="process", prices=ONE_DOLLAR, **config),
        )
        fleets.append(fleet)
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        wait_for(  # born in any order: a batch of agent verbs boots them side by side
            lambda: all(f"w{i}" in fleet.hosted for i in range(workers)), 60, "every worker born"
        )
        agents = [fleet.hosted[f"w{i}"] for i in range(workers)]
        wait_for(lambda: all(a.done.is_set() for a in agents), 120, "every worker settled")
        return fleet

    yield start
    for fleet in fleets:
        fleet.close()


def _workers(fleet: Fleet, n: int) -> list[ProcessAgent]:
    agents = [fleet.hosted[f"w{i}"] for i in range(n)]
    assert all(isinstance(a, ProcessAgent) for a in agents)
    return agents  # type: ignore[return-value]


@pytest.mark.slow
def test_without_a_budget_every_round_trip_reaches_the_fleets_spend_and_none_waits_for_it(
    fleet_of: Callable[..., Fleet],
) -> None:
    fleet = fleet_of(3)
    workers = _workers(fleet, 3)
    assert all(a.outcome is not None and a.outcome.value == "replied" for a in workers)
    # every worker's round trips (CALLS + its reply) are in the fleet's spend, a dollar each
    trips = sum(a.stats.spend.read().round_trips for a in workers)
    assert trips == 3 * (CALLS + 1)
    # a batch reaches the fleet before the end that followed it: nothing is still in flight
    # (the trunk's round trips carry no usage: their cost is unknown, not in ``known``)
    assert fleet.spend.known == Decimal(3 * (CALLS + 1))
    # ... carried in the event batches: not one of them was a request the agent waited on
    assert [a.site_calls["charge"] for a in workers] == [0, 0, 0]


def test_a_returning_childs_reply_ends_it_without_asking_the_registry_what_still_runs(
    fleet_of: Callable[..., Fleet],
) -> None:
    fleet = fleet_of(2)
    workers = _workers(fleet, 2)
    assert all(a.outcome is not None and a.outcome.value == "replied" for a in workers)
    # the reply is honoured whatever runs (runtime.fleet.nudge.waiting_matters): no park read
    assert [a.site_calls["park_reads"] for a in workers] == [0, 0]


def test_every_agent_processs_channel_is_read_by_the_fleets_one_hub_thread(
    fleet_of: Callable[..., Fleet],
) -> None:
    fleet = fleet_of(3)
    assert isinstance(fleet.hosted["trunk"], ProcessAgent)  # live: its channel still read
    names = [t.name for t in threading.enumerate()]
    assert names.count("channel-hub") == 1
    assert not [n for n in names if n.startswith("channel-agent process")]


def test_with_a_budget_each_round_trip_waits_for_the_fleets_answer(
    fleet_of: Callable[..., Fleet],
) -> None:
    fleet = fleet_of(2, budget=Decimal(1000))  # never reached: only the path changes
    workers = _workers(fleet, 2)
    assert [a.site_calls["charge"] for a in workers] == [CALLS + 1, CALLS + 1]
    assert fleet.spend.known == Decimal(2 * (CALLS + 1))
    assert not fleet.spend.reached


def test_a_process_agents_io_events_reach_the_transcript_in_the_order_it_made_its_calls(
    fleet_of: Callable[..., Fleet],
) -> None:
    fleet = fleet_of(2)
    fleet.bus.flush()
    records = read_jsonl(fleet.session.transcript).records
    for name in ("w0", "w1"):
        scripts = [r["script"] for r in records if r["kind"] == "Io" and r["agent"] == name]
        assert scripts == ["let v = add 1 2"] * CALLS + ["reply $v"]
        ios = [i for i, r in enumerate(records) if r["kind"] == "Io" and r["agent"] == name]
        died = [i for i, r in enumerate(records) if r["kind"] == "Died" and r["agent"] == name]
        assert died and max(ios) < died[0], "every call of an agent is on the bus before its end"


def _sleepers(n: int) -> str:
    spawns = "; ".join(f"agent s{i} 'sleep'" for i in range(n))
    return f"""
[fleet]
prompt = "start"

[[agents.trunk]]
ral = ["{spawns}"]

[[agents.trunk]]
text = "started"
stop = "end_turn"
repeat = 20

[[agents."s*"]]
ral = ["sleep 60; reply 1"]
"""


def test_a_process_agent_reads_its_own_standing_without_asking_and_ends_with_the_first_cause(
    tmp_path: Path,
) -> None:
    playback = ScenarioPlayback(parse_scenario(_sleepers(2)))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        wait_for(
            lambda: busy_in_its_call(fleet, "s0") and busy_in_its_call(fleet, "s1"),
            60,
            "both busy sleeping",
        )
        fleet.registry.cancel("s0", "first")
        fleet.cancel_all("second")  # reaches s0 again: the registry keeps its first cause
        agents = [fleet.hosted["s0"], fleet.hosted["s1"]]
        wait_for(lambda: all(a.done.is_set() for a in agents), 60, "both settled")
        assert all(isinstance(a, ProcessAgent) for a in agents)
        assert [a.outcome.value for a in agents if a.outcome] == ["cancelled", "cancelled"]
        assert [a.terminated for a in agents] == ["first", "second"]
        # the drive loops read their standing at every turn and park: never across the channel
        assert [a.site_calls["standing"] for a in agents] == [0, 0]  # type: ignore[union-attr]
        fleet.bus.flush()
        died = {
            r["agent"]: r["cause"]
            for r in read_jsonl(fleet.session.transcript).records
            if r["kind"] == "Died"
        }
        assert died["s0"] == "first" and died["s1"] == "second"
    finally:
        fleet.close()


def _waiting(workers_text: str) -> str:
    return f"""
[fleet]
prompt = "start"

[[agents.trunk]]
ral = ["agent w0 'work'"]

[[agents.trunk]]
text = "started"
stop = "end_turn"
repeat = 20

{workers_text}
"""


def _ios(fleet: Fleet, name: str) -> list[dict[str, Any]]:
    fleet.bus.flush()
    records = read_jsonl(fleet.session.transcript).records
    return [r for r in records if r["kind"] == "Io" and r["agent"] == name]


def _waiting_fleet(tmp_path: Path, workers_text: str) -> Fleet:
    playback = ScenarioPlayback(parse_scenario(_waiting(workers_text)))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    fleet.start_trunk(playback.scenario.prompt, interactive=True)
    return fleet


def test_a_calls_io_reaches_the_transcript_while_its_agent_waits_for_its_next_round_trip(
    tmp_path: Path,
) -> None:
    # the drive thread sends its own batches: one left behind before a provider round trip of
    # unknown length (a minute here) would stay until the round trip ended
    fleet = _waiting_fleet(
        tmp_path,
        """
[[agents."w*"]]
ral = ["let v = add 1 2"]

[[agents."w*"]]
ral = ["reply $v"]
delay_ms = 60000
""",
    )
    try:
        wait_for(lambda: fleet.hosted.get("w0"), 60, "the worker spawned")
        worker = fleet.hosted["w0"]
        wait_for(lambda: _ios(fleet, "w0"), 60, "the first call's Io on the bus")
        assert [r["script"] for r in _ios(fleet, "w0")] == ["let v = add 1 2"]
        assert not worker.done.is_set(), "the worker is still in its minute-long round trip"
    finally:
        fleet.close()


def test_a_refused_calls_io_reaches_the_transcript_while_the_next_call_of_its_batch_runs(
    tmp_path: Path,
) -> None:
    # one reply, two tool calls: the first refused (no such tool), the second a minute of
    # ``sleep``; the refusal's Io must not wait behind the run
    fleet = _waiting_fleet(
        tmp_path,
        """
[[agents."w*"]]
calls = [
    { name = "browse", arguments = { url = "x" } },
    { name = "ral", arguments = { script = "sleep 60" } },
]
""",
    )
    try:
        wait_for(lambda: fleet.hosted.get("w0"), 60, "the worker spawned")
        worker = fleet.hosted["w0"]
        wait_for(lambda: _ios(fleet, "w0"), 60, "the refused call's Io on the bus")
        (io,) = _ios(fleet, "w0")
        assert io["error"] == "error" and "unknown tool 'browse'" in io["value"]
        assert not worker.done.is_set(), "the worker's sleep is still running"
    finally:
        fleet.close()
