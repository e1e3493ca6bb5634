"""``/clear`` and ``/resources`` at the turn boundary of a running agent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exarch_actors.runtime.messages import UserMessage
from tests.agent.conftest import Live, read_records
from tests.agent.providers import Recording
from tests.support.waiting import wait_for

CLEAR = """
[fleet]
prompt = "go"

[[agents.trunk]]
ral = [
  "let keep = 41",
  "agent kid 'wait for a long time'",
  "schedule tick 60 'wake up'",
  "pin goal 'g'",
]

[[agents.trunk]]
text = "set up"

[[agents.trunk]]
ral = ["echo $keep"]

[[agents.trunk]]
text = "after clear"

[[agents.kid]]
ral = ["sleep 30"]
"""


def test_clear_gives_a_fresh_shell_log_and_schedule_and_nothing_from_before_comes_back(
    live_fleet: Callable[..., Live],
) -> None:
    providers: list[Recording] = []

    def wrap(p: Any) -> Recording:
        providers.append(Recording(p))
        return providers[-1]

    live = live_fleet(CLEAR, wrap=wrap)
    live.wait_idle(1)
    trunk = live.trunk
    assert trunk.schedules.armed() and trunk.pins
    assert live.fleet.registry.live_descendants("trunk") == ["kid"]
    live.steer("/clear")
    live.wait_idle(2)
    live.steer("again")
    live.wait_idle(3)

    agent_dir = live.session / "agents" / "trunk"
    archived = read_records(agent_dir / "events.1.jsonl")
    assert any(e["kind"] == "user" and e["text"] == "go" for e in archived), "old log archived"
    fresh = live.events()
    assert fresh[0]["kind"] == "cleared" and fresh[0]["archived"] == "events.1.jsonl"
    assert [e["kind"] for e in fresh[1:]] == ["user", "assistant", "tool_result", "assistant"]
    assert "undefined variable keep" in fresh[3]["message"]["content"], "a fresh shell"
    assert not trunk.schedules.armed() and not trunk.pins
    wait_for(lambda: not live.fleet.registry.live_descendants("trunk"), what="kid reaped")
    request = providers[0].requests[-2]  # the first request after the clear
    assert [m.text for m in request if isinstance(m, UserMessage)] == ["again"]
    assert "pinned_reminder" not in [e.get("nudge") for e in fresh]
    live.close()
    died = {d["agent"]: d["outcome"] for d in live.kinds("Died")}
    assert died["kid"] == "cancelled"
    notices = [n for n in live.kinds("Notice") if n["notice"] == "Cleared"]
    assert len(notices) == 1


RESOURCES = """
[fleet]
prompt = "go"

[[agents.trunk]]
ral = ["let x = 1", "1", "2"]

[[agents.trunk]]
text = "ok"

[[agents.trunk]]
ral = ["3"]

[[agents.trunk]]
text = "ok again"
"""


def _rows(event: dict[str, Any]) -> dict[str, Any]:
    """The rows, less the disk walk (the transcript grows by the probe's own record)."""
    return {name: value for name, value in event["rows"] if not name.startswith("disk.")}


def test_resources_emits_one_event_with_rows_and_a_card_and_renews_nothing(
    live_fleet: Callable[..., Live],
) -> None:
    providers: list[Recording] = []

    def wrap(p: Any) -> Recording:
        providers.append(Recording(p))
        return providers[-1]

    live = live_fleet(RESOURCES, wrap=wrap)
    live.wait_idle(1)
    events_before = live.events()
    live.steer("/resources")
    live.wait_idle(2)
    live.steer("/resources")
    live.wait_idle(3)
    live.steer("continue")
    live.wait_idle(4)
    live.steer("/resources")
    live.wait_idle(5)

    probes = wait_for(lambda: len(live.kinds("Resources")) == 3 and live.kinds("Resources"))
    first, second, third = (_rows(p) for p in probes)
    assert all(p["agent"] == "trunk" for p in probes)
    assert "bindings.nearest_expiry_calls" in first and "inbox.total" in first
    assert "resources of trunk" in probes[0]["card"]
    assert "eventlog.events" in probes[0]["card"]
    assert first == second, "probing twice changes nothing it reads"
    expiry = first["bindings.nearest_expiry_calls"]
    assert isinstance(expiry, int)
    assert third["bindings.nearest_expiry_calls"] == expiry - 1, "the lease was not renewed"
    assert live.events()[: len(events_before)] == events_before
    assert all(e["kind"] != "user" or e["text"] != "/resources" for e in live.events())
    seen = " ".join(m.text for r in providers[0].requests for m in r if isinstance(m, UserMessage))
    assert "resources" not in seen, "never model-facing"
