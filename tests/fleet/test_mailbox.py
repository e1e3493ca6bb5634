"""The quota mailbox: the inbox rule as every pykka actor's inbox."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
from pykka import messages as pykka_messages
from pykka._envelope import Envelope

from exarch_actors.actors.mailbox import Cancel, Coalesced, Interrupt, QuotaActor, QuotaMailbox
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.errors import InboxFull
from exarch_actors.runtime.fleet.inbox import (
    AgentMessage,
    PushEffect,
    ScheduledWakeup,
    UserSteering,
)


class Worker(QuotaActor):
    """Records what it handles; ``block`` parks the actor thread until released."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.blocked = threading.Event()
        self.handled: list[Any] = []

    def mailbox_recipient(self) -> str:
        return "worker"

    def on_receive(self, message: Any) -> Any:
        if message == "block":
            self.blocked.set()
            self.gate.wait(10)
            return "unblocked"
        self.handled.append(message)
        return len(self.handled)

    def block(self) -> None:
        self.blocked.set()
        self.gate.wait(10)

    def seen(self) -> list[Any]:
        return list(self.handled)


@pytest.fixture
def worker() -> Iterator[tuple[pykka.ActorRef[Worker], Worker]]:
    ref = Worker.start()
    actor = ref._actor_weakref()  # the test reads the gate and the token directly
    assert actor is not None
    try:
        yield ref, actor
    finally:
        actor.gate.set()
        ref.stop(block=True, timeout=5)


def _block_and_fill(ref: pykka.ActorRef[Worker], actor: Worker) -> InboxFull:
    """Park the actor, queue 64 agent messages (the source cap) and return the 65th's refusal."""
    ref.tell("block")
    assert actor.blocked.wait(5)
    for i in range(64):
        ref.tell(AgentMessage("s", str(i)))
    with pytest.raises(InboxFull) as exc:
        ref.tell(AgentMessage("s", "64"))
    return exc.value


def test_a_full_mailbox_rejects_the_65th_tell_to_its_sender_and_handles_the_first_64(
    worker: tuple[pykka.ActorRef[Worker], Worker],
) -> None:
    ref, actor = worker
    refused = _block_and_fill(ref, actor)
    assert refused.source == "agent_message" and refused.recipient == "worker"
    actor.gate.set()
    assert [m.text for m in ref.proxy().seen().get(timeout=5)] == [str(i) for i in range(64)]


def test_a_flood_of_ten_thousand_calls_is_accepted_exactly_to_the_cap_and_rejected_to_each_sender(
    worker: tuple[pykka.ActorRef[Worker], Worker],
) -> None:
    ref, actor = worker
    ref.tell("block")
    assert actor.blocked.wait(5)
    proxy = ref.proxy()
    accepted, rejected = [], 0
    for i in range(10_000):
        try:
            accepted.append(ref.ask(("call", i), block=False))
        except InboxFull as e:
            assert e.source == "command"
            rejected += 1
    assert len(accepted) == 64 and rejected == 10_000 - 64
    with pytest.raises(InboxFull):
        proxy.seen()  # a proxy call is quota-checked like any other call
    actor.gate.set()
    assert [f.get(timeout=5) for f in accepted] == list(range(1, 65))


def test_cancel_jumps_queued_work_and_trips_the_token_the_moment_it_is_put(
    worker: tuple[pykka.ActorRef[Worker], Worker],
) -> None:
    ref, actor = worker
    token = CancelScope()
    actor.cancel_scope = token
    ref.tell("block")
    assert actor.blocked.wait(5)
    for i in range(64):
        ref.tell(AgentMessage("s", str(i)))
    ref.tell(Cancel("agent-cancel"))  # never quota-checked, although the source is full
    assert token.cancelled and token.reason == "agent-cancel"  # before the actor ran anything
    actor.gate.set()
    handled = ref.proxy().seen().get(timeout=5)
    assert [m.text for m in handled] == [str(i) for i in range(64)]  # on_receive never sees Cancel


def test_control_messages_are_served_before_queued_work() -> None:
    box = QuotaMailbox()
    from pykka._envelope import Envelope

    box.put(Envelope(AgentMessage("a", "1")))
    box.put(Envelope(AgentMessage("a", "2")))
    box.put(Envelope(Cancel()))
    assert isinstance(box.get().message, Cancel)
    assert box.get().message == AgentMessage("a", "1")
    assert box.depths()["agent_message"] == 1 and box.depths()["control"] == 0


