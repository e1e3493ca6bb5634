"""The governor's pure rules (``runtime/providers/traffic.py``) and its queue
(``runtime/providers/governor.py``), on an injected clock: no sleeps, no wall-clock bounds."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.providers.governor import Ask, Governor, RateWaitExpired, TrafficVerdict
from exarch_actors.runtime.providers.traffic import (
    Bucket,
    Cost,
    Lane,
    TrafficLimits,
    Window,
    WireLimits,
    parse_duration,
    parse_rate_headers,
)

KEY = ("http://127.0.0.1:1/v1", "m")


def test_openai_reset_durations_parse_to_seconds() -> None:
    assert parse_duration("1s") == 1.0
    assert parse_duration("6m0s") == 360.0
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration("2.5") == 2.5
    assert parse_duration("soon") is None


def test_openai_headers_give_the_request_and_token_windows() -> None:
    wire = parse_rate_headers(
        {
            "X-RateLimit-Limit-Requests": "1200",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "50ms",
            "x-ratelimit-limit-tokens": "90000",
            "retry-after-ms": "250",
        }
    )
    assert (wire.requests.limit, wire.requests.remaining) == (1200.0, 0.0)
    assert wire.requests.reset == pytest.approx(0.05)
    assert wire.tokens.limit == 90000.0
    assert wire.retry_after == 0.25


def test_anthropic_headers_give_input_and_output_windows_and_an_instant_reset() -> None:
    wire = parse_rate_headers(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:10Z",
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "retry-after": "3",
        },
        now_wall=1767225600.0,  # 2026-01-01T00:00:00Z
    )
    assert wire.requests == Window(50.0, 49.0, 10.0)
    assert wire.input_tokens.limit == 40000.0 and wire.output_tokens.limit == 8000.0
    assert wire.retry_after == 3.0


@given(
    rate=st.floats(min_value=0.1, max_value=1000),
    costs=st.lists(st.floats(min_value=0.1, max_value=5000), min_size=1, max_size=50),
)
def test_a_debt_paced_bucket_never_grants_faster_than_its_rate(
    rate: float, costs: list[float]
) -> None:
    """Granting each cost as soon as the bucket is ready, the time taken to grant all but the
    last is at least their total over the rate: the average never exceeds the limit."""
    bucket, now = Bucket(rate), 0.0
    for cost in costs:
        now = bucket.ready_at(now)
        bucket.take(cost, now)
    assert now >= (sum(costs[:-1]) / rate) * (1 - 1e-9)


def test_a_lane_probes_with_one_request_until_a_reply_says_the_limits() -> None:
    lane, cost = Lane(TrafficLimits()), Cost(100, 10)
    assert lane.ready_at(cost, 0.0) == 0.0
    lane.grant(cost, 0.0)
    assert lane.ready_at(cost, 0.0) is None  # the second waits for the first reply
    lane.observe(200, WireLimits(requests=Window(600.0, 9.0, 0.1)), 0.1)
    lane.finish(cost, cost, 0.1)
    assert lane.ready_at(cost, 0.1) == pytest.approx(0.1)  # 10/s: the next a tenth later
    lane.grant(cost, 0.1)
    assert lane.ready_at(cost, 0.1) == pytest.approx(0.2)


def test_a_429_halves_no_more_than_the_decrease_and_holds_for_retry_after() -> None:
    lane, cost = Lane(TrafficLimits(rpm=600)), Cost(1, 1)
    lane.grant(cost, 0.0)
    lane.observe(429, WireLimits(retry_after=2.0), 0.05)
    lane.finish(cost, None, 0.05)
    assert lane.factor == pytest.approx(0.7)
    assert lane.ready_at(cost, 0.05) == pytest.approx(2.05)
    assert lane.figures.throttled == 1


def test_good_replies_bring_the_pace_back_to_the_limit_and_no_further() -> None:
    lane = Lane(TrafficLimits(rpm=600))
    lane.observe(429, WireLimits(), 0.0)
    for i in range(100):
        lane.observe(200, WireLimits(), 1.0 + i)
    assert lane.factor == 1.0


def test_a_lane_with_no_limit_known_is_unpaced_until_its_first_429() -> None:
    lane, cost = Lane(TrafficLimits()), Cost(1, 1)
    lane.observe(200, WireLimits(), 0.0)  # a server that says nothing
    assert lane.unlimited(0.0)
    for i in range(10):
        lane.grant(cost, i * 0.1)
    lane.observe(429, WireLimits(), 1.0)
    assert not lane.unlimited(1.0)
    assert lane.buckets["requests"].rate is not None


def test_usage_below_the_estimate_is_credited_back() -> None:
    lane = Lane(TrafficLimits(input_tpm=60_000))  # 1,000 tokens a second
    estimate = Cost(2000, 10)
    lane.grant(estimate, 0.0)
    assert lane.ready_at(estimate, 0.0) == pytest.approx(2.0)
    lane.finish(estimate, Cost(500, 10), 0.0)
    assert lane.ready_at(estimate, 0.0) == pytest.approx(0.5)


@pytest.mark.slow
def test_the_queue_grants_in_order_of_first_ask_and_a_429_keeps_its_place() -> None:
    gov = Governor(TrafficLimits(rpm=60))  # one a second
    order: list[str] = []
    done = threading.Event()

    def then_for(ticket: str) -> Callable[[TrafficVerdict], None]:
        def then(v: TrafficVerdict) -> None:
            order.append(ticket)
            if len(order) == 3:
                done.set()

        return then

    try:
        gov.submit("a", Ask(KEY, 40), then_for("a"))
        while not order:  # a is granted at once; the next grant is a second later
            threading.Event().wait(0.005)
        gov.submit("b", Ask(KEY, 40), then_for("b"))
        gov.submit("c", Ask(KEY, 40, age=5.0), then_for("c"))  # asked 5 s ago, sent back
        assert done.wait(30.0)
        assert order == ["a", "c", "b"]  # c's first ask was before b's
    finally:
        gov.close()


def test_a_cancelled_waiter_withdraws_and_raises_cancelled() -> None:
    gov = Governor(TrafficLimits(rpm=1))
    cancel = CancelScope()
    try:
        gov.admit(Ask(KEY, 40), cancel)  # the first goes at once
        threading.Timer(0.05, cancel.cancel, args=("stop",)).start()
        with pytest.raises(Cancelled):
            gov.admit(Ask(KEY, 40), cancel)
        assert gov.figures()["lanes"][f"{KEY[0]} {KEY[1]}"]["queued"] == 0
    finally:
        gov.close()


def test_a_wait_past_the_ceiling_fails_with_a_message_naming_it() -> None:
    gov = Governor(TrafficLimits(rpm=1, max_wait=0.05))
    try:
        gov.admit(Ask(KEY, 40), CancelScope())
        with pytest.raises(RateWaitExpired, match=r"--rate-wait 0\.05"):
            gov.admit(Ask(KEY, 40), CancelScope())
    finally:
        gov.close()


def test_an_unlimited_lane_grants_inline_without_a_thread() -> None:
    gov = Governor(TrafficLimits())
    try:
        ticket, _ = gov.admit(Ask(KEY, 40), CancelScope())  # the probe: one in flight
        gov.observe(ticket, 200, WireLimits())
        gov.finish(ticket, Cost(10, 1))
        before = threading.active_count()
        for _ in range(20):
            t, _ = gov.admit(Ask(KEY, 40), CancelScope())
            gov.finish(t, None)
        assert threading.active_count() == before
        assert gov.figures()["waits"] == 1  # only the probe went through the queue
    finally:
        gov.close()


def test_the_request_that_taught_a_limit_is_charged_to_it() -> None:
    """The probe went unpaced; once its reply says 60 a minute, the next waits a second."""
    lane, cost = Lane(TrafficLimits()), Cost(100, 10)
    lane.grant(cost, 0.0)
    lane.observe(200, WireLimits(requests=Window(60.0, 59.0, 1.0)), 0.0, cost)
    lane.finish(cost, cost, 0.0)
    assert lane.ready_at(cost, 0.0) == pytest.approx(1.0)
