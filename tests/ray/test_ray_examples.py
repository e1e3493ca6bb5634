"""The examples, unchanged, with ``--backend ray`` on a real two-node cluster (``conftest.py``):
agents land on both nodes (``Born``'s node), the fleet finishes, ``check`` holds every
invariant, and no agent host's process is left on any node."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.ray.conftest import ROOT, START_TIMEOUT, Cluster
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def _borns(session: Path) -> list[dict[str, Any]]:
    lines = (session / "transcript.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "Born"]


def _born_of(session: Path, agent: str) -> dict[str, Any] | None:
    """``agent``'s ``Born`` record once the running driver has written it (a line being
    written is not read yet)."""
    try:
        lines = (session / "transcript.jsonl").read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return None
    for line in lines:
        if line.endswith("\n"):
            record = json.loads(line)
            if record.get("kind") == "Born" and record["agent"] == agent:
                return dict(record)
    return None


def _run(cluster: Cluster, example: str, session: Path) -> dict[str, Any]:
    p = cluster.exarch(
        "run",
        str(ROOT / "examples" / example),
        "--backend",
        "ray",
        "--ray-address",
        cluster.address,
        "--session-dir",
        str(session),
    )
    assert p.returncode in (0, 1), p.stderr
    result: dict[str, Any] = json.loads((session / "result.json").read_text())
    return result


def _result(session: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((session / "result.json").read_text())
    return result


def _check(cluster: Cluster, session: Path) -> dict[str, Any]:
    p = cluster.exarch("check", "--json", str(session))
    report: dict[str, Any] = json.loads(p.stdout)
    assert p.returncode == 0 and report["ok"], p.stdout
    return report


def test_fanout_example_lands_its_agents_on_both_nodes_and_replies(
    cluster: Cluster, tmp_path: Path
) -> None:
    nodes = cluster.nodes()
    assert len(nodes) == 2
    session = tmp_path / "fanout"
    result = _run(cluster, "fanout.toml", session)
    assert result["outcome"] == "replied" and result["reply"] == "499500"
    placed = Counter(b["node"] for b in _borns(session))
    assert set(placed) == set(nodes), placed  # every agent on a cluster node, both used
    assert result["fleetYield"]["neverSettled"] == 0
    assert result["fleetYield"]["done"] == 2
    _check(cluster, session)
    assert cluster.agent_processes() == []


def test_chain_example_runs_unchanged_on_the_cluster_and_settles_every_link(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = tmp_path / "chain"
    result = _run(cluster, "chain.toml", session)
    borns = _borns(session)
    assert len(borns) > 2
    assert len({b["node"] for b in borns}) == 2
    assert all(b["node"] != "local" for b in borns)
    assert result["fleetYield"]["neverSettled"] == 0
    assert result["fleetYield"]["spawned"] == len(borns) - 1
    _check(cluster, session)
    assert cluster.agent_processes() == []


def test_crashing_example_contains_each_crash_on_the_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = tmp_path / "crashing"
    result = _run(cluster, "crashing.toml", session)
    fy = result["fleetYield"]
    assert (fy["spawned"], fy["done"], fy["down"], fy["neverSettled"]) == (3, 2, 1, 0)
    assert len({b["node"] for b in _borns(session)}) == 2
    _check(cluster, session)
    assert cluster.agent_processes() == []


def test_fleet_command_runs_the_fanout_on_the_cluster_and_prints_its_yield(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = tmp_path / "fleet"
    p = cluster.exarch(
        "fleet", str(ROOT / "examples" / "fanout.toml"), "--no-live", "--backend", "ray",
        "--ray-address", cluster.address, "--session-dir", str(session),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "499500"
    assert "fleet yield" in p.stderr
    assert _result(session)["fleetYield"]["neverSettled"] == 0
    assert len({b["node"] for b in _borns(session)}) == 2
    assert cluster.agent_processes() == []


KILLED_CHILD = """
[fleet]
prompt = "Start a sleeper and report."

[[agents.trunk]]
ral = ["agent w 'Sleep, then reply.'"]

[[agents.trunk]]
text = "Waiting for w."
stop = "end_turn"

[[agents.trunk]]
ral = ["reply 'w finished'"]

[[agents.w]]
ral = ["sleep 4"]

[[agents.w]]
ral = ["reply 7"]
"""


def test_a_ray_worker_killed_mid_run_is_restarted_and_the_fleet_finishes_settled(
    cluster: Cluster, tmp_path: Path
) -> None:
    scenario = tmp_path / "killed.toml"
    scenario.write_text(KILLED_CHILD)
    session = tmp_path / "killed"
    run = cluster.start_exarch(
        "run", str(scenario), "--backend", "ray", "--ray-address", cluster.address,
        "--session-dir", str(session),
    )  # fmt: skip
    try:
        born = wait_for(lambda: _born_of(session, "w"), START_TIMEOUT, "w's Born")
        os.kill(born["pid"], signal.SIGKILL)  # the Ray worker process its actor runs in
        _, err = run.communicate(timeout=START_TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err
    lines = (session / "transcript.jsonl").read_text().splitlines()
    restarted = [
        r for r in map(json.loads, lines) if r.get("notice") == "Restarted" and r["agent"] == "w"
    ]
    assert len(restarted) == 1 and restarted[0]["data"]["pid"] != born["pid"]
    assert restarted[0]["data"]["node"] in cluster.nodes()
    fy = _result(session)["fleetYield"]
    assert (fy["spawned"], fy["neverSettled"]) == (1, 0)
    _check(cluster, session)
    assert cluster.agent_processes() == []


def test_placement_pack_keeps_every_agent_of_the_chain_on_one_node(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = tmp_path / "packed"
    p = cluster.exarch(
        "run", str(ROOT / "examples" / "chain.toml"), "--backend", "ray",
        "--ray-address", cluster.address, "--placement", "pack", "--session-dir", str(session),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    borns = _borns(session)
    assert len(borns) == 4
    assert len({b["node"] for b in borns}) == 1
    assert borns[0]["node"] in cluster.nodes()
    assert _result(session)["fleetYield"]["neverSettled"] == 0
    assert cluster.agent_processes() == []
