"""``agent-wait`` in flight: the desk's side of one wait, held by the shell actor's pump while the
shell host blocks in its enquiry (``actors/shell.py``).

The verb is answered late: the desk registers the wait with its site
(:meth:`actors.agent_site.AgentSite.wait_children`), which holds no thread for it, and the
answer arrives on whatever thread settles the last child (an agent process's channel reader for
the process backend); it wakes the pump, which sends it to the host. Meanwhile the pump keeps
serving the host, so a cancel of the calling run reaches it as an ``abandon``.

Invariants:
- No reply is lost: a wait whose caller abandoned it (a cancel) gives back what it collected --
  delivered to the parent's inbox as if no wait had been -- whether its answer was still
  pending, arriving as it was withdrawn, or already sent to a host that no longer took it.
- No reply is delivered twice: when its answer is taken, the results of the children it returns
  are taken out of the agent's inbox (a result delivered before the wait began is there, or was
  refused, by the time the answer arrives: ``actors/fanin_site.py``).
- With no names, a wait returns only ends the agent has not had: a child whose result it
  already admitted as a turn is left out.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.fleet.fanin import RUNNING_END, WaitAnswer, is_held_notice
from exarch_actors.runtime.fleet.inbox import AgentResult
from exarch_actors.runtime.ral.errors import DeskRefusal
from exarch_actors.runtime.ral.values import render

if TYPE_CHECKING:
    from exarch_actors.actors.agent_site import AgentSite
    from exarch_actors.runtime.fleet.inbox import Inbox


class WaitOwner(Protocol):
    """The parts of an agent a wait touches (:class:`actors.desk.DeskOwner` has them)."""

    name: str
    site: AgentSite
    inbox: Inbox
    results_seen: set[str]


WAIT_OPTIONS = ("timeout",)
"""The keys ``agent-wait``'s options map accepts."""

_ids = itertools.count(1)


def wait_arguments(args: list[Any]) -> tuple[tuple[str, ...] | None, float | None]:
    """``agent-wait [NAME | [NAME, ...]] ... [OPTIONS]``: the names (``None``: every child not
    collected yet) and the timeout in seconds; a typed refusal for anything else."""
    timeout: float | None = None
    if args and isinstance(args[-1], dict):
        options = args[-1]
        args = args[:-1]
        unknown = sorted(set(options) - set(WAIT_OPTIONS))
        if unknown:
            known = ", ".join(WAIT_OPTIONS)
            raise DeskRefusal(f"agent-wait: unknown option {', '.join(unknown)} (known: {known})")
        if "timeout" in options:
            t = options["timeout"]
            if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
                raise DeskRefusal(f"agent-wait: timeout must be seconds >= 0, got {render(t)}")
            timeout = float(t)
    if not args:
        return None, timeout
    names: list[str] = []
    for a in args:
        items = a if isinstance(a, list) else [a]
        for item in items:
            if isinstance(item, list | dict):
                raise DeskRefusal(f"agent-wait: a NAME must be a string, got {render(item)}")
            names.append(render(item))
    return tuple(names), timeout


class PendingWait:
    """One ``agent-wait``: registered with the site at construction; the pump polls
    :meth:`ready` when woken, calls :meth:`expire` at :attr:`deadline` and :meth:`withdraw`
    (or :meth:`give_back_answer`) when the host abandons it."""

    def __init__(
        self,
        owner: WaitOwner,
        names: tuple[str, ...] | None,
        timeout: float | None,
        wake: Callable[[], None],
    ) -> None:
        self._owner = owner
        self._site = owner.site
        self._parent = owner.name
        self._named = names is not None
        self.wait_id = f"{owner.name}:{os.getpid()}:{next(_ids)}"
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._wake = wake
        self._lock = threading.Lock()
        self._outcome: WaitAnswer | BaseException | None = None
        self._withdrawn = False
        try:
            now: WaitAnswer | BaseException | None = self._site.wait_children(
                self._parent, self.wait_id, names, self._then
            )
        except ExarchError as e:  # a stranger named (NotAChild): the verb's refusal
            now = e
        if now is not None:
            self._then(now)

    def _then(self, outcome: WaitAnswer | BaseException) -> None:
        """The site's answer (any thread; never blocks beyond a give-back's delivery)."""
        with self._lock:
            if self._outcome is not None:
                return
            self._outcome = outcome
            withdrawn = self._withdrawn
        if withdrawn:
            self._give_back(outcome)
        else:
            self._wake()

    def ready(self) -> dict[str, Any] | None:
        """The answer frame's fields once the answer is here (taken once), else None."""
        from exarch_actors.runtime.ral.codec import encode_value

        with self._lock:
            outcome = self._outcome
        if outcome is None:
            return None
        if isinstance(outcome, BaseException):
            return {"refusal": str(outcome)}
        return {"value": encode_value(self._to_ral(outcome))}

    def expire(self) -> None:
        """The timeout passed: the partial answer (children still running say so). An answer
        given meanwhile is already here or on its way to :meth:`_then`."""
        self.deadline = None
        partial = self._site.stop_wait(self._parent, self.wait_id, False)
        if partial is not None:
            self._then(partial)

    def withdraw(self) -> None:
        """The caller abandoned the wait before its answer reached it: the children keep
        running, and what the wait collected goes back to the inbox."""
        with self._lock:
            self._withdrawn = True
            outcome = self._outcome
        if outcome is None:
            self._site.stop_wait(self._parent, self.wait_id, True)
            return  # answered meanwhile: _then gives it back
        self._give_back(outcome)

    def give_back_answer(self) -> None:
        """The host abandoned the wait after its answer was sent (it never took it)."""
        with self._lock:
            outcome = self._outcome
        if outcome is not None:
            self._give_back(outcome)

    def _give_back(self, outcome: WaitAnswer | BaseException) -> None:
        if isinstance(outcome, WaitAnswer) and outcome.ends:
            self._site.give_back(self._parent, outcome.ends)

    def _to_ral(self, answer: WaitAnswer) -> dict[str, Any]:
        """The ral map ``NAME -> [outcome: ..., reply: ... | reason: ...]``; the results it
        returns taken out of the inbox (and the held-replies notice, once none is held)."""
        children = set(answer.children)
        inbox = self._owner.inbox
        taken = inbox.take(lambda i: isinstance(i, AgentResult) and i.child in children)
        queued = {i.child for i in taken if isinstance(i, AgentResult)}
        if answer.held == 0:
            inbox.take(is_held_notice)
        seen = self._owner.results_seen
        out: dict[str, Any] = {}
        for end in answer.ends:
            if not self._named and end.child in seen and end.child not in queued:
                continue  # had as a turn already: a wait on everything returns what is new
            out[end.child] = end.to_ral()
        for name in answer.running:
            out[name] = dict(RUNNING_END)
        return out
