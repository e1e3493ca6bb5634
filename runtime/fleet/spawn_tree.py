"""The spawn tree: the registry's pure rules for names, forks and the cancellation cascade
(docs/architecture.md, Cancellation).

- An entry's name is its identity among *live* entries (:class:`NameTaken`); the trunk holds
  ``TRUNK_NAME``. Internally nodes carry a serial id, so a name reused after its holder ended
  never inherits the old holder's orphans.
- Parent links make the registry the spawn tree; :meth:`SpawnTree.subtree` walks it.
- Spawn fuel bounds depth, not fan-out: a parentless node starts at ``SPAWN_FUEL``, a child gets
  its parent's fuel minus one, the parent is never debited, and a parent at 0 is refused with
  :class:`FuelExhausted`.
- The global generation advances only on :meth:`SpawnTree.clear_subtree`; a result or deferred
  batch stamped before the clear that reaped its recipient's subtree is stale.
- The idle lease is armed at birth for returning sub-agents only, measured from the
  last-human-exchange stamp seeded at birth; :meth:`SpawnTree.record_exchange` (the registry's
  ``steer``) is the only renewal. The clock is injectable.

Nothing here is thread-safe or touches a thread: ``runtime/fleet/registry.py`` holds the lock.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from exarch_actors.runtime.constants import SPAWN_FUEL, TRUNK_NAME
from exarch_actors.runtime.errors import ExarchError, FuelExhausted, NameTaken, UnknownAgent
from exarch_actors.runtime.fleet.park import conversing

Clock = Callable[[], float]

IDLE_LEASE_SECS = 900.0
"""Default idle bound of a returning sub-agent with no human exchange (no rule fixes one;
15 minutes outlasts any single provider round-trip by two orders of magnitude)."""


class AgentEnded(UnknownAgent):
    """The name belonged to a live agent once, and that agent has ended."""

    def __init__(self, name: str) -> None:
        ExarchError.__init__(
            self, f"agent ended: {name!r} is no longer running; nothing can be delivered to it"
        )
        self.name = name


AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""An agent's name is its identity and its directory name in the session: letters, digits,
``_``, ``-`` and ``.``, not starting with ``.`` or ``-``, at most 64 characters."""


class BadAgentName(ExarchError):
    """A name that cannot identify an agent (it would also be unsafe as a directory name)."""

    def __init__(self, name: object) -> None:
        super().__init__(
            f"bad agent name {name!r}: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter, digit or '_'"
        )
        self.name = name


# --- the idle lease ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRemaining:
    """The lease is under its bound; re-arm for ``margin`` seconds."""

    margin: float


@dataclass(frozen=True)
class LeaseExpired:
    """Idle past the bound: cascade the subtree with cause ``deadline``."""

    idle: float


LeaseFire = LeaseRemaining | LeaseExpired


@dataclass
class IdleLease:
    """Idle span measured off the last human exchange; renewed by nothing but ``steer``."""

    bound: float
    last_exchange: float

    def idle(self, now: float) -> float:
        return max(0.0, now - self.last_exchange)

    def remaining(self, now: float) -> float:
        return self.bound - self.idle(now)

    def renew(self, now: float) -> None:
        self.last_exchange = now

    def fire(self, now: float) -> LeaseFire:
        margin = self.remaining(now)
        if margin > 0:
            return LeaseRemaining(margin)
        return LeaseExpired(self.idle(now))


# --- nodes ------------------------------------------------------------------------------------


@dataclass
class SpawnNode:
    """One live (or just-ended) entry of the spawn tree."""

    id: int
    name: str
    parent: int | None
    parent_name: str | None
    returns: bool
    interactive: bool
    fuel: int
    generation: int  # the global generation at birth: the stamp of its results
    last_exchange: float
    lease: IdleLease | None = None
    engaged: bool = False
    epoch: int = 0  # stamps below this are stale for this node (set by clear_subtree)
    cancel_cause: str | None = None
    children: list[int] = field(default_factory=list)

    @property
    def conversing(self) -> bool:
        return conversing(interactive=self.interactive, returns=self.returns)

    @property
    def can_spawn(self) -> bool:
        return self.fuel > 0


