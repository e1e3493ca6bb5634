"""The node watch: which Ray nodes are alive, and which joined or left, while a fleet runs.

A fleet on ``--backend ray`` (``actors/ray_backend.py``) keeps one :class:`NodeWatch`, a thread
that asks Ray for its alive nodes every :data:`NODE_POLL_SECS` and reports each change once:
a node that joined (a new one, or a lost one started again, which Ray names anew) and a node
that left (removed, or declared dead by Ray's health checks). The backend updates its own
books on each (a node that left holds none of the run's hosts and no launcher any more); the
fleet publishes it as a ``NodeJoined`` / ``NodeLeft`` notice (transcript and views) and the
``fleet`` view shows the roster. Placement needs no admission step: it reads Ray's alive nodes
at every start, so a node that joined takes new agents from its first start on.

Invariants:
- The nodes alive when the watch starts are its roster, not changes: each later change is
  reported exactly once, in the order the polls saw it, on the watch's own thread.
- A poll that fails (Ray briefly unreachable) changes nothing; the next one compares against
  the last roster seen.
- :meth:`NodeWatch.close` stops the thread and waits for it: no report follows it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

NODE_POLL_SECS = 1.0
"""Seconds between two looks at Ray's node table (``ray.nodes()``, one GCS call)."""

RECENT = 6
"""Changes the watch keeps for a view (the newest last)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeChange:
    """One node joining or leaving the cluster; ``alive``: how many were alive after it."""

    node: str
    address: str
    change: Literal["joined", "left"]
    alive: int

    @property
    def notice(self) -> str:
        return "NodeJoined" if self.change == "joined" else "NodeLeft"

    def describe(self) -> str:
        return f"node {self.node[:8]} ({self.address}) {self.change}; {self.alive} alive"


def roster_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[NodeChange]:
    """What changed from roster ``before`` to ``after`` (node id -> address): the nodes that
    left, then the nodes that joined, each in its roster's order."""
    n = len(after)
    left = [NodeChange(node, addr, "left", n) for node, addr in before.items() if node not in after]
    joined = [
        NodeChange(node, addr, "joined", n) for node, addr in after.items() if node not in before
    ]
    return left + joined


class NodeWatch:
    """Polls ``alive`` (node id -> address) and calls ``on_change`` with each change."""

    def __init__(
        self,
        alive: Callable[[], dict[str, str]],
        on_change: Callable[[NodeChange], None],
        interval: float = NODE_POLL_SECS,
    ) -> None:
        self._alive = alive
        self._on_change = on_change
        self._interval = interval
        self._lock = threading.Lock()
        self._roster = dict(alive())
        self.recent: collections.deque[NodeChange] = collections.deque(maxlen=RECENT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ray-node-watch", daemon=True)
        self._thread.start()

    @property
    def roster(self) -> dict[str, str]:
        """The alive nodes at the last look."""
        with self._lock:
            return dict(self._roster)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                now = dict(self._alive())
            except Exception as e:  # Ray briefly unreachable: the next poll tries again
                log.debug("node watch: %s", e)
                continue
            with self._lock:
                changes = roster_changes(self._roster, now)
                self._roster = now
                self.recent.extend(changes)
            for change in changes:
                try:
                    self._on_change(change)
                except Exception:  # a failing reader never stops the watch
                    log.exception("node watch: reporting %s", change.describe())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
