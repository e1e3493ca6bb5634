"""The Registry actor: names, the cascade across both layers, generations, leases, delivery."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from exarch_actors.actors.registry import Registry, RegistryHandle, start_registry
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.constants import TRUNK_NAME
from exarch_actors.runtime.errors import FuelExhausted, InboxFull, NameTaken, UnknownAgent
from exarch_actors.runtime.events import CancelHop, InboxRejected
from exarch_actors.runtime.fleet.inbox import (
    AgentMessage,
    AgentResult,
    ExitSignal,
    Surface,
    UserSteering,
)
from exarch_actors.runtime.fleet.registry import DEADLINE, FleetRegistry
from exarch_actors.runtime.fleet.spawn_tree import AgentEnded
from tests.support.waiting import HANG_GUARD


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dropped() -> list[InboxRejected]:
    return []


@pytest.fixture
def reg(dropped: list[InboxRejected]) -> Iterator[RegistryHandle]:
    handle = start_registry(on_dropped=dropped.append, lease_timer=False)
    try:
        yield handle
    finally:
        handle.stop()


def test_a_duplicate_name_is_refused_with_name_taken_through_the_actor(reg: RegistryHandle) -> None:
    reg.proxy.register(TRUNK_NAME, returns=False, interactive=True).get()
    with pytest.raises(NameTaken, match="name taken"):
        reg.proxy.register(TRUNK_NAME, returns=True).get()
    assert reg.core.names() == [TRUNK_NAME]


def test_unknown_targets_get_a_typed_error_not_a_trace(reg: RegistryHandle) -> None:
    with pytest.raises(UnknownAgent):
        reg.proxy.cancel("nobody").get()
    with pytest.raises(UnknownAgent):
        reg.proxy.message(TRUNK_NAME, "nobody", "hi").get()
    with pytest.raises(UnknownAgent):
        reg.proxy.register("orphan", "no-such-parent", returns=True).get()
    with pytest.raises(UnknownAgent):
        reg.proxy.steer("nobody", "hi").get()


def test_a_message_to_an_agent_that_ended_raises_agent_ended(reg: RegistryHandle) -> None:
    reg.core.register(TRUNK_NAME, returns=True)
    reg.core.register("done-child", TRUNK_NAME, returns=True)
    assert reg.proxy.deregister("done-child").get() is True
    with pytest.raises(AgentEnded, match="agent ended") as exc:
        reg.proxy.message(TRUNK_NAME, "done-child", "are you there?").get()
    assert exc.value.name == "done-child"


def test_cancel_of_an_agent_that_already_ended_is_idempotent(reg: RegistryHandle) -> None:
    reg.core.register(TRUNK_NAME, returns=True)
    entry = reg.core.register("c", TRUNK_NAME, returns=True)
    assert reg.proxy.cancel("c", "agent-cancel").get() == ["c"]
    assert reg.proxy.cancel("c", "again").get() == ["c"]
    assert entry.token.reason == "agent-cancel"  # the first cause is kept
    reg.core.deregister("c")
    assert reg.proxy.cancel("c").get() == []
    assert reg.proxy.deregister("c").get() is False


def _build_three_level_tree(core: FleetRegistry) -> dict[str, tuple[CancelScope, CancelScope]]:
    shape = {
        TRUNK_NAME: None,
        "a": TRUNK_NAME,
        "b": TRUNK_NAME,
        "a1": "a",
        "a2": "a",
        "b1": "b",
        "a1x": "a1",
    }
    handles: dict[str, tuple[CancelScope, CancelScope]] = {}
    for name, parent in shape.items():
        token, root = CancelScope(), CancelScope()
        core.register(
            name,
            parent,
            returns=parent is not None,
            token=token,
            eval_root=None if parent is None else root,
        )
        handles[name] = (token, root)
    return handles


def test_cancelling_a_three_level_tree_trips_every_token_and_eval_root_and_leaves_nothing_running(
    reg: RegistryHandle,
) -> None:
    handles = _build_three_level_tree(reg.core)
    stopped: set[str] = set()

    def node(name: str, token: CancelScope, root: CancelScope) -> None:
        # stands in for an agent whose ral eval is in flight under its eval root
        run = root.child()
        while not (run.wait(0.05) or token.cancelled):
            pass
        stopped.add(name)
        reg.core.deregister(name)

    threads = [
        threading.Thread(target=node, args=(name, token, root), daemon=True)
        for name, (token, root) in handles.items()
        if name != TRUNK_NAME
    ]
    for t in threads:
        t.start()
    cancelled = reg.proxy.cancel(TRUNK_NAME, "close").get(timeout=5)
    assert set(cancelled) == set(handles)
    for name, (token, root) in handles.items():
        assert token.cancelled and token.reason == "close", name
        if name != TRUNK_NAME:
            assert root.cancelled, name
    for t in threads:
        t.join(timeout=HANG_GUARD)
    assert not any(t.is_alive() for t in threads)
    assert stopped == set(handles) - {TRUNK_NAME}
    reg.core.deregister(TRUNK_NAME)
    assert reg.core.wait_empty(timeout=HANG_GUARD) and reg.core.is_empty()


def test_cancel_trips_the_subtree_in_the_callers_thread_while_the_registry_is_busy() -> None:
    gate = threading.Event()
    busy = threading.Event()

    class BusyRegistry(Registry):
        def hold(self) -> None:
            busy.set()
            gate.wait(10)

    ref = BusyRegistry.start(lease_timer=False)
    try:
        proxy = ref.proxy()
        core: FleetRegistry = proxy.core.get()
        handles = _build_three_level_tree(core)
        proxy.hold()
        assert busy.wait(5)
        reply = proxy.cancel("a")  # queued behind hold(), but tripped at put time
        for name in ("a", "a1", "a2", "a1x"):
            assert handles[name][0].cancelled and handles[name][1].cancelled
        assert not handles["b"][0].cancelled and not handles[TRUNK_NAME][0].cancelled
        gate.set()
        assert set(reply.get(timeout=5)) == {"a", "a1", "a2", "a1x"}
    finally:
        gate.set()
        ref.stop(block=True, timeout=5)


def test_a_later_cascade_sends_no_second_hop_to_a_node_already_cancelled() -> None:
    core = FleetRegistry()
    heard: dict[str, list[str]] = {"parent": [], "child": []}
    core.register(TRUNK_NAME, returns=False, interactive=True)
    core.register("parent", TRUNK_NAME, returns=True, on_cancel=heard["parent"].append)
    core.register("child", "parent", returns=True, on_cancel=heard["child"].append)
    assert core.cancel("child", "first") == ["child"]
    assert set(core.cancel("parent", "second")) == {"parent", "child"}
    assert heard == {"parent": ["second"], "child": ["first"]}  # its first cause stands
    assert core.get("child").cancel_cause == "first"
    core.register("late", "parent", returns=True, on_cancel=heard.setdefault("late", []).append)
    assert heard["late"] == ["second"]  # registered under a cancelled parent: the parent's cause


def test_cancel_descendants_spares_the_root_and_keeps_the_generation(reg: RegistryHandle) -> None:
    handles = _build_three_level_tree(reg.core)
    assert set(reg.proxy.cancel_descendants("a", "replied").get()) == {"a1", "a2", "a1x"}
    assert not handles["a"][0].cancelled
    assert reg.core.generation == 0
    assert reg.core.deliver("a", AgentResult("a1", "late but valid", generation=0)) == "delivered"


def test_clear_subtree_drops_a_late_result_from_the_cleared_generation_and_records_it(
    reg: RegistryHandle, dropped: list[InboxRejected]
) -> None:
    handles = _build_three_level_tree(reg.core)
    stamp = reg.core.get("a1").generation
    generation = reg.proxy.clear_subtree("a").get()
    assert generation == 1
    assert handles["a1"][0].cancelled and handles["a1"][1].cancelled
    assert not handles["a"][0].cancelled  # /clear rebuilds the focused agent; it stays
    assert reg.core.live_descendants("a") == []  # reaped
    late = AgentResult("a1", "pre-clear output", generation=stamp)
    assert reg.core.deliver("a", late) == "stale"
    assert reg.core.get("a").inbox.items() == []
    assert [(d.agent, d.reason, d.message["child"]) for d in dropped] == [
        ("a", "stale generation", "a1")
    ]
    batch = Surface(("deferred done batch",), generation=stamp)
    assert reg.core.deliver("a", batch) == "stale"
    fresh = reg.core.register("a3", "a", returns=True)
    assert (
        reg.core.deliver("a", AgentResult("a3", "ok", generation=fresh.generation)) == "delivered"
    )
    assert reg.core.deliver("b", AgentResult("b1", "untouched", generation=0)) == "delivered"


def test_clear_subtree_with_the_root_removes_the_root_too(reg: RegistryHandle) -> None:
    handles = _build_three_level_tree(reg.core)
    reg.proxy.clear_subtree("b", "close", include_root=True).get()
    assert not reg.core.is_live("b") and not reg.core.is_live("b1")
    assert handles["b"][0].reason == "close"


def test_interrupt_stops_one_agents_turn_and_never_trips_a_token(
    reg: RegistryHandle,
) -> None:
    handles = _build_three_level_tree(reg.core)
    hooked: list[str] = []
    reg.core.attach("b", interrupt=hooked.append)
    reg.proxy.interrupt("b", "esc").get()
    assert hooked == ["esc"] and not handles["b"][0].cancelled
    reg.proxy.interrupt("a").get()  # no hook: no turn to stop, and its token stays clear
    assert not any(handles[n][0].cancelled for n in ("a", "a1", "a2", "a1x"))


def test_steer_delivers_to_the_inbox_and_records_the_human_exchange(reg: RegistryHandle) -> None:
    reg.core.register(TRUNK_NAME, returns=False, interactive=True)
    reg.core.register("c", TRUNK_NAME, returns=True)
    reg.proxy.message(TRUNK_NAME, "c", "from a model").get()
    assert not reg.core.engaged("c")  # message is model-facing: no exchange
    reg.proxy.steer("c", "from the human").get()
    assert reg.core.engaged("c")
    assert reg.core.get("c").inbox.items() == [
        AgentMessage(TRUNK_NAME, "from a model"),
        UserSteering("from the human"),
    ]


def test_a_message_to_a_full_inbox_is_rejected_to_the_sender_naming_the_recipient(
    reg: RegistryHandle,
) -> None:
    reg.core.register(TRUNK_NAME, returns=True)
    reg.core.register("busy", TRUNK_NAME, returns=True)
    outcomes, refusals = 0, []
    for i in range(10_000):
        try:
            reg.core.message(TRUNK_NAME, "busy", str(i))
            outcomes += 1
        except InboxFull as e:
            refusals.append(e)
    assert outcomes == 64 and len(refusals) == 10_000 - 64
    assert refusals[0].recipient == "busy" and refusals[0].source == "agent_message"
    with pytest.raises(InboxFull, match="inbox full"):
        reg.proxy.message(TRUNK_NAME, "busy", "through the actor").get()
    queued = reg.core.get("busy").inbox.items()
    assert queued == [AgentMessage(TRUNK_NAME, str(i)) for i in range(64)]


def test_a_spawn_completion_to_a_full_or_ended_parent_is_recorded_not_dropped(
    reg: RegistryHandle, dropped: list[InboxRejected]
) -> None:
    reg.core.register(TRUNK_NAME, returns=True)
    for i in range(64):
        assert reg.core.deliver(TRUNK_NAME, AgentResult(f"c{i}", i)) == "delivered"
    assert reg.core.deliver(TRUNK_NAME, AgentResult("c64", 64)) == "full"
    reg.core.register("p", TRUNK_NAME, returns=True)
    reg.core.deregister("p")
    assert reg.core.deliver("p", AgentResult("orphan", "x")) == "ended"
    assert [(d.reason, d.cap, d.sender) for d in dropped] == [
        ("inbox full", 64, "c64"),
        ("recipient ended", None, "orphan"),
    ]


def test_fuel_runs_out_at_depth_three_through_the_registry(reg: RegistryHandle) -> None:
    reg.proxy.register(TRUNK_NAME, returns=True).get()
    assert reg.proxy.register("d1", TRUNK_NAME, returns=True).get().fuel == 2
    assert reg.proxy.register("d2", "d1", returns=True).get().fuel == 1
    assert reg.proxy.register("d3", "d2", returns=True).get().fuel == 0
    with pytest.raises(FuelExhausted, match="spawn fuel exhausted"):
        reg.proxy.register("d4", "d3", returns=True).get()
    with pytest.raises(FuelExhausted):
        reg.core.child_fuel("d3")
    assert reg.core.get(TRUNK_NAME).fuel == 3


def test_a_cancel_arriving_mid_fork_cancels_the_child_registered_after_it(
    reg: RegistryHandle,
) -> None:
    reg.core.register(TRUNK_NAME, returns=True)
    reg.core.register("parent", TRUNK_NAME, returns=True)
    reg.proxy.cancel("parent", "agent-cancel").get()
    child_root = CancelScope()
    late = reg.core.register("late-child", "parent", returns=True)
    assert late.token.cancelled and late.token.reason == "agent-cancel"
    reg.core.attach("late-child", eval_root=child_root)  # a shell attached after the fact
    assert child_root.cancelled


def test_the_idle_lease_is_renewed_by_steer_and_not_by_message(
    dropped: list[InboxRejected],
) -> None:
    clock = FakeClock()
    core = FleetRegistry(clock=clock, lease_bound=100)
    core.register(TRUNK_NAME, returns=False, interactive=True)
    child = core.register("c", TRUNK_NAME, returns=True)
    grandchild = core.register("g", "c", returns=True)

    clock.now = 90
    report = core.fire_leases()
    assert report.reaped == () and report.next_fire == pytest.approx(10)
    core.steer("c", "still here")  # renews c's clock
    clock.now = 150
    assert core.fire_leases().reaped == ("g",)  # g idle 150 s: reaped; c renewed at 90
    assert grandchild.token.reason == DEADLINE and not child.token.cancelled

    core.message(TRUNK_NAME, "c", "model chatter")  # renews nothing
    core.lease_figures("c")  # a probe renews nothing either
    clock.now = 189
    assert core.fire_leases().next_fire == pytest.approx(1)
    clock.now = 190
    assert core.fire_leases().reaped == ("c",)
    assert child.token.cancelled and child.token.reason == DEADLINE
    assert core.fire_leases().reaped == ()  # spent: fires once


def test_the_lease_reaper_thread_rearms_and_cascades_with_a_deadline_cause() -> None:
    handle = start_registry(lease_bound=0.15)
    try:
        handle.core.register(TRUNK_NAME, returns=False, interactive=True)
        child = handle.core.register("idle-child", TRUNK_NAME, returns=True)
        grandchild = handle.core.register("its-child", "idle-child", returns=True)
        assert child.token.wait(3.0)
        assert child.token.reason == DEADLINE and grandchild.token.cancelled
        assert not handle.core.get(TRUNK_NAME).token.cancelled
        assert handle.core.lease_figures(TRUNK_NAME)["bound_secs"] == 0.15
    finally:
        handle.stop()


def test_the_fleet_is_alive_while_the_registry_is_non_empty(reg: RegistryHandle) -> None:
    assert reg.core.wait_empty(0)
    reg.core.register(TRUNK_NAME, returns=True)
    reg.core.register("c", TRUNK_NAME, returns=True)
    assert not reg.core.wait_empty(0.01)
    reg.core.deregister("c")
    assert not reg.core.wait_empty(0.01)
    threading.Timer(0.02, reg.core.deregister, args=(TRUNK_NAME,)).start()
    assert reg.core.wait_empty(5)
    assert reg.proxy.is_empty().get()


def test_the_last_child_deregistering_wakes_its_parked_parent_at_once(reg: RegistryHandle) -> None:
    from exarch_actors.runtime.fleet.park import ParkMode

    reg.core.register(TRUNK_NAME, returns=True)
    reg.core.register("only-child", TRUNK_NAME, returns=True)
    inbox = reg.core.get(TRUNK_NAME).inbox

    asked = threading.Event()

    def verdict() -> ParkMode:
        held = reg.core.live_descendants(TRUNK_NAME)
        asked.set()
        return ParkMode.HELD_BY_CHILDREN if held else ParkMode.QUIESCE

    result: list[object] = []
    parked = threading.Thread(
        target=lambda: result.append(inbox.next_or_idle(verdict, wake_timeout=30))
    )
    parked.start()
    assert asked.wait(5)  # parked HeldByChildren
    reg.core.deregister("only-child")
    parked.join(timeout=HANG_GUARD)  # well inside the 30 s backstop: the wake ended the park
    assert not parked.is_alive() and result == [None]


class LaterInbox:
    """An inbox in another process as the registry sees it: ``send_push`` sends the item and
    its verdict comes later (here: when the test hands it in)."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.verdicts: list[Callable[[InboxFull], None]] = []

    def send_push(self, msg: object, refused: Callable[[InboxFull], None]) -> None:
        self.sent.append(msg)
        self.verdicts.append(refused)

    def push(self, msg: object) -> None:
        raise AssertionError("a delivery never waits on an inbox in another process")