class SpawnTree:
    """Live entries keyed by unique name, with parent links, fuel, generation and leases."""

    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        lease_bound: float = IDLE_LEASE_SECS,
        root_fuel: int = SPAWN_FUEL,
    ) -> None:
        self.clock = clock
        self.lease_bound = lease_bound
        self.root_fuel = root_fuel
        self.generation = 0
        self._ids = itertools.count(1)
        self._by_name: dict[str, int] = {}
        self._nodes: dict[int, SpawnNode] = {}
        self._ended: set[str] = set()

    # -- membership --

    def register(
        self,
        name: str,
        parent: str | None = None,
        *,
        returns: bool,
        interactive: bool = False,
        fuel: int | None = None,
    ) -> SpawnNode:
        """Add a live entry. Raises NameTaken, UnknownAgent/AgentEnded (parent), FuelExhausted.

        ``fuel`` may only be given for a parentless node (a resumed trunk); a child always gets
        ``parent.fuel - 1``. A child of a cancelled parent inherits the cancel cause (a cancel
        that arrived mid-fork), so the caller trips the child's token at once.
        """
        if not isinstance(name, str) or not AGENT_NAME.fullmatch(name):
            raise BadAgentName(name)
        if name in self._by_name:
            raise NameTaken(name)
        parent_node: SpawnNode | None = None
        if parent is not None:
            parent_node = self.get(parent)
            if fuel is not None:
                raise ValueError("fuel is derived from the parent; pass it only for a root")
            child_fuel = self.child_fuel(parent)
        else:
            child_fuel = self.root_fuel if fuel is None else fuel
        now = self.clock()
        node = SpawnNode(
            id=next(self._ids),
            name=name,
            parent=parent_node.id if parent_node else None,
            parent_name=parent,
            returns=returns,
            interactive=interactive,
            fuel=child_fuel,
            generation=self.generation,
            last_exchange=now,
            epoch=self.generation,
        )
        if parent_node is not None and returns:
            node.lease = IdleLease(self.lease_bound, now)
        if parent_node is not None:
            parent_node.children.append(node.id)
            node.cancel_cause = parent_node.cancel_cause
        self._nodes[node.id] = node
        self._by_name[name] = node.id
        self._ended.discard(name)
        return node

    def child_fuel(self, parent: str) -> int:
        """The fuel a child of ``parent`` would get; FuelExhausted when ``parent`` has none."""
        node = self.get(parent)
        if node.fuel <= 0:
            raise FuelExhausted(parent)
        return node.fuel - 1

    def deregister(self, name: str) -> SpawnNode:
        """Remove a live entry (the agent ended). Its live children stay registered."""
        node = self.get(name)
        del self._by_name[name]
        del self._nodes[node.id]
        if node.parent is not None and node.parent in self._nodes:
            siblings = self._nodes[node.parent].children
            if node.id in siblings:
                siblings.remove(node.id)
        self._ended.add(name)
        return node

    def get(self, name: str) -> SpawnNode:
        """The live node named ``name``; AgentEnded if it ended, UnknownAgent if never seen."""
        nid = self._by_name.get(name)
        if nid is None:
            if name in self._ended:
                raise AgentEnded(name)
            raise UnknownAgent(name)
        return self._nodes[nid]

    def lookup(self, name: str) -> SpawnNode | None:
        nid = self._by_name.get(name)
        return None if nid is None else self._nodes[nid]

    def is_live(self, name: str) -> bool:
        return name in self._by_name

    def has_ended(self, name: str) -> bool:
        return name in self._ended and name not in self._by_name

    def is_empty(self) -> bool:
        return not self._by_name

    def names(self) -> list[str]:
        return list(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def trunk(self) -> SpawnNode | None:
        return self.lookup(TRUNK_NAME)

    # -- the tree --

    def _walk(self, node: SpawnNode) -> Iterator[SpawnNode]:
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(self._nodes[c] for c in reversed(current.children) if c in self._nodes)

    def subtree(self, name: str) -> list[SpawnNode]:
        """``name`` and every live descendant, parents before children."""
        return list(self._walk(self.get(name)))

    def live_children(self, name: str) -> list[SpawnNode]:
        """``name``'s live children, oldest first (the links a cancel hops along)."""
        return self.children_of(self.get(name))

    def children_of(self, node: SpawnNode) -> list[SpawnNode]:
        """:meth:`live_children` of a node in hand (no lookup by name)."""
        nodes = self._nodes
        return [nodes[c] for c in node.children if c in nodes]

    def descendants(self, name: str) -> list[SpawnNode]:
        """Every live proper descendant of ``name``, parents before children."""
        return self.subtree(name)[1:]

    def live_descendants(self, name: str) -> list[str]:
        return [n.name for n in self.descendants(name)]

    def has_live_descendants(self, name: str) -> bool:
        """``bool(live_descendants(name))`` without the walk: a live descendant is reached
        through a live child (the walk follows live nodes only), so one live child answers.
        A parent held by its children reads this after each child's result: the walk of its
        100 children per read made a cascade's ends quadratic."""
        return any(c in self._nodes for c in self.get(name).children)

    def depth(self, name: str) -> int:
        node, d = self.get(name), 0
        while node.parent is not None and node.parent in self._nodes:
            node, d = self._nodes[node.parent], d + 1
        return d

    def mark_cancelled(self, nodes: list[SpawnNode], cause: str) -> None:
        """Record the cause on nodes not already cancelled (the first cause is kept)."""
        for node in nodes:
            if node.cancel_cause is None:
                node.cancel_cause = cause

    # -- generations --

    def clear_subtree(self, name: str) -> tuple[int, list[SpawnNode]]:
        """Advance the generation and make every pre-clear stamp stale for the subtree."""
        nodes = self.subtree(name)
        self.generation += 1
        for node in nodes:
            node.epoch = self.generation
        return self.generation, nodes

    def is_stale(self, recipient: str, stamp: int) -> bool:
        """Whether a delivery stamped ``stamp`` predates a clear that reaped ``recipient``."""
        node = self.lookup(recipient)
        return node is not None and stamp < node.epoch

    # -- human exchange and leases --

    def record_exchange(self, name: str) -> SpawnNode:
        """A delivered human message: engaged, and the idle lease renewed (the only renewal)."""
        node = self.get(name)
        node.engaged = True
        node.last_exchange = self.clock()
        if node.lease is not None:
            node.lease.renew(node.last_exchange)
        return node

    def lease_fire(self, name: str) -> LeaseFire | None:
        """Fire ``name``'s lease now; ``None`` if it has none (not a returning sub-agent)."""
        node = self.get(name)
        if node.lease is None:
            return None
        return node.lease.fire(self.clock())

    def leased(self) -> list[SpawnNode]:
        return [n for n in self._nodes.values() if n.lease is not None]
