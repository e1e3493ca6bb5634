"""``trace`` of a ``--backend ray`` session (docs/observability.md): the agents ran on the
cluster's nodes, their records reached the driver's session directory and its bus, and the
trace reads them as it reads a local session's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from exarch_actors.runtime.state.durable import read_jsonl
from tests.observe.conftest import flow_pairs, tracks, valid_chrome_trace
from tests.ray_backend.conftest import Cluster
from tests.ray_backend.test_ray_examples import _run

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_trace_of_a_ray_fanout_shows_its_agents_model_calls_and_flows(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = tmp_path / "fanout"
    assert _run(cluster, "fanout.toml", session)["reply"] == "499500"
    out = tmp_path / "t.json"
    traced = cluster.exarch("trace", str(session), "-o", str(out))
    assert traced.returncode == 0, traced.stderr
    events = valid_chrome_trace(json.loads(out.read_text()))
    tid = tracks(events)
    assert set(tid) == {"trunk", "trunk/lo", "trunk/hi"}
    assert flow_pairs(events, "spawn") == sorted(
        [(tid["trunk"], tid["trunk/lo"]), (tid["trunk"], tid["trunk/hi"])]
    )
    transcript = read_jsonl(session / "transcript.jsonl").records
    calls = Counter(r["agent"] for r in transcript if r["kind"] == "ModelCall")
    assert calls == {"trunk": 6, "lo": 1, "hi": 1}  # what the live export reads, from the nodes
    models = Counter(e["tid"] for e in events if e["ph"] == "X" and e["cat"] == "model")
    assert models == {tid["trunk"]: 6, tid["trunk/lo"]: 1, tid["trunk/hi"]: 1}
