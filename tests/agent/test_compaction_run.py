"""Compaction in a running agent: due in the top 15% of a known window, a durable ``compacted``
record first, ``events.jsonl`` never rewritten, and the summary in every later request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from exarch_actors.runtime.fleet.compaction import SUMMARY_PREAMBLE
from exarch_actors.runtime.messages import UserMessage
from tests.agent.conftest import Live, Run
from tests.agent.providers import Recording
from tests.support.waiting import wait_for

SCENARIO = """
[fleet]
prompt = "go"
window_tokens = 1000

[[agents.trunk]]
ral = ["let a = 5"]
usage_tokens = 100

[[agents.trunk]]
ral = ["let b = 6"]
usage_tokens = 860

[[agents.trunk]]
ral = ["reply (add $a $b)"]
usage_tokens = 200

[[agents.trunk]]
ral = ["reply (add $a $b)"]
"""


@pytest.mark.slow
def test_usage_in_the_top_15_percent_of_the_window_appends_a_compacted_record(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(SCENARIO)
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "11", "bindings live in the shell, not in the compacted history"
    kinds = [e["kind"] for e in run.events("trunk")]
    assert kinds.count("compacted") == 1
    # due after the 860-token reply (>= 850) and its results, before the next request
    assert kinds.index("compacted") == 5
    compacted = next(e for e in run.events("trunk") if e["kind"] == "compacted")
    assert compacted["dropped"] == 5 and "First request: go" in compacted["summary"]
    notices = [n for n in run.kinds("transcript.jsonl", "Notice") if n["notice"] == "Compacted"]
    assert len(notices) == 1


@pytest.mark.slow
def test_usage_under_the_threshold_never_compacts(run_scenario: Callable[..., Run]) -> None:
    run = run_scenario(SCENARIO.replace("usage_tokens = 860", "usage_tokens = 840"))
    assert run.code == 0, run.stderr
    assert "compacted" not in [e["kind"] for e in run.events("trunk")]


def test_compaction_never_rewrites_the_event_log_and_later_requests_carry_the_summary(
    live_fleet: Callable[..., Live],
) -> None:
    seen: dict[str, Any] = {}
    live: Live | None = None

    def before_summarize(_: Recording) -> None:
        assert live is not None
        seen["before"] = (live.session / "agents" / "trunk" / "events.jsonl").read_bytes()

    def wrap(p: Any) -> Recording:
        rec = Recording(p, before_summarize=before_summarize)
        seen.setdefault("providers", []).append(rec)
        return rec

    live = live_fleet(SCENARIO, interactive=False, wrap=wrap)
    wait_for(live.fleet.wait_empty, 20, "the run to end")
    live.close()
    after = (live.session / "agents" / "trunk" / "events.jsonl").read_bytes()
    before: bytes = seen["before"]
    assert before and after.startswith(before), "earlier lines are byte-identical"
    appended = after[len(before) :].decode().splitlines()
    assert '"kind": "compacted"' in appended[0], "the durable record is the first thing after"
    rec: Recording = seen["providers"][0]
    assert len(rec.summaries) == 1
    assert len(rec.requests) == 4
    for request in rec.requests[2:]:
        first = request[0]
        assert isinstance(first, UserMessage)
        assert first.text.startswith(SUMMARY_PREAMBLE + rec.summaries[0])
        assert not any(isinstance(m, UserMessage) and m.text == "go" for m in request)
    assert isinstance(rec.requests[1][0], UserMessage) and rec.requests[1][0].text == "go"
    assert live.trunk.log.event_count == len(appended), "the mirror is summary + suffix only"