def test_a_result_for_an_inbox_in_another_process_is_sent_without_waiting_and_a_refusal_is_recorded_when_it_arrives(  # noqa: E501
    reg: RegistryHandle, dropped: list[InboxRejected]
) -> None:
    inbox = LaterInbox()
    reg.core.register("remote", returns=True, inbox=inbox)  # type: ignore[arg-type]
    assert reg.core.deliver("remote", AgentResult("c1", 1)) == "delivered"
    assert reg.core.deliver("remote", AgentResult("c2", 2)) == "delivered"
    assert inbox.sent == [AgentResult("c1", 1), AgentResult("c2", 2)]
    assert dropped == []  # nothing is known to be refused yet
    inbox.verdicts[1](InboxFull("agent_result", 64, recipient="remote"))
    assert [(d.agent, d.reason, d.cap, d.sender) for d in dropped] == [
        ("remote", "inbox full", 64, "c2")
    ]


def test_each_hop_runs_the_ending_hook_before_the_token_and_the_parent_before_the_child() -> None:
    # a token's trip wakes whoever watches it; an in-process agent's shell must already know
    # its agent is ending by then (else it asked its host to unwind instead of being killed);
    # and a cancel travels down the tree: the child's hop comes after its parent's
    core = FleetRegistry()
    order: list[str] = []
    core.register(TRUNK_NAME, returns=False, interactive=True)

    def noting(what: str) -> Callable[[], None]:
        return lambda: order.append(what)

    for name, parent in (("parent", TRUNK_NAME), ("child", "parent")):
        token = CancelScope()
        token.on_cancel(noting(f"token {name}"))
        core.register(name, parent, returns=True, token=token)
        core.attach(name, ending=noting(f"ending {name}"))
    assert set(core.cancel("parent", "stop")) == {"parent", "child"}
    assert order == ["ending parent", "token parent", "ending child", "token child"]


