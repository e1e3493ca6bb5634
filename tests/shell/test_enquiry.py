"""The enquiry channel: agent verbs answered by a desk on the control side, mid-run."""

from __future__ import annotations

import threading
from typing import Any

from exarch_actors.runtime.ral.errors import DeskRefusal
from exarch_actors.runtime.state.snapshot import MobileSnapshot


class RecordingDesk:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], MobileSnapshot | None]] = []
        self.threads: set[str] = set()

    def verbs(self) -> frozenset[str]:
        return frozenset({"message", "agent", "pin"})

    def call(self, verb: str, args: list[Any], fork: MobileSnapshot | None = None) -> Any:
        self.calls.append((verb, args, fork))
        self.threads.add(threading.current_thread().name)
        if verb == "message" and args[0] == "nobody":
            raise DeskRefusal("unknown agent: no live agent is named 'nobody'")
        if verb == "agent":
            return {"agent": args[0], "status": "started"}
        return f"delivered to {args[0]}"


def test_a_desk_verb_round_trips_through_the_control_side_with_its_values(start_shell) -> None:
    desk = RecordingDesk()
    shell = start_shell(desk=desk).proxy()
    r = shell.run("message bob [n: 3, xs: [1, 2]]").get()
    assert r.error is None and r.value == "delivered to bob"
    verb, args, fork = desk.calls[0]
    assert (verb, args, fork) == ("message", ["bob", {"n": 3, "xs": [1, 2]}], None)


def test_a_desk_refusal_is_a_catchable_ral_error(start_shell) -> None:
    shell = start_shell(desk=RecordingDesk()).proxy()
    r = shell.run("try { message nobody hi } catch e { get $e message }").get()
    assert r.error is None and "unknown agent" in r.value


def test_unadvertised_verbs_are_unbound_names(start_shell) -> None:
    shell = start_shell(desk=RecordingDesk()).proxy()
    r = shell.run("reply 3").get()
    assert r.error is not None and "reply" in r.error


def test_the_fork_verb_carries_the_live_scope_including_this_runs_bindings(start_shell) -> None:
    desk = RecordingDesk()
    shell = start_shell(desk=desk).proxy()
    shell.run("let early = 1; cd /").get()
    r = shell.run("let late = 2; agent kid 'do it'").get()
    assert r.error is None
    _, args, fork = desk.calls[0]
    assert args == ["kid", "do it"]
    assert fork is not None and set(fork.bindings) == {"early", "late"}
    assert fork.context["cwd"] == "/" and fork.ledger == {} and fork.epoch == 0
