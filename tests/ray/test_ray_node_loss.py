"""A node lost mid-run (its raylet SIGKILLed, and with it every Ray worker on it): the agents
that ran there are restarted on the other node or settled ``down``; the fleet finishes with
every slot settled. A module of its own: the loss spoils the cluster for any later test."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.ray.conftest import START_TIMEOUT, Cluster
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

SLEEPERS = """
[fleet]
prompt = "Start two sleepers and report."

[[agents.trunk]]
ral = ["agent s1 'Sleep, then reply.'", "agent s2 'Sleep, then reply.'"]

[[agents.trunk]]
text = "Waiting for the sleepers."
stop = "end_turn"
repeat = 2

[[agents.trunk]]
ral = ["reply 'sleepers finished'"]

[[agents."s*"]]
ral = ["sleep 6"]

[[agents."s*"]]
ral = ["reply 7"]
"""


def _records(session: Path) -> list[dict[str, Any]]:
    try:
        text = (session / "transcript.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_a_node_lost_mid_run_moves_or_downs_its_agents_and_the_fleet_finishes_settled(
    cluster: Cluster, tmp_path: Path
) -> None:
    scenario = tmp_path / "sleepers.toml"
    scenario.write_text(SLEEPERS)
    session = tmp_path / "lost"
    run = cluster.start_exarch(
        "run", str(scenario), "--backend", "ray", "--ray-address", cluster.address,
        "--session-dir", str(session),
    )  # fmt: skip
    try:
        borns = wait_for(
            lambda: (lambda b: b if {"trunk", "s1", "s2"} <= set(b) else None)(
                {r["agent"]: r for r in _records(session) if r["kind"] == "Born"}
            ),
            START_TIMEOUT,
            "three Borns",
        )
        lost = next(b for b in borns.values() if b["node"] != borns["trunk"]["node"])
        # the host's parents: its launcher's fork server, the launcher, the node's raylet
        raylet = next(p for p in psutil.Process(lost["pid"]).parents() if p.name() == "raylet")
        os.kill(raylet.pid, signal.SIGKILL)  # the node: its workers die with their raylet
        _, err = run.communicate(timeout=START_TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err
    records = _records(session)
    moved = {r["agent"]: r["data"]["node"] for r in records if r.get("notice") == "Restarted"}
    downed = {r["agent"] for r in records if r.get("notice") == "Down"}
    assert lost["agent"] in set(moved) | downed
    if lost["agent"] in moved:  # restarted on the node that is left, not the lost one
        assert moved[lost["agent"]] == borns["trunk"]["node"]
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "replied"
    fy = result["fleetYield"]
    assert (fy["spawned"], fy["neverSettled"]) == (2, 0)
    assert fy["done"] + fy["down"] == 2
    check = cluster.exarch("check", "--json", str(session))
    assert check.returncode == 0 and json.loads(check.stdout)["ok"], check.stdout
    assert cluster.agent_processes() == []
