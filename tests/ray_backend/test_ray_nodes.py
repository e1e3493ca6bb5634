"""Nodes that come and go, and placement a user steers, on the two-node cluster: a run whose
worker node is removed mid-run sees it leave (``NodeLeft``), sees a node started in its place
join (``NodeJoined``), and places its next agents there -- one by ``spread`` alone, one by a
custom resource only the new node has. Its trunk stays on the head, and so does an agent that
``spread`` would have put on the new node: a ``[placement]`` request only the head can hold
(Ray's ``node:__internal_head__`` resource) put each there."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.ray_backend.conftest import START_TIMEOUT, Cluster
from tests.ray_backend.test_ray_node_loss import _records
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

REJOIN = """
[fleet]
prompt = "Wait for the cluster to change, then start two helpers."

[placement.trunk]
resources = {{"node:__internal_head__" = 0.001}}

[placement."h-*"]
resources = {{"node:__internal_head__" = 0.001}}

[placement."new-*"]
num_cpus = 1
resources = {{exarch_rejoined = 1}}

[[agents.trunk]]
ral = ["sh -c 'while [ ! -e {go} ]; do sleep 0.2; done'"]

[[agents.trunk]]
ral = ["agent c 'Reply.'"]

[[agents.trunk]]
text = "Waiting for c."
stop = "end_turn"

[[agents.trunk]]
ral = ["agent h-1 'Reply.'"]

[[agents.trunk]]
text = "Waiting for h-1."
stop = "end_turn"

[[agents.trunk]]
ral = ["agent new-1 'Reply.'"]

[[agents.trunk]]
text = "Waiting for new-1."
stop = "end_turn"

[[agents.trunk]]
ral = ["reply placed"]

[[agents.trunk]]
ral = ["reply placed"]

[[agents.c]]
ral = ["reply 1"]

[[agents."h-*"]]
ral = ["reply 2"]

[[agents."new-*"]]
ral = ["reply 3"]
"""


def _notice(session: Path, notice: str, node: str) -> dict[str, Any] | None:
    for r in _records(session):
        if r.get("notice") == notice and r["data"]["node"] == node:
            return r
    return None


def _raylet_of(cluster: Cluster, node: str) -> psutil.Process:
    for proc in cluster.processes():
        if proc.name() == "raylet" and f"--node_id={node}" in proc.cmdline():
            return proc
    raise AssertionError(f"no raylet of node {node}")


def test_a_node_removed_mid_run_leaves_a_new_one_joins_and_takes_the_next_agents(
    cluster: Cluster, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    scenario = tmp_path / "rejoin.toml"
    scenario.write_text(REJOIN.format(go=go))
    session = tmp_path / "rejoin"
    with cluster.ray_run(scenario, session) as run:
        wait_for(
            lambda: run.poll() is not None or any(r["kind"] == "Born" for r in _records(session)),
            START_TIMEOUT,
            "the trunk's Born",
        )
        assert run.poll() is None, run.communicate()  # the driver's output, if it ended first
        trunk = next(r for r in _records(session) if r["kind"] == "Born")
        head = trunk["node"]
        (worker,) = [n for n in cluster.nodes() if n != head]  # the request put it on the head
        os.kill(_raylet_of(cluster, worker).pid, signal.SIGKILL)  # the worker node is lost
        left = wait_for(lambda: _notice(session, "NodeLeft", worker), START_TIMEOUT, "NodeLeft")
        assert left["agent"] == "trunk" and left["data"]["alive"] == 1
        started = cluster.run(
            [
                str(Path(sys.executable).with_name("ray")),
                "start",
                f"--address={cluster.address}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                '--resources={"exarch_rejoined": 1}',
            ],
            env={"EXARCH_NODE_SESSIONS": str(cluster.node_sessions(9))},
        )
        assert started.returncode == 0, started.stdout + started.stderr
        (new,) = [n for n in cluster.nodes() if n != head]
        joined = wait_for(lambda: _notice(session, "NodeJoined", new), START_TIMEOUT, "NodeJoined")
        assert joined["data"]["alive"] == 2
        go.touch()  # the trunk goes on: c, then h-1, then new-1, one after the other
        _, err = run.communicate(timeout=START_TIMEOUT)
    assert run.returncode == 0, err
    borns = {r["agent"]: r["node"] for r in _records(session) if r["kind"] == "Born"}
    # c by spread (the head held the trunk); h-1 where spread would not have put it
    assert borns == {"trunk": head, "c": new, "h-1": head, "new-1": new}, borns
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "replied" and result["fleetYield"]["neverSettled"] == 0
    assert cluster.agent_processes() == []
