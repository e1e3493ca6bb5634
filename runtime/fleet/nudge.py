"""The react rule set: which model-visible self-nudges an agent posts when its apply loop stops.

One pure function, :func:`decide`, reads the facts the driver holds at the end of an apply loop
(how the loop ended, whether the agent replied, its construction-fixed ``returns`` bit, its pin
register, whether descendants are still live) plus the latch state, and returns a
:class:`NudgeDecision`: a :class:`Verdict` for the driver and the nudges to post, with the updated
latches. It never touches an inbox, a log or a clock.

Rules (there is no separate completion gate; these are all of them):

- **must_reply** — a returning agent (``returns``) whose loop ended without ``reply``.
- **continue** — the loop ended truncated at the output-token limit with no tool call.
- **empty_repair** — the model stopped with nothing usable: an empty message, or an early stop.
- **self_verify** — the one-shot latch: a *headless trunk*'s first reply is turned back once for
  self-verification; the next reply is honoured.
- **pinned_reminder** — anything pinned; uniform for every pin kind, budget-free (it draws on no
  budget and has none of its own), independent of and *additive* with must_reply.
- **residency** — not a react rule: posted after a tool-call batch in which a session binding
  went over the large-binding limit (1 MiB), once per binding per excursion above the limit
  (:class:`ResidencyLatch`). A resident multi-megabyte binding is what the binding-lease ledger
  cannot free while a closure mentions it; the model is told to bind a file path instead.

Invariants (each is a test):

- While live descendants exist nothing is posted: the verdict is ``SUSPENDED`` and the driver
  re-runs :func:`decide` when they settle, against the *then* pin register (the function is
  stateless over pins, so "resumed against the still-live pin register" needs no memory).
  Running ral workers whose results will be surfaced to the agent (``live_workers``) suspend it
  the same way: the agent has delegated its next actionable fact to them.
- ``CAPPED`` matches no rule (terminal: re-driving would spend MAX_STEPS again); ``CANCELLED`` and
  ``PROVIDER_ERROR`` (rate limit, exhausted transport) never post a nudge — provider facts surface
  as ``ProviderError`` events, not as model-visible text.
- Per-turn budgets bound must_reply / continue / empty_repair. The pinned reminder is unbudgeted;
  its loop is bounded by MAX_STEPS (a turn that never unpins ends ``Capped``) and the model's
  way out is ``unpin``.
- Latches reset at a genuine turn boundary (:meth:`NudgeLatches.at_turn_boundary`), never on a
  self-nudge (:meth:`NudgeLatches.after_self_nudge` is the identity). The self-verify latch is
  the exception by design: it is one-shot per agent *lifetime* ("the first reply"), so a child
  result arriving between the turned-back reply and the next one cannot re-arm it and turn the
  agent back forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from exarch_actors.runtime.shell.ledger import LargeBinding


class Outcome(StrEnum):
    """How the apply loop ended (the driver classifies the last assistant message)."""

    END_TURN = "end_turn"
    """The model stopped calling tools and said it was done."""
    TRUNCATED = "truncated"
    """Max-tokens with no captured tool call: the partial is in the log, the work is unfinished."""
    EMPTY = "empty"
    """No tool call and no text (committed as the X7 stub)."""
    EARLY_STOP = "early_stop"
    """The model stopped for a reason other than end-turn / tool-use / max-tokens (a stop
    sequence, a content filter, an unknown reason): it did not say it was done."""
    CAPPED = "capped"
    """MAX_STEPS round-trips: terminal, matches no rule."""
    CANCELLED = "cancelled"
    PROVIDER_ERROR = "provider_error"
    """Rate limit or exhausted transport: a provider fact, never a nudge."""


class NudgeKind(StrEnum):
    MUST_REPLY = "must_reply"
    CONTINUE = "continue"
    EMPTY_REPAIR = "empty_repair"
    SELF_VERIFY = "self_verify"
    PINNED_REMINDER = "pinned_reminder"
    RESIDENCY = "residency"


class Verdict(StrEnum):
    """What the driver does next."""

    CONTINUE_TURN = "continue_turn"
    """Post the nudges (as self-nudges) and run apply again: the same turn continues."""
    SUSPENDED = "suspended"
    """Live descendants: post nothing, wait for them, call :func:`decide` again when they settle.
    If the agent replied and its self-verify is still owed, the reply is *not* honoured yet."""
    HONOUR_REPLY = "honour_reply"
    """The reply stands: end the agent (cancelling its remaining descendants)."""
    END_TURN = "end_turn"
    """Nothing to post: the turn ends and the park verdict decides what happens to the agent."""


BUDGETS: Mapping[NudgeKind, int] = MappingProxyType(
    {
        NudgeKind.MUST_REPLY: 3,
        NudgeKind.CONTINUE: 4,
        NudgeKind.EMPTY_REPAIR: 2,
    }
)
"""Per-turn budgets. Chosen, not measured: a model that ignores the same request three times in
one turn will not act on a fourth; continue gets one more because each truncation is real
progress (the partial is kept). The pinned reminder and self-verify are not here on purpose."""


# --- model-facing texts -------------------------------------------------------------------------
# These are exactly what the model reads (and what the transcript records as a nudge event).

MUST_REPLY_TEXT = (
    "You ended your turn without calling `reply`. Whoever started you is waiting for your answer "
    "and receives nothing else: text outside `reply` is never delivered. Finish anything "
    "that remains, then call the ral tool with `reply VALUE` (a string, number, list or map)."
)

CONTINUE_TEXT = (
    "Your last message was cut off at the output-token limit; what you wrote so far is kept above. "
    "Continue exactly where it stopped, without repeating it. If you were writing a long ral "
    "script, split the work into several smaller tool calls."
)

EMPTY_REPAIR_TEXT = (
    "Your last message was empty or stopped before you finished. Continue the task: call the ral "
    "tool with your next step, or state your answer."
)
EMPTY_REPAIR_RETURNING_TEXT = (
    "Your last message was empty or stopped before you finished. Continue the task: call the ral "
    "tool with your next step, and deliver your answer with `reply VALUE`."
)

SELF_VERIFY_TEXT = (
    "Before your reply becomes final, verify it. Re-read the task, check every claim in your "
    "answer with ral (re-run the computation, re-read the files, test the edge cases), and fix "
    "anything wrong. Then call `reply` again; that reply is final."
)


def pinned_reminder_text(pins: Sequence[str]) -> str:
    """The reminder for the pin register ``pins`` (keys, or ``key: value`` lines), kind-blind."""
    listed = "\n".join(f"- {p}" for p in pins)
    return (
        "You still hold pinned state:\n"
        f"{listed}\n"
        "Continue the work it describes. When an item is done or no longer applies, remove it "
        "with `unpin KEY`; this reminder repeats while anything stays pinned."
    )


@dataclass(frozen=True)
class Nudge:
    """One self-nudge to post. Equality is by value, so the inbox's exact-duplicate rule applies."""

    kind: NudgeKind
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": "nudge", "nudge": self.kind.value, "text": self.text}


