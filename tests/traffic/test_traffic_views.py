"""Where a user sees the governor: ``/resources`` rows and the fleet view's line."""

from __future__ import annotations

from exarch_actors.cli.fleet import traffic_line
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.fleet.probes import ResourceFigures, resource_rows
from exarch_actors.runtime.providers.governor import Ask, Governor
from exarch_actors.runtime.providers.traffic import Cost, TrafficLimits, Window, WireLimits

KEY = ("http://127.0.0.1:1/v1", "gpt-x")


def _governed_once(limits: TrafficLimits) -> Governor:
    gov = Governor(limits)
    ticket, _ = gov.admit(Ask(KEY, 400), CancelScope())
    gov.observe(ticket, 200, WireLimits(requests=Window(1200.0, 9.0, 0.05)))
    gov.finish(ticket, Cost(100, 20))
    return gov


def test_resources_show_each_lanes_limits_with_their_source_and_the_fleets_requests() -> None:
    gov = _governed_once(TrafficLimits(input_tpm=60_000))
    try:
        rows = {r.name: r for r in resource_rows(ResourceFigures(traffic=gov.figures()))}
    finally:
        gov.close()
    assert rows["traffic.gpt-x.requests_per_min"].value == 1200.0
    assert rows["traffic.gpt-x.requests_per_min"].detail.startswith("learned")
    assert rows["traffic.gpt-x.input_per_min"].value == 60_000
    assert rows["traffic.gpt-x.input_per_min"].detail.startswith("set")
    assert rows["traffic.gpt-x.inflight"].value == 0
    assert rows["traffic.requests"].value == 1
    assert rows["traffic.throttled"].value == 0


def test_a_run_without_a_governor_shows_no_traffic_rows() -> None:
    rows = resource_rows(ResourceFigures())
    assert not [r for r in rows if r.name.startswith("traffic")]


def test_the_fleet_view_draws_the_governor_with_its_learned_limit() -> None:
    gov = _governed_once(TrafficLimits())
    try:
        text = traffic_line(gov.figures()).plain
    finally:
        gov.close()
    assert "gpt-x: 1200 requests/min learned" in text
    assert "0 in flight · 0 queued" in text and "0×429" in text
