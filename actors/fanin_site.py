"""The spawn site's half of fan-in (``agent-wait``, ``agent-result``, held replies): where the
fleet routes each child's end -- to a wait of its parent, or to the parent's inbox -- and where
a parent reads what its full inbox refused. The rules are :mod:`runtime.fleet.fanin`'s.

Invariants:
- A wait holds no thread: :meth:`FanInSite.wait_children` registers it and returns; its answer
  is called by the settlement that completes it (the settling agent's thread, or the fleet's
  pool for an agent process), which for an agent process replies to the deferred request on its
  channel (``actors/agent_process.py``: ``DEFERRED_CALLS``).
- A result delivered to the parent's inbox is sent *under* :class:`FanIn`'s lock, so a wait that
  starts afterwards finds it delivered, and the parent's desk finds it in its inbox (or
  refused) when the wait's answer arrives: the desk takes it out, never delivered twice.
- Every end a wait or a read returns is named on the bus in a ``Collected`` notice
  (``data``: ``children``, ``via``), so ``check`` accounts for a result that reached its parent
  that way (``runtime/drills/invariant_check.py``, ``rejections``).
- Every refusal of a child's result by a full inbox that leaves a reply unread tells the parent,
  with one idempotent wakeup (:func:`runtime.fleet.fanin.held_notice`: at most one queued, its
  count the latest); the quota rule is untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from exarch_actors.runtime.events import InboxRejected, Notice
from exarch_actors.runtime.fleet.fanin import ChildEnd, FanIn, NotAChild, WaitAnswer, held_notice
from exarch_actors.runtime.fleet.registry import FleetRegistry
from exarch_actors.runtime.state.eventlog import reply_of
from exarch_actors.runtime.state.journal import SpawnJournal

log = logging.getLogger(__name__)

Publish = Callable[[Any], None]


class FanInSite:
    """The fleet's fan-in: one per fleet, shared by every parent (thread-safe)."""

    def __init__(self, registry: FleetRegistry, journal: SpawnJournal, publish: Publish) -> None:
        self.state = FanIn()
        self._registry = registry
        self._journal = journal
        self._publish = publish

    # -- the spawn site ------------------------------------------------------------------------

    def spawned(self, parent: str, child: str) -> None:
        self.state.spawned(parent, child)

    def settle(self, parent: str, end: ChildEnd) -> None:
        """A child ended: to a wait of its parent pending on it, else to the parent's inbox
        (a refusal recorded by the registry and reported to :meth:`refused`)."""
        answer = self.state.settle(parent, end, lambda e: self._deliver(parent, e))
        if answer is not None:
            answer()

    def _deliver(self, parent: str, end: ChildEnd) -> None:
        self._registry.deliver(parent, end.to_result(), sender=end.child)

    def refused(self, event: InboxRejected) -> None:
        """A rejection was recorded: a child's result its parent's full inbox refused is held,
        readable, and the parent told (once per turn: the notice coalesces)."""
        message = event.message if isinstance(event.message, dict) else {}
        child = message.get("child")
        if event.reason != "inbox full" or message.get("type") != "AgentResult" or not child:
            return
        if not self.state.held(event.agent, str(child)):
            return
        entry = self._registry.lookup(event.agent)
        if entry is None:
            return
        notice = held_notice(self.state.held_names(event.agent))
        try:
            send = getattr(entry.inbox, "send_push", None)
            if send is None:
                entry.inbox.push(notice)
            else:  # an agent process's: a wakeup is never refused, nobody waits on its verdict
                send(notice, lambda _full: None)
        except Exception:  # the parent ended meanwhile: the replies stay readable all the same
            log.debug("telling %s of held replies failed", event.agent, exc_info=True)

    def parent_ended(self, parent: str) -> None:
        """Waits its shell left pending give back what they collected (to its inbox, which
        records them as undelivered once it is gone)."""
        self.state.abandon(parent, lambda e: self._deliver(parent, e))

    # -- what a parent asks (AgentSite) --------------------------------------------------------

    def wait_children(
        self,
        parent: str,
        wait_id: str,
        names: tuple[str, ...] | None,
        then: Callable[[WaitAnswer], None],
    ) -> WaitAnswer | None:
        """``agent-wait``: the answer now, or None and ``then`` later (no thread held)."""

        def answered(answer: WaitAnswer) -> None:
            self._collected(parent, answer, "agent-wait")
            then(answer)

        answer = self.state.begin_wait(parent, wait_id, names, answered)
        if answer is not None:
            self._collected(parent, answer, "agent-wait")
        return answer

    def stop_wait(self, parent: str, wait_id: str, give_back: bool) -> WaitAnswer | None:
        """End a pending wait: a timeout's partial answer, or (``give_back``: its caller was
        cancelled) what it collected delivered as if no wait had been. None once answered."""
        deliver = (lambda e: self._deliver(parent, e)) if give_back else None
        answer = self.state.stop_wait(parent, wait_id, deliver)
        if answer is not None:
            self._collected(parent, answer, "agent-wait")
        return answer

    def give_back(self, parent: str, ends: tuple[ChildEnd, ...]) -> None:
        """An answer its caller never took (cancelled as it came): delivered to the inbox."""
        self.state.give_back(parent, ends, lambda e: self._deliver(parent, e))

    def read_result(self, parent: str, child: str) -> tuple[dict[str, Any], int]:
        """``agent-result NAME``: the child's end as a ral map (``[outcome: running]`` while it
        runs), and how many replies stay held for the parent. A child settled before this
        control process (``resume``) is read from the spawn journal: its reply typed as it gave
        it (``replyValue``; a journal written before that field holds only the rendered text)."""
        try:
            end = self.state.read(parent, child)
        except NotAChild:
            end = self._from_journal(parent, child)
        held = len(self.state.held_names(parent))
        if end is None:
            return {"outcome": "running"}, held
        self._publish(
            Notice(parent, notice="Collected", data={"children": [child], "via": "agent-result"})
        )
        return end.to_ral(), held

    def _from_journal(self, parent: str, child: str) -> ChildEnd | None:
        node = self._journal.state.nodes.get(child)
        if node is None or node.spawned.get("parent") != parent:
            raise NotAChild("agent-result", parent, child)
        if not node.results:
            return None if node.open else ChildEnd(child, "failed", reason="no result recorded")
        last = node.results[-1]
        return ChildEnd(
            child,
            str(last.get("outcome") or "failed"),
            value=reply_of(last),
            reason=last.get("reason"),
        )

    def _collected(self, parent: str, answer: WaitAnswer, via: str) -> None:
        if answer.ends:
            data = {"children": list(answer.children), "via": via}
            self._publish(Notice(parent, notice="Collected", data=data))
