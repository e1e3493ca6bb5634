"""The examples, unchanged, with ``--backend ray`` on a real two-node cluster (``conftest.py``):
agents land on both nodes (``Born``'s node), the fleet finishes, ``check`` holds every
invariant, and no agent host's process is left on any node."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.ray.conftest import ROOT, Cluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def _borns(session: Path) -> list[dict[str, Any]]:
    lines = (session / "transcript.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "Born"]


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