@dataclass(frozen=True)
class NudgeLatches:
    """Latch state: per-turn counts of fired nudges, plus the lifetime self-verify latch."""

    fired: Mapping[NudgeKind, int] = field(default_factory=lambda: MappingProxyType({}))
    self_verified: bool = False

    def count(self, kind: NudgeKind) -> int:
        return self.fired.get(kind, 0)

    def at_turn_boundary(self) -> NudgeLatches:
        """A genuine turn boundary (a new inbox turn): per-turn counts reset; self-verify stays."""
        return NudgeLatches(self_verified=self.self_verified)

    def after_self_nudge(self) -> NudgeLatches:
        """A self-nudge is the same turn continuing: nothing resets."""
        return self

    def _fire(self, kinds: Sequence[NudgeKind]) -> NudgeLatches:
        if not kinds:
            return self
        fired = dict(self.fired)
        for k in kinds:
            fired[k] = fired.get(k, 0) + 1
        verified = self.self_verified or NudgeKind.SELF_VERIFY in kinds
        return replace(self, fired=MappingProxyType(fired), self_verified=verified)


@dataclass(frozen=True)
class NudgeInputs:
    """The facts at the end of one apply loop."""

    outcome: Outcome
    returns: bool
    """Construction-fixed: fork true, branch false, trunk ``not interactive``."""
    replied: bool = False
    pins: tuple[str, ...] = ()
    """The live pin register, rendered (``key: value``); non-empty means something is pinned."""
    live_descendants: bool = False
    live_workers: bool = False
    """Running workers whose results will be surfaced into the agent's inbox."""
    headless_trunk: bool = False
    """Parent-less and not interactive: the node the self-verify latch applies to."""


@dataclass(frozen=True)
class NudgeDecision:
    verdict: Verdict
    nudges: tuple[Nudge, ...]
    latches: NudgeLatches


_NO_RULE = frozenset({Outcome.CAPPED, Outcome.CANCELLED, Outcome.PROVIDER_ERROR})


def waiting_matters(
    outcome: Outcome,
    latches: NudgeLatches,
    *,
    replied: bool,
    returns: bool,
    headless_trunk: bool,
) -> bool:
    """Whether :func:`decide` reads ``live_descendants`` and ``live_workers`` for inputs with
    these other facts: not for a terminal outcome, nor for a reply it honours whatever is still
    running. A driver reads them only when they matter: each is a round trip for an agent
    process (the registry's park reads, its shell's worker count), ~0.5 ms of CPU at the end
    of every returning child (docs/benchmarks.md)."""
    if outcome in _NO_RULE:
        return False
    if replied:
        return headless_trunk and returns and not latches.self_verified
    return True


