"""Resource requests (runtime/fleet/placement.py) and the node watch's roster diff
(actors/ray_nodes.py): which request each agent gets, what Ray is handed, what fits where, and
which nodes joined or left between two looks."""

from __future__ import annotations

import threading

import pytest

from exarch_actors.actors.ray_nodes import NodeChange, NodeWatch, roster_changes
from exarch_actors.cli.fleet import nodes_line
from exarch_actors.runtime.errors import ScenarioError
from exarch_actors.runtime.fleet.placement import (
    BadResourceRequest,
    PlacementPolicy,
    ResourceRequest,
)
from exarch_actors.runtime.providers.scenario import parse_scenario

SCENARIO = """
[fleet]
prompt = "x"

[[agents.trunk]]
ral = "reply 1"

[placement.trunk]
num_cpus = 0.5

[placement."gpu-*"]
resources = {gpu = 1, "accelerator:A100" = 0.5}

[placement.gpu-0]
num_cpus = 2
"""


def test_an_exact_table_wins_then_the_first_glob_and_unset_parts_come_from_the_flags() -> None:
    tables = parse_scenario(SCENARIO).placement
    policy = PlacementPolicy.of(1.0, ("disk=3",), tables)
    assert policy.for_agent("trunk").bundle() == {"CPU": 0.5, "disk": 3.0}
    assert policy.for_agent("gpu-1").bundle() == {
        "CPU": 1.0,
        "accelerator:A100": 0.5,
        "gpu": 1.0,
    }
    assert policy.for_agent("gpu-0").bundle() == {"CPU": 2.0, "disk": 3.0}  # exact: no glob
    assert policy.for_agent("other").bundle() == {"CPU": 1.0, "disk": 3.0}
    assert PlacementPolicy().for_agent("trunk").empty  # no request: nothing reserved


def test_a_request_fits_a_node_only_if_its_total_holds_every_part() -> None:
    request = ResourceRequest(1.0, (("gpu", 1.0),))
    assert request.fits({"CPU": 2.0, "gpu": 1.0})
    assert not request.fits({"CPU": 2.0})
    assert not request.fits({"CPU": 0.5, "gpu": 4.0})
    assert ResourceRequest().fits({})


def test_bad_amounts_and_names_are_refused_with_where_they_were_written() -> None:
    for text, says in (
        ("[placement.a]\nnum_cpus = -1\n", "placement.a.num_cpus: expected a finite amount"),
        ("[placement.a]\nnum_cpus = 'x'\n", "placement.a.num_cpus: expected a number"),
        ("[placement.a]\nresources = {CPU = 1}\n", "CPU is asked with num_cpus"),
        ("[placement.a]\nresources = 2\n", "placement.a.resources: expected a table"),
    ):
        with pytest.raises(ScenarioError, match=says):
            parse_scenario(text)
    with pytest.raises(BadResourceRequest, match="expected NAME=AMOUNT"):
        PlacementPolicy.of(None, ("gpu",))
    assert (
        "placement.a.colour: unknown key"
        in parse_scenario("[placement.a]\ncolour = 1\n").warnings[0]
    )


def test_the_roster_diff_names_each_node_that_left_then_each_that_joined() -> None:
    before = {"a": "10.0.0.1", "b": "10.0.0.2"}
    after = {"b": "10.0.0.2", "c": "10.0.0.3"}
    assert roster_changes(before, after) == [
        NodeChange("a", "10.0.0.1", "left", 2),
        NodeChange("c", "10.0.0.3", "joined", 2),
    ]
    assert roster_changes(after, after) == []


def test_the_watch_reports_each_change_once_and_the_fleet_view_shows_it() -> None:
    rosters = [{"a": "h1"}, {"a": "h1"}, {"a": "h1", "b": "h2"}, {"b": "h2"}]
    seen: list[NodeChange] = []
    done = threading.Event()

    def alive() -> dict[str, str]:
        if len(rosters) == 1:
            done.set()
            return rosters[0]
        return rosters.pop(0)

    watch = NodeWatch(alive, seen.append, interval=0.01)
    try:
        assert done.wait(10.0)
    finally:
        watch.close()
    assert [(c.node, c.change, c.alive) for c in seen] == [("b", "joined", 2), ("a", "left", 1)]
    line = nodes_line(watch).plain
    assert line.startswith("nodes · 1 alive")
    assert "joined b (h2)" in line and "left a (h1)" in line
