"""The traffic governor across the agent channel: an agent process's gate and its control side.

The run's one :class:`~runtime.providers.governor.Governor` lives in the control process. An
agent process (local, or a Ray host on any node) installs a :class:`RemoteGate` on its channel
when it starts; the provider it was booted with holds the governor, which unpickles as that
installed gate (``runtime/providers/governor.py``). So every request of the fleet waits in the
same queue, and one budget holds across processes and nodes.

Invariants:

- **The control side never blocks its reader or its pool on a wait.** ``traffic_admit`` is a
  request answered when the governor grants it: the governor calls back from its own thread
  (or inline, when nothing paces the lane), and the answer is one :class:`ReturnFrame`. A
  thousand waiting agents hold no thread of the fleet.
- **What needs no answer gets none.** A withdrawal, a reply's headers and a request's end are
  notifications (a :class:`Call` without a request id), acted on on the reader at once.
- **A control side that is gone lets the request go.** An end of file answers the admit as
  granted: the run is ending, the request fails or is cancelled on its own, and no agent waits
  for a governor that is no more.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from exarch_actors.actors.channel import AgentChannel
from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.fleet.agent_channel import Call, ChannelMessage, ReturnFrame
from exarch_actors.runtime.providers.governor import (
    Ask,
    Governor,
    TrafficVerdict,
    new_ticket_id,
    wait_for_grant,
)
from exarch_actors.runtime.providers.traffic import Cost, WireLimits

ADMIT = "traffic_admit"
NOTICES = frozenset({"traffic_withdraw", "traffic_observe", "traffic_finish"})

ADMIT_TIMEOUT = 24 * 3600.0
"""The channel's timeout of an admit: the governor's own ceiling (``--rate-wait``) ends a wait
long before this; the channel must never expire one first."""


class RemoteGate:
    """An agent process's gate: the governor's :class:`Gate` over its channel."""

    def __init__(self, channel: AgentChannel) -> None:
        self._channel = channel

    def admit(
        self,
        ask: Ask,
        cancel: CancelScope,
        on_wait: Callable[[bool, float], None] | None = None,
    ) -> tuple[str, float]:
        ticket = new_ticket_id()
        args = (ticket, ask)

        def submit(then: Callable[[TrafficVerdict], None]) -> None:
            def answered(reply: ChannelMessage | None, error: BaseException | None) -> None:
                if error is None and isinstance(reply, ReturnFrame) and reply.payload:
                    then(pickle.loads(reply.payload))
                else:  # the control side is gone, or refused: let the request go
                    then(TrafficVerdict(True))

            try:
                self._channel.begin(
                    Call(ADMIT, pickle.dumps(args)), timeout=ADMIT_TIMEOUT, then=answered
                )
            except Exception:
                then(TrafficVerdict(True))

        seconds = wait_for_grant(
            submit, lambda: self._notice("traffic_withdraw", ticket), cancel, on_wait
        )
        return ticket, seconds

    def observe(self, ticket: str, status: int, wire: WireLimits) -> None:
        self._notice("traffic_observe", ticket, status, wire)

    def finish(self, ticket: str, usage: Cost | None) -> None:
        self._notice("traffic_finish", ticket, usage)

    def _notice(self, method: str, *args: Any) -> None:
        self._channel.try_send(Call(method, pickle.dumps(args)))


def serve_admit(governor: Governor | None, channel: AgentChannel, rid: int, payload: bytes) -> None:
    """The control side of ``traffic_admit``, on the channel's reader: queued, and answered
    when granted. A run without a governor grants at once."""

    def answer(verdict: TrafficVerdict) -> None:
        channel.reply(rid, ReturnFrame(pickle.dumps(verdict)))

    if governor is None:
        answer(TrafficVerdict(True))
        return
    ticket, ask = pickle.loads(payload)
    governor.submit(ticket, ask, answer)


def serve_notice(governor: Governor | None, method: str, payload: bytes) -> None:
    """A withdrawal, a reply's headers, or a request's end: acted on at once."""
    if governor is None:
        return
    args = pickle.loads(payload)
    if method == "traffic_withdraw":
        governor.withdraw(*args)
    elif method == "traffic_observe":
        governor.observe(*args)
    elif method == "traffic_finish":
        governor.finish(*args)