def test_a_cancel_reports_the_whole_subtree_below_a_node_another_cancel_marked_first() -> None:
    # an ending parent's ``cancel_descendants`` can mark a node on its own thread before this
    # cascade's walk reaches it: the walk sends it nothing but still reports what lies below
    core = FleetRegistry()
    heard: dict[str, list[str]] = {}
    core.register(TRUNK_NAME, returns=False, interactive=True)
    for name, parent in (("top", TRUNK_NAME), ("mid", "top"), ("leaf", "mid")):
        core.register(name, parent, returns=True, on_cancel=heard.setdefault(name, []).append)
    assert core.cancel_descendants("top", "first") == ["mid", "leaf"]
    assert core.cancel("top", "second") == ["top", "mid", "leaf"]
    assert heard == {"top": ["second"], "mid": ["first"], "leaf": ["first"]}  # one signal each


def test_a_cancel_hops_parent_to_child_and_reports_its_subtree_ended_after_the_last_end() -> None:
    hops: list[CancelHop] = []
    core = FleetRegistry(on_hop=hops.append)
    core.register(TRUNK_NAME, returns=False, interactive=True)
    core.register("a", TRUNK_NAME, returns=True)
    core.register("a1", "a", returns=True)
    core.register("a1x", "a1", returns=True)
    assert core.cancel("a", "stop") == ["a", "a1", "a1x"]
    assert [(h.phase, h.sender, h.agent) for h in hops] == [
        ("sent", None, "a"),
        ("received", None, "a"),
        ("sent", "a", "a1"),
        ("received", "a", "a1"),
        ("sent", "a1", "a1x"),
        ("received", "a1", "a1x"),
    ]
    # an exit signal waits on each mailbox's control lane for its consumer
    assert core.get("a1x").inbox.signals() == [ExitSignal("a1", "stop")]
    core.deregister("a1x")
    core.deregister("a1")
    assert not any(h.phase == "ended" for h in hops)  # "a" is still registered
    core.deregister("a")
    assert [(h.phase, h.agent, h.cause) for h in hops[6:]] == [("ended", "a", "stop")]