def decide(inputs: NudgeInputs, latches: NudgeLatches) -> NudgeDecision:
    """Apply the react rule set. Pure; see the module docstring for the invariants."""
    if inputs.outcome in _NO_RULE:
        # Terminal or a provider fact. A reply committed before a cancel still stands.
        verdict = Verdict.HONOUR_REPLY if inputs.replied else Verdict.END_TURN
        return NudgeDecision(verdict, (), latches)

    waiting = inputs.live_descendants or inputs.live_workers
    if inputs.replied:
        if inputs.headless_trunk and inputs.returns and not latches.self_verified:
            if waiting:
                return NudgeDecision(Verdict.SUSPENDED, (), latches)
            nudge = Nudge(NudgeKind.SELF_VERIFY, SELF_VERIFY_TEXT)
            return NudgeDecision(
                Verdict.CONTINUE_TURN, (nudge,), latches._fire([NudgeKind.SELF_VERIFY])
            )
        return NudgeDecision(Verdict.HONOUR_REPLY, (), latches)

    if waiting:
        return NudgeDecision(Verdict.SUSPENDED, (), latches)

    nudges: list[Nudge] = []
    primary = _primary(inputs, latches)
    if primary is not None:
        nudges.append(primary)
    if inputs.pins:
        nudges.append(Nudge(NudgeKind.PINNED_REMINDER, pinned_reminder_text(inputs.pins)))
    if not nudges:
        return NudgeDecision(Verdict.END_TURN, (), latches)
    return NudgeDecision(
        Verdict.CONTINUE_TURN, tuple(nudges), latches._fire([n.kind for n in nudges])
    )


def _primary(inputs: NudgeInputs, latches: NudgeLatches) -> Nudge | None:
    """At most one of continue / empty_repair / must_reply, in that order of precedence.

    A rule whose budget is spent falls through to the next that applies, so a returning agent
    that keeps truncating is eventually asked to reply rather than to continue forever.
    """

    def has_budget(kind: NudgeKind) -> bool:
        return latches.count(kind) < BUDGETS[kind]

    if inputs.outcome is Outcome.TRUNCATED and has_budget(NudgeKind.CONTINUE):
        return Nudge(NudgeKind.CONTINUE, CONTINUE_TEXT)
    if inputs.outcome in (Outcome.EMPTY, Outcome.EARLY_STOP) and has_budget(NudgeKind.EMPTY_REPAIR):
        text = EMPTY_REPAIR_RETURNING_TEXT if inputs.returns else EMPTY_REPAIR_TEXT
        return Nudge(NudgeKind.EMPTY_REPAIR, text)
    if inputs.returns and has_budget(NudgeKind.MUST_REPLY):
        return Nudge(NudgeKind.MUST_REPLY, MUST_REPLY_TEXT)
    return None


def residency_text(name: str, size_bytes: int, limit_bytes: int) -> str:
    """The residency nudge for one binding that went over the large-binding limit."""
    return (
        f"Your session binding `{name}` holds {size_bytes} bytes, over the {limit_bytes}-byte "
        "large-binding limit. It stays resident for as long as the name (or any closure that "
        "mentions it) lives, and every checkpoint of your shell carries it. Bind a file path "
        "instead of the content: write the data to a file in `env EXARCH_SCRATCH` and keep "
        "the path; read slices of it when you need them."
    )


@dataclass(frozen=True)
class ResidencyLatch:
    """Once per binding per excursion above the large-binding limit.

    ``latched`` holds the names already nudged whose current value is still over the limit. An
    excursion ends when the name is written again at or under the limit, or when it is gone
    (pruned by the binding-lease ledger, or ``/clear``); the next write over the limit is a new
    excursion and is nudged again. Rewriting a latched name over the limit stays silent.
    """

    latched: frozenset[str] = frozenset()

    def after_run(
        self, large: Sequence[LargeBinding], written: Sequence[str], gone: Sequence[str] = ()
    ) -> tuple[ResidencyLatch, tuple[Nudge, ...]]:
        """Fold one run's writes: ``large`` over the limit, ``written`` every name the run wrote
        (large ones included), ``gone`` names that no longer exist. Returns the new latch and the
        nudges to post, in write order."""
        over = {w.name for w in large}
        latched = (set(self.latched) - set(gone)) - (set(written) - over)
        nudges: list[Nudge] = []
        for w in large:
            if w.name not in latched:
                latched.add(w.name)
                nudges.append(
                    Nudge(NudgeKind.RESIDENCY, residency_text(w.name, w.size_bytes, w.limit_bytes))
                )
        return ResidencyLatch(frozenset(latched)), tuple(nudges)


def classify(
    stop_reason: str, *, has_tool_calls: bool, empty: bool, known: frozenset[str] | None = None
) -> Outcome:
    """Map the last assistant message of a finished apply loop to an :class:`Outcome`.

    ``empty`` is the pre-admission emptiness (no tool call, no non-whitespace text): the X7 stub
    text does not make an empty reply non-empty for the repair rule. A max-tokens stop *with* tool
    calls never ends a loop (the calls are dispatched), so it is not classified here.
    """
    recognised = known if known is not None else frozenset({"end_turn", "tool_use", "max_tokens"})
    if empty and stop_reason != "max_tokens":
        return Outcome.EMPTY
    if stop_reason == "max_tokens" and not has_tool_calls:
        return Outcome.TRUNCATED
    if stop_reason not in recognised:
        return Outcome.EARLY_STOP
    return Outcome.END_TURN
