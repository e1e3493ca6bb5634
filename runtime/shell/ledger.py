"""The binding-lease ledger: an agent shell's top-level scratch names expire when the model stops
using them; nothing else about binding does (docs/language.md, Binding leases).

Rules, each enforced here and each with its own test in ``tests/shell_rules/``:

- **Armed once, by the host.** An unarmed ledger (the REPL) records nothing and prunes nothing.
  :meth:`BindingLedger.arm` seals every name visible at arming (agent library, rc, host seeds,
  and harmlessly any prelude name) as a permanent **baseline**. Arming again is *refused*
  (:class:`LedgerAlreadyArmed`), not a no-op: /clear and fork build a fresh ledger, so a second
  arm on the same ledger is a wiring bug, and silently keeping the first baseline would hide it.
- **One chokepoint.** :meth:`BindingLedger.note_define` is the only way a name becomes a lease;
  the shell calls it from the session-level ``let`` alone. A rebind restamps (writing is use).
  A baseline name the model rebinds *stays baseline*: the seal makes it permanently
  exempt, and pruning a rebound library name would leave the name unbound for every later
  library caller — worse than the scratch it would free. The write still gets the large-binding
  check, because the bytes are the model's.
- **Σ is never an entry.** Harvested names the ledger does not hold (natives, prelude, lexical
  names) are ignored by :meth:`renew`; they are not candidates, not merely exempt.
- **The clock.** :meth:`tick` once per committed run (failed parse/elaboration included: failed
  runs age scratch but renew nothing). No wall clock anywhere.
- **What renews.** The referenced-name harvest of each compile (:meth:`renew`) and writes.
  Listing and probes (:meth:`figures`, :meth:`names`, :meth:`to_state`) renew nothing.
- **Pruning.** Only at a ready boundary (:meth:`prune`), only with a surface sink installed
  (otherwise nothing is touched and the notices wait), refused from a mid-frame caller. A name
  last used at epoch ``e`` survives through ``e + idle_calls - 1`` and falls at the boundary of
  ``e + idle_calls``, unless its value still reaches a running worker handle, in which case it is
  pinned and re-examined at the next boundary. A pin never renews.
- **Rollback keeps renewals.** A call that panics is rolled back to the last checkpoint, but
  the names its text referenced were renewed when it compiled, and a renewal only ever errs
  toward a longer lease: :func:`carry_renewals` re-applies them to the restored state, so the
  rollback itself never makes a name the call used fall.
- **Fork.** :meth:`BindingLedger.for_fork` arms the child's ledger on the parent's terms with its
  whole inherited scope as baseline, through the same :meth:`arm`; the child's clock starts at 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exarch_actors.runtime.constants import BINDING_IDLE_CALLS, LARGE_BINDING_BYTES
from exarch_actors.runtime.errors import ExarchError

STATE_VERSION = 1
"""Version of :meth:`BindingLedger.to_state`'s plain-dict layout."""


class LedgerError(ExarchError):
    """A binding-ledger operation was refused."""


class LedgerAlreadyArmed(LedgerError):
    """The ledger was armed before; a fresh ledger is built for /clear and for a fork."""

    def __init__(self) -> None:
        super().__init__(
            "binding ledger already armed: its baseline is sealed once; "
            "build a fresh ledger (as /clear and fork do) to seal a new one"
        )


class PruneRefused(LedgerError):
    """A mid-frame caller (a builtin body, a transient frame) asked to prune."""

    def __init__(self) -> None:
        super().__init__(
            "prune refused: pruning happens only at the ready boundary between runs, "
            "never from inside a running frame"
        )