def test_interrupt_trips_only_the_current_turn_scope(
    worker: tuple[pykka.ActorRef[Worker], Worker],
) -> None:
    ref, actor = worker
    turn = CancelScope()
    actor.interrupt_scope = turn
    ref.tell(Interrupt("esc"))
    assert turn.cancelled and turn.reason == "esc"
    assert not actor.cancel_scope.cancelled


def test_work_queued_before_a_stop_is_served_before_it_and_work_after_it_gets_actor_dead() -> None:
    """pykka's contract: a stop waits its turn behind the work queued before it."""
    ref = Worker.start()
    actor = ref._actor_weakref()
    assert actor is not None
    ref.tell("block")
    assert actor.blocked.wait(5)
    before = [ref.ask(("call", i), block=False) for i in range(5)]
    ref.tell(AgentMessage("s", "told before the stop"))
    stopped = ref.stop(block=False)
    after = ref.ask(("call", "late"), block=False)
    assert not actor.cancel_scope.cancelled  # a stop is no cancel: queued work runs unhindered
    actor.gate.set()
    assert stopped.get(timeout=5) is True
    assert [fut.get(timeout=5) for fut in before] == [1, 2, 3, 4, 5]
    assert actor.handled == [
        *(("call", i) for i in range(5)),
        AgentMessage("s", "told before the stop"),
    ]
    with pytest.raises(pykka.ActorDeadError):
        after.get(timeout=5)


def test_a_stop_is_never_refused_by_a_full_mailbox_and_is_served_after_the_full_backlog(
    worker: tuple[pykka.ActorRef[Worker], Worker],
) -> None:
    ref, actor = worker
    _block_and_fill(ref, actor)
    stopped = ref.stop(block=False)  # the source is full; a stop is still admitted
    actor.gate.set()
    assert stopped.get(timeout=5) is True
    assert [m.text for m in actor.handled] == [str(i) for i in range(64)]


def test_cancel_still_jumps_a_queued_stop_and_the_work_before_it() -> None:
    box = QuotaMailbox()
    from pykka._envelope import Envelope

    box.put(Envelope(AgentMessage("a", "1")))
    box.put(Envelope(pykka_messages._ActorStop()))
    box.put(Envelope(Cancel()))
    assert isinstance(box.get().message, Cancel)
    assert box.get().message == AgentMessage("a", "1")
    assert isinstance(box.get().message, pykka_messages._ActorStop)
    assert box.empty()


def test_tells_queued_behind_a_stop_are_handed_to_on_undelivered() -> None:
    seen: list[Any] = []

    class Recording(Worker):
        def on_undelivered(self, messages: list[Any]) -> None:
            seen.extend(messages)

    ref = Recording.start()
    actor = ref._actor_weakref()
    assert actor is not None
    ref.tell("block")
    assert actor.blocked.wait(5)
    stopped = ref.stop(block=False)
    ref.tell(AgentMessage("s", "late"))
    actor.gate.set()
    stopped.get(timeout=5)
    assert seen == [AgentMessage("s", "late")]


def test_coalescing_sources_are_never_refused_and_an_absorbed_ask_is_answered(
    worker: tuple[pykka.ActorRef[Worker], Worker],
) -> None:
    ref, actor = worker
    ref.tell("block")
    assert actor.blocked.wait(5)
    for _ in range(300):
        ref.tell(ScheduledWakeup("tick", "p"))
    first = ref.ask(UserSteering("a"), block=False)
    second = ref.ask(UserSteering("b"), block=False)
    assert second.get(timeout=1) == Coalesced(PushEffect.MERGED)
    actor.gate.set()
    assert first.get(timeout=5) == 2
    assert ref.proxy().seen().get(timeout=5) == [
        ScheduledWakeup("tick", "p"),
        UserSteering("a\n\nb"),
    ]


def test_an_ask_put_after_the_actor_thread_ended_is_answered_actor_dead_at_once() -> None:
    # pykka checks that the actor is alive, then puts: a sender preempted between the two
    # (an agent process's idle-class thread at its end) puts after the thread's last settle
    before = set(threading.enumerate())
    ref = Worker.start()
    (thread,) = set(threading.enumerate()) - before
    inbox = ref.actor_inbox
    assert ref.ask("work", timeout=5) == 1
    ref.stop(block=True, timeout=5)
    thread.join(5)
    assert not thread.is_alive()
    for message in ("late", pykka_messages._ActorStop()):
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        inbox.put(Envelope(message, reply_to=future))
        with pytest.raises(pykka.ActorDeadError):
            future.get(timeout=5)  # at once: before, nothing ever answered it
