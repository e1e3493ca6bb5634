"""The inbox rule against a plain model (Hypothesis), plus the cases runtime/fleet/inbox.py
names."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from exarch_actors.runtime.constants import INBOX_SOURCE_CAP, INBOX_TOTAL_CAP
from exarch_actors.runtime.errors import InboxFull
from exarch_actors.runtime.fleet.inbox import (
    AgentMessage,
    AgentResult,
    Command,
    ExitSignal,
    Inbox,
    InboxMsg,
    InboxNudge,
    InboxRule,
    PushEffect,
    ScheduledWakeup,
    Surface,
    UserSteering,
    source_of,
)
from exarch_actors.runtime.fleet.park import ParkMode
from tests.support.waiting import HANG_GUARD, wait_for

SMALL_SOURCE_CAP = 3
SMALL_TOTAL_CAP = 8

texts = st.sampled_from(["a", "b", "/clear", "x\n/y", "go on", "hi\nthere"])
quota_messages = st.one_of(
    st.builds(AgentResult, child=st.sampled_from(["c1", "c2"]), value=st.integers(0, 3)),
    st.builds(AgentMessage, sender=st.sampled_from(["s1", "s2"]), text=texts),
    st.builds(Command, text=st.sampled_from(["/clear", "/resources"])),
    st.builds(Surface, batch=st.tuples(st.integers(0, 2))),
)
idempotent_messages = st.one_of(
    st.builds(UserSteering, text=texts),
    st.builds(
        ScheduledWakeup,
        schedule_id=st.sampled_from(["s1", "s2"]),
        prompt=st.sampled_from(["p", "q"]),
    ),
    st.builds(
        InboxNudge,
        kind=st.sampled_from(["must_reply", "continue"]),
        text=st.sampled_from(["t", "u"]),
    ),
)


def _slash(text: str) -> bool:
    return any(line.startswith("/") for line in text.split("\n"))


class InboxModel(RuleBasedStateMachine):
    """The model is a list and runtime/fleet/inbox.py's sentences, written out apart from the
    rule."""

    def __init__(self) -> None:
        super().__init__()
        self.rule_ = InboxRule(SMALL_SOURCE_CAP, SMALL_TOTAL_CAP, "agent")
        self.model: list[object] = []

    def _count(self, source: str) -> int:
        return sum(1 for m in self.model if source_of(m) == source)

    @rule(msg=quota_messages)
    def push_quota(self, msg: object) -> None:
        source = msg.source  # type: ignore[attr-defined]
        expect_source_full = self._count(source) >= SMALL_SOURCE_CAP
        expect_total_full = not expect_source_full and len(self.model) >= SMALL_TOTAL_CAP
        before = list(self.model)
        try:
            self.rule_.push(msg)
        except InboxFull as e:
            assert expect_source_full or expect_total_full
            assert e.source == source
            assert e.total == expect_total_full
            assert e.cap == (SMALL_TOTAL_CAP if e.total else SMALL_SOURCE_CAP)
            assert e.recipient == "agent"
            assert self.rule_.items() == before  # rejected, never dropped, queue untouched
            return
        assert not (expect_source_full or expect_total_full)
        self.model.append(msg)

    @rule(msg=idempotent_messages)
    def push_idempotent(self, msg: object) -> None:
        self.rule_.push(msg)  # never raises
        if isinstance(msg, ScheduledWakeup):
            for i, m in enumerate(self.model):
                if isinstance(m, ScheduledWakeup) and m.schedule_id == msg.schedule_id:
                    self.model[i] = msg
                    return
        elif isinstance(msg, UserSteering):
            tail = self.model[-1] if self.model else None
            if isinstance(tail, UserSteering) and not _slash(tail.text) and not _slash(msg.text):
                self.model[-1] = UserSteering(tail.text + "\n\n" + msg.text)
                return
        elif isinstance(msg, InboxNudge) and msg in self.model:
            return
        self.model.append(msg)

    @rule()
    def pop(self) -> None:
        got = self.rule_.pop()
        expected = self.model.pop(0) if self.model else None
        assert got == expected

    @rule()
    def drain_steering(self) -> None:
        taken = self.rule_.drain_steering()
        expected: list[object] = []
        kept: list[object] = []
        blocked = False
        for m in self.model:
            if isinstance(m, UserSteering) and not blocked:
                if _slash(m.text):
                    blocked = True
                    kept.append(m)
                else:
                    expected.append(m)
                continue
            kept.append(m)
        self.model = kept
        assert taken == expected

    @invariant()
    def queue_matches_model(self) -> None:
        assert self.rule_.items() == self.model
        depths = self.rule_.depths()
        for source, n in depths.items():
            assert n == self._count(source)
            if source in ("agent_result", "agent_message", "command", "surface"):
                assert n <= SMALL_SOURCE_CAP


TestInboxRuleAgainstModel = pytest.mark.slow(InboxModel.TestCase)
TestInboxRuleAgainstModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)


@given(
    st.lists(st.sampled_from(["agent_result", "agent_message", "command", "surface"]), max_size=400)
)
@settings(max_examples=60, deadline=None)
def test_quota_sources_accept_exactly_up_to_the_caps_in_any_order(sources: list[str]) -> None:
    rule = InboxRule()
    make = {
        "agent_result": lambda i: AgentResult(f"c{i}", i),
        "agent_message": lambda i: AgentMessage("s", str(i)),
        "command": lambda i: Command(f"/c{i}"),
        "surface": lambda i: Surface((i,)),
    }
    accepted: dict[str, int] = {}
    for i, source in enumerate(sources):
        try:
            rule.push(make[source](i))
            accepted[source] = accepted.get(source, 0) + 1
        except InboxFull:
            assert accepted.get(source, 0) == INBOX_SOURCE_CAP or len(rule) == INBOX_TOTAL_CAP
    for source in set(sources):
        assert accepted[source] == min(sources.count(source), INBOX_SOURCE_CAP)


def test_full_inbox_rejects_the_65th_agent_result_and_keeps_the_first_64() -> None:
    rule = InboxRule(recipient="trunk")
    for i in range(64):
        rule.push(AgentResult(f"child-{i}", i))
    with pytest.raises(InboxFull) as exc:
        rule.push(AgentResult("child-64", 64))
    assert exc.value.source == "agent_result" and exc.value.cap == 64 and not exc.value.total
    assert "inbox full" in str(exc.value) and "trunk" in str(exc.value)
    assert [r.child for r in rule.items()] == [f"child-{i}" for i in range(64)]


def test_total_cap_rejects_once_256_messages_are_queued_even_below_every_source_cap() -> None:
    rule = InboxRule()
    for i in range(200):
        rule.push(ScheduledWakeup(f"s{i}", "p"))  # idempotent sources fill the shared total
    for i in range(56):
        rule.push(AgentMessage("s", str(i)))
    with pytest.raises(InboxFull) as exc:
        rule.push(Command("/resources"))
    assert exc.value.total and exc.value.cap == 256 and exc.value.source == "command"
    rule.push(UserSteering("the human is never refused"))
    assert len(rule) == 257


def test_a_flood_of_ten_thousand_messages_accepts_exactly_the_caps_and_rejects_the_rest() -> None:
    inbox = Inbox(recipient="target")
    kinds: list[Callable[[int], InboxMsg]] = [
        lambda i: AgentResult(f"c{i}", i),
        lambda i: AgentMessage(f"s{i}", "hi"),
        lambda i: Command(f"/c{i}"),
        lambda i: Surface((i,)),
    ]
    accepted: list[object] = []
    rejected = 0
    lock = threading.Lock()

    def flood(offset: int) -> None:
        nonlocal rejected
        for i in range(offset, 10_000, 4):
            msg = kinds[i % 4](i)
            try:
                inbox.push(msg)
                with lock:
                    accepted.append(msg)
            except InboxFull as e:
                assert e.recipient == "target"
                with lock:
                    rejected += 1

    threads = [threading.Thread(target=flood, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == 4 * INBOX_SOURCE_CAP == INBOX_TOTAL_CAP
    assert rejected == 10_000 - len(accepted)
    assert inbox.depths()["agent_result"] == 64 and inbox.depths()["surface"] == 64
    assert sorted(map(repr, inbox.items())) == sorted(map(repr, accepted))


def test_a_scheduled_wakeup_replaces_the_queued_one_with_the_same_id_newest_wins() -> None:
    rule = InboxRule()
    rule.push(ScheduledWakeup("tick", "old"))
    rule.push(AgentMessage("a", "between"))
    assert rule.push(ScheduledWakeup("tick", "new")).outcome is PushEffect.REPLACED
    rule.push(ScheduledWakeup("other", "x"))
    assert rule.items() == [
        ScheduledWakeup("tick", "new"),
        AgentMessage("a", "between"),
        ScheduledWakeup("other", "x"),
    ]


def test_consecutive_steering_merges_with_a_blank_line_but_never_across_a_slash_line() -> None:
    rule = InboxRule()
    rule.push(UserSteering("first"))
    assert rule.push(UserSteering("second")).outcome is PushEffect.MERGED
    assert rule.push(UserSteering("/clear")).outcome is PushEffect.QUEUED
    assert rule.push(UserSteering("after")).outcome is PushEffect.QUEUED
    assert rule.items() == [
        UserSteering("first\n\nsecond"),
        UserSteering("/clear"),
        UserSteering("after"),
    ]


def test_steering_does_not_merge_across_an_intervening_message() -> None:
    rule = InboxRule()
    rule.push(UserSteering("one"))
    rule.push(AgentResult("c", 1))
    rule.push(UserSteering("two"))
    assert len(rule) == 3


def test_an_exact_duplicate_nudge_is_a_no_op_but_a_different_one_queues() -> None:
    rule = InboxRule()
    rule.push(InboxNudge("must_reply", "reply"))
    assert rule.push(InboxNudge("must_reply", "reply")).outcome is PushEffect.DUPLICATE
    rule.push(InboxNudge("must_reply", "reply now"))
    assert len(rule) == 2


def test_drain_steering_takes_plain_steering_and_leaves_the_slash_line_for_the_boundary() -> None:
    rule = InboxRule()
    rule.push(UserSteering("look at x"))
    rule.push(AgentResult("c", 1))
    rule.push(UserSteering("/clear"))
    rule.push(UserSteering("then y"))
    assert rule.drain_steering() == [UserSteering("look at x")]
    assert rule.items() == [AgentResult("c", 1), UserSteering("/clear"), UserSteering("then y")]
    assert rule.depths()["user"] == 2


def test_next_or_idle_returns_none_once_the_verdict_is_quiesce() -> None:
    inbox = Inbox()
    assert inbox.next_or_idle(lambda: ParkMode.QUIESCE) is None


def test_next_or_idle_reevaluates_the_verdict_on_every_wake() -> None:
    inbox = Inbox()
    verdict = {"mode": ParkMode.HELD_BY_CHILDREN}
    calls = 0

    def park() -> ParkMode:
        nonlocal calls
        calls += 1
        return verdict["mode"]

    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(inbox.next_or_idle(park, wake_timeout=30)))
    t.start()
    inbox.push(AgentResult("child", "done"))  # a push wakes it with a message
    t.join(timeout=5)
    assert result == [AgentResult("child", "done")]

    t = threading.Thread(target=lambda: result.append(inbox.next_or_idle(park, wake_timeout=30)))
    t.start()
    wait_for(lambda: calls >= 2, what="parked: the verdict read once on entry")
    verdict["mode"] = ParkMode.QUIESCE  # the last child settled...
    inbox.wake()  # ...and its settle wakes the parent, which re-reads the verdict at once
    t.join(timeout=HANG_GUARD)  # well inside the 30 s backstop
    assert not t.is_alive()
    assert result[-1] is None


def test_a_message_that_races_a_quiesce_verdict_is_still_returned() -> None:
    inbox = Inbox()

    def park() -> ParkMode:
        inbox.push(AgentMessage("late", "hello"))
        return ParkMode.QUIESCE

    assert inbox.next_or_idle(park) == AgentMessage("late", "hello")


def test_pop_waits_for_a_push_and_times_out_empty() -> None:
    inbox = Inbox()
    assert inbox.pop(timeout=0.01) is None
    threading.Timer(0.01, lambda: inbox.push(Command("/resources"))).start()
    assert inbox.pop(timeout=5) == Command("/resources")


def test_an_exit_signal_on_a_full_inbox_is_never_refused_and_is_served_before_its_turns() -> None:
    inbox = Inbox(recipient="kid")
    arrived: list[ExitSignal] = []
    inbox.bind_signal(arrived.append)
    for i in range(INBOX_SOURCE_CAP):
        inbox.push(AgentMessage("peer", str(i)))
    with pytest.raises(InboxFull):  # the quota refuses a 65th message...
        inbox.push(AgentMessage("peer", "one too many"))
    sig = ExitSignal("parent", "cancelled")
    inbox.signal(sig)  # ...but never the control lane
    assert arrived == [sig]  # its arrival acted at the put, in the sender's thread
    assert inbox.next_or_idle(lambda: ParkMode.HELD) is sig  # ahead of 64 queued turns
    assert inbox.pop(timeout=0) == AgentMessage("peer", "0")
    assert inbox.try_pop() == AgentMessage("peer", "1")  # a turn; the lane is empty now


def test_a_signal_wakes_a_parked_consumer_at_once() -> None:
    inbox = Inbox()
    got: list[object] = []
    t = threading.Thread(
        target=lambda: got.append(inbox.next_or_idle(lambda: ParkMode.HELD, wake_timeout=30))
    )
    t.start()
    inbox.signal(ExitSignal(None, "close"))
    t.join(timeout=HANG_GUARD)  # well inside the 30 s backstop
    assert not t.is_alive() and got == [ExitSignal(None, "close")]