class LedgerStateInvalid(LedgerError):
    """A persisted ledger state could not be read back."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"binding ledger state invalid: {what}")


@dataclass(frozen=True)
class LargeBinding:
    """The large-binding residency notice: one per write whose encoding exceeds the limit."""

    name: str
    size_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class PruneOutcome:
    """What one ready boundary did. ``waited`` is True when no sink was installed."""

    fell: tuple[str, ...] = ()
    pinned: tuple[str, ...] = ()
    waited: bool = False


@dataclass(frozen=True)
class LedgerFigures:
    """Probe figures (read-only; reading them renews nothing)."""

    armed: bool
    live: int
    """Leased (model-written, non-baseline) names currently held."""
    baseline: int
    pinned: int
    nearest_expiry_calls: int | None
    """Calls until the soonest unpinned lease falls (0 = falls at this boundary); None if none."""
    bytes_held: int
    """Sum of the encoded sizes of the leased names, as last written."""


class BindingLedger:
    """Leases on the session-level names the model binds. Pure; owned by one shell."""

    def __init__(self) -> None:
        self._armed = False
        self._idle_calls = BINDING_IDLE_CALLS
        self._large_bytes = LARGE_BINDING_BYTES
        self._clock = 0
        self._baseline: frozenset[str] = frozenset()
        self._baseline_sorted: tuple[str, ...] = ()
        # Two flat int maps rather than one object per entry: to_state is then two C-level dict
        # copies. Measured for 100,000 leases (by a benchmark of the whole-file checkpoint, since
        # removed with it): 55 ms with one object per entry, 0.7 ms with these two maps.
        self._last_use: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._pinned: set[str] = set()
        # (last use, name) of every stamp since the lease was written, a min-heap: a boundary
        # pops only the stamps old enough to fall, so pruning costs what aged out, not the
        # number of leases. A stamp that a later use superseded is skipped when popped.
        self._due: list[tuple[int, str]] = []
        # What changed since the last take_delta: a checkpoint ships and logs only these, so
        # its cost follows the call, not the number of leases (see take_delta).
        self._touched: set[str] = set()
        self._terms_changed = True

    # -- arming ---------------------------------------------------------------------------------

    @property
    def armed(self) -> bool:
        return self._armed

    @property
    def clock(self) -> int:
        """Committed runs counted so far (starts at 0; a fork's child starts its own at 0)."""
        return self._clock

    @property
    def idle_calls(self) -> int:
        return self._idle_calls

    @property
    def large_bytes(self) -> int:
        return self._large_bytes

    def arm(
        self,
        baseline_names: Iterable[str],
        idle_calls: int = BINDING_IDLE_CALLS,
        large_bytes: int = LARGE_BINDING_BYTES,
    ) -> None:
        """Seal ``baseline_names`` as permanently exempt and start leasing. Once per ledger."""
        if self._armed:
            raise LedgerAlreadyArmed()
        if idle_calls < 1:
            raise LedgerError(f"idle_calls must be at least 1, got {idle_calls}")
        if large_bytes < 0:
            raise LedgerError(f"large_bytes must be non-negative, got {large_bytes}")
        self._baseline = frozenset(baseline_names)
        # Sorted once: the baseline never changes after arming, and a fork of a large scope
        # seals every inherited name, so re-sorting per checkpoint would be O(scope).
        self._baseline_sorted = tuple(sorted(self._baseline))
        self._idle_calls = idle_calls
        self._large_bytes = large_bytes
        self._last_use.clear()
        self._sizes.clear()
        self._pinned.clear()
        self._due.clear()
        self._armed = True
        self._terms_changed = True

    def fork_terms(self) -> tuple[int, int] | None:
        """The terms a fork's child is armed on: ``(idle_calls, large_bytes)``; None if unarmed."""
        return (self._idle_calls, self._large_bytes) if self._armed else None

    @classmethod
    def for_fork(
        cls, terms: tuple[int, int] | None, inherited_names: Iterable[str]
    ) -> BindingLedger:
        """A child's ledger: the parent's terms, the whole inherited scope sealed as baseline.

        Uses :meth:`arm` itself, so the child is sealed by the same code as any other seat.
        An unarmed parent (the REPL) yields an unarmed child.
        """
        child = cls()
        if terms is not None:
            idle_calls, large_bytes = terms
            child.arm(inherited_names, idle_calls=idle_calls, large_bytes=large_bytes)
        return child

    # -- the clock and use -----------------------------------------------------------------------

    def tick(self) -> int:
        """Advance the clock by one committed run (failed runs tick too); return the new epoch."""
        self._clock += 1
        return self._clock

    def note_define(self, name: str, epoch: int, size_bytes: int) -> LargeBinding | None:
        """The one chokepoint: a session-level ``let`` wrote ``name``.

        Restamps the lease (writing is use). Returns the large-binding notice when the written
        encoding exceeds the armed limit. Unarmed: records nothing, notices nothing.
        """
        if not self._armed:
            return None
        if name not in self._baseline:
            last = self._last_use.get(name)
            if last is None or epoch > last:
                self._last_use[name] = epoch
                self._stamp(name, epoch)
            self._sizes[name] = size_bytes
            self._pinned.discard(name)
            self._touched.add(name)
        if size_bytes > self._large_bytes:
            return LargeBinding(name, size_bytes, self._large_bytes)
        return None

    def renew(self, names: Iterable[str], epoch: int) -> None:
        """Renew the leases of the harvested ``names``; names the ledger does not hold are ignored.

        A stale epoch never shortens a lease (a false renewal only ever lengthens one).
        """
        if not self._armed:
            return
        last_use = self._last_use
        for name in names:
            last = last_use.get(name)
            if last is not None and epoch > last:
                last_use[name] = epoch
                self._stamp(name, epoch)
                self._pinned.discard(name)
                self._touched.add(name)

    def _stamp(self, name: str, epoch: int) -> None:
        """Note ``name``'s new last use in the due heap. Superseded stamps are dropped when
        popped, or -- when a shell never prunes (no sink) or renews a few names every call --
        by rebuilding the heap once it holds twice the leases: amortised O(1) a stamp."""
        due = self._due
        heapq.heappush(due, (epoch, name))
        if len(due) > 2 * len(self._last_use) + 64:
            self._rebuild_due()

    def _rebuild_due(self) -> None:
        pinned = self._pinned
        self._due = [(last, n) for n, last in self._last_use.items() if n not in pinned]
        heapq.heapify(self._due)

    def forget(self, name: str) -> None:
        """Drop ``name``'s lease (the name was unset by other means). Baseline seals are kept."""
        self._last_use.pop(name, None)
        self._sizes.pop(name, None)
        self._pinned.discard(name)
        self._touched.add(name)

    # -- the ready boundary ----------------------------------------------------------------------

    def prune(
        self,
        epoch: int,
        *,
        sink_installed: bool,
        mid_frame: bool,
        pins_running_work: Callable[[str], bool],
    ) -> PruneOutcome:
        """Examine every lease idle past the bound; pin those reaching running work, drop the rest.
        Costs the leases that aged out and the pinned ones, not every lease (the due heap).

        The caller unsets each fallen name (value and elaboration seed in one act), emits one
        Prune notice and record, and checkpoints, so no rollback can resurrect what fell.
        """
        if mid_frame:
            raise PruneRefused()
        if not sink_installed:
            return PruneOutcome(waited=True)
        if not self._armed:
            return PruneOutcome()
        fell: list[str] = []
        pinned: list[str] = []
        last_use, due = self._last_use, self._due
        idle_upto = epoch - self._idle_calls  # a lease last used at or before this falls
        idle: set[str] = set()
        for name in self._pinned:  # pinned at the last boundary: examined again
            last = last_use.get(name)
            if last is None:
                continue
            if last <= idle_upto:
                idle.add(name)
            else:  # an earlier epoch than the last boundary's: not idle yet, due again later
                heapq.heappush(due, (last, name))
        while due and due[0][0] <= idle_upto:
            last, name = heapq.heappop(due)
            if last_use.get(name) == last:  # else superseded by a later use, or gone
                idle.add(name)
        for name in idle:
            (pinned if pins_running_work(name) else fell).append(name)
        for name in fell:
            del self._last_use[name]
            del self._sizes[name]
        self._touched.update(fell)
        self._pinned = set(pinned)
        return PruneOutcome(tuple(sorted(fell)), tuple(sorted(pinned)))

    # -- probes (read-only, renew nothing) -------------------------------------------------------

    def names(self) -> frozenset[str]:
        """The leased names. Enumeration is not observation: nothing is renewed."""
        return frozenset(self._last_use)

    def baseline(self) -> frozenset[str]:
        return self._baseline

    def is_leased(self, name: str) -> bool:
        return name in self._last_use

    def last_use(self, name: str) -> int | None:
        return self._last_use.get(name)

    def figures(self, epoch: int) -> LedgerFigures:
        nearest: int | None = None
        for name, last in self._last_use.items():
            if name in self._pinned:
                continue
            left = max(0, last + self._idle_calls - epoch)
            if nearest is None or left < nearest:
                nearest = left
        return LedgerFigures(
            armed=self._armed,
            live=len(self._last_use),
            baseline=len(self._baseline),
            pinned=len(self._pinned),
            nearest_expiry_calls=nearest,
            bytes_held=sum(self._sizes.values()),
        )

    # -- persistence -----------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """A plain dict (msgpack/JSON-able) for the MobileSnapshot."""
        return {
            "version": STATE_VERSION,
            "armed": self._armed,
            "idle_calls": self._idle_calls,
            "large_bytes": self._large_bytes,
            "clock": self._clock,
            "baseline": list(self._baseline_sorted),
            "last_use": dict(self._last_use),
            "sizes": dict(self._sizes),
            "pinned": sorted(self._pinned),
        }

    def take_delta(self) -> dict[str, Any]:
        """What changed since the last call (or since :meth:`from_state`/:meth:`arm`), as a map
        :func:`apply_delta` folds into a :meth:`to_state` copy; then starts a new delta.

        ``clock`` and ``pinned`` always travel (an int and, almost always, an empty list); the
        leases only of the names written, renewed, forgotten or pruned; the terms and the
        baseline only when armed or rebuilt. Measured: with 100,000 leases, ``to_state`` per
        call was ~0.8 ms plus its transfer and its write; a delta is the call's own names.
        """
        delta: dict[str, Any] = {"clock": self._clock, "pinned": sorted(self._pinned)}
        touched = self._touched
        if touched:  # an empty set is kept, not replaced every call
            self._touched = set()
        if self._terms_changed:  # armed or rebuilt: the leases travel whole, once
            self._terms_changed = False
            delta["terms"] = {
                "armed": self._armed,
                "idle_calls": self._idle_calls,
                "large_bytes": self._large_bytes,
                "baseline": list(self._baseline_sorted),
                "last_use": dict(self._last_use),
                "sizes": dict(self._sizes),
            }
        elif touched:
            last_use, sizes = self._last_use, self._sizes
            delta["last_use"] = {n: last_use[n] for n in touched if n in last_use}
            delta["sizes"] = {n: sizes[n] for n in touched if n in sizes}
            delta["gone"] = sorted(n for n in touched if n not in last_use)
        return delta

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> BindingLedger:
        """Rebuild a ledger from :meth:`to_state`; a malformed state raises LedgerStateInvalid."""
        if not isinstance(state, Mapping):
            raise LedgerStateInvalid(f"expected a map, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise LedgerStateInvalid(
                f"version {state.get('version')!r}, this build reads {STATE_VERSION}"
            )
        ledger = cls()
        try:
            armed = state["armed"]
            idle_calls = state["idle_calls"]
            large_bytes = state["large_bytes"]
            clock = state["clock"]
            baseline = state["baseline"]
            last_use = state["last_use"]
            sizes = state["sizes"]
            pinned = state["pinned"]
        except KeyError as e:
            raise LedgerStateInvalid(f"missing field {e.args[0]!r}") from None
        if not isinstance(armed, bool):
            raise LedgerStateInvalid("'armed' is not a bool")
        for field, value, low in (
            ("idle_calls", idle_calls, 1),
            ("large_bytes", large_bytes, 0),
            ("clock", clock, 0),
        ):
            if not _is_int(value) or value < low:
                raise LedgerStateInvalid(f"{field!r} is not an integer >= {low}: {value!r}")
        if not _is_str_list(baseline) or not _is_str_list(pinned):
            raise LedgerStateInvalid("'baseline' and 'pinned' must be lists of names")
        for field, table in (("last_use", last_use), ("sizes", sizes)):
            if not isinstance(table, Mapping) or not all(
                isinstance(n, str) and _is_int(v) and v >= 0 for n, v in table.items()
            ):
                raise LedgerStateInvalid(f"{field!r} is not a map of names to integers >= 0")
        if set(last_use) != set(sizes):
            raise LedgerStateInvalid("'last_use' and 'sizes' name different entries")
        ledger._last_use = dict(last_use)
        ledger._sizes = dict(sizes)
        ledger._armed = armed
        ledger._idle_calls = idle_calls
        ledger._large_bytes = large_bytes
        ledger._clock = clock
        ledger._baseline = frozenset(baseline)
        ledger._baseline_sorted = tuple(sorted(ledger._baseline))
        ledger._pinned = {n for n in pinned if n in ledger._last_use}
        ledger._rebuild_due()
        ledger._terms_changed = False  # a delta after from_state is relative to ``state``
        return ledger


def referenced_names(source: str) -> frozenset[str]:
    """The names a compile of ``source`` harvests (every variable occurrence and command-head
    name, as the session's own harvest), or nothing when it does not parse: a run refused
    before compiling renews nothing. Elaborated leniently, so it needs no session scope; an
    unbound name only over-approximates, which a renewal tolerates."""
    from exarch_actors.runtime.ral.compile import Scope, compile_program, harvest, no_gc
    from exarch_actors.runtime.ral.errors import RalSyntaxError
    from exarch_actors.runtime.ral.parser import parse

    try:
        with no_gc():
            phrases = parse(source)
            compile_program(phrases, Scope("session", set(), None), frozenset(), lenient=True)
    except (RalSyntaxError, RecursionError):
        return frozenset()
    return harvest(phrases)


def carry_renewals(state: Mapping[str, Any], names: Iterable[str], epoch: int) -> dict[str, Any]:
    """``state`` (a :meth:`BindingLedger.to_state`) with ``names`` renewed at ``epoch``.

    The rollback of a panicking call restores the ledger of the last checkpoint; the call's own
    harvest (:func:`referenced_names` of its script, plus any ``use`` the host compiled during
    it) is renewed on top, exactly as the call's compiles renewed it. Names the ledger does not
    hold are ignored, as in ``renew``.
    """
    ledger = BindingLedger.from_state(state)
    ledger.renew(names, epoch)
    return ledger.to_state()


def apply_delta(state: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Fold a :meth:`BindingLedger.take_delta` into ``state`` (a :meth:`BindingLedger.to_state`
    whose ``last_use`` and ``sizes`` maps the caller owns) in place, at the cost of the delta."""
    state["clock"] = delta["clock"]
    state["pinned"] = list(delta["pinned"])
    terms = delta.get("terms")
    if terms is not None:  # whole leases: replace, never merge
        state.update(terms, version=STATE_VERSION)
        state["last_use"], state["sizes"] = dict(terms["last_use"]), dict(terms["sizes"])
        return
    if len(delta) == 2:  # only the clock and the pins moved (a call that renewed nothing)
        return
    last_use, sizes = state["last_use"], state["sizes"]
    last_use.update(delta.get("last_use") or {})
    sizes.update(delta.get("sizes") or {})
    for name in delta.get("gone") or ():
        last_use.pop(name, None)
        sizes.pop(name, None)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_str_list(x: object) -> bool:
    return isinstance(x, list | tuple) and all(isinstance(n, str) for n in x)


def reaches_running_worker(value: object, is_running: Callable[[Any], bool]) -> bool:
    """Does ``value`` structurally reach a running worker handle?

    Recurses lists, maps and variant payloads; deliberately never looks inside a closure's
    captured environment (the closure's own name is the lease that governs what it holds).
    Iterative, and each container is visited once, so deep or shared structure costs linear time.
    """
    from exarch_actors.runtime.ral.values import Closure, Variant, WorkerHandle

    stack: list[object] = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if isinstance(v, WorkerHandle):
            if is_running(v):
                return True
        elif isinstance(v, Closure):
            continue
        elif isinstance(v, list | tuple | dict | Variant):
            if id(v) in seen:
                continue
            seen.add(id(v))
            if isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, Variant):
                stack.append(v.payload)
            else:
                stack.extend(v)
    return False
