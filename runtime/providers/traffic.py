"""The traffic rules of the fleet's governor: one :class:`Lane` per endpoint and model.

Pure rules, no threads and no clock of their own (every method takes ``now``, a monotonic
second): :mod:`runtime.providers.governor` holds the lanes, queues the requests and grants them.

A lane paces four budgets, each what the user set (``--rpm``, ``--input-tpm``,
``--output-tpm``, ``--max-inflight``) or, where the user set none, what the wire said:

- **requests per minute**, **input tokens per minute**, **output tokens per minute** (and, for
  an OpenAI-style server that counts them together, **tokens per minute**) are
  :class:`Bucket` s paced by debt: a request is sent when its bucket is not in debt, and its cost
  is taken at once, so the next one waits until the debt is repaid at the bucket's rate. The
  average rate is exactly the limit and the burst one request: a server whose own bucket has
  any burst at all never refuses a paced fleet, whatever its window (a per-minute window would
  let a fleet send a whole minute's requests in its first second, which the burst a server
  really allows -- the loopback servers of the tests allow 10 -- refuses).
- **requests in flight**: a user's cap, and the probe: until a first reply's headers have said
  what the limits are, one request at a time (a fleet of 40 sending at once into a server with
  a burst of 10 met 30 refusals before it learned anything).

Learning (:func:`parse_rate_headers`): OpenAI's ``x-ratelimit-limit-requests`` /
``-remaining-`` / ``-reset-`` (and ``-tokens``), Anthropic's ``anthropic-ratelimit-requests-*``,
``-input-tokens-*``, ``-output-tokens-*`` (and ``-tokens-*``) and ``retry-after``. Both vendors'
limits are per minute. A ``remaining`` of 0 holds the lane until its ``reset``.

Backing off (AIMD): a 429, 529 or 503 that arrives anyway multiplies the lane's pace by
:data:`DECREASE` and holds it for the server's ``retry-after`` (else one paced interval); each
reply that is not one adds :data:`INCREASE` of the limit back, up to the limit. A lane that
knows no limit at all (a local server that sends no headers) is not paced until its first 429;
then its pace starts from :data:`DECREASE` times the rate it was sending at.

A request's token cost is estimated before it is sent (:func:`estimate_cost`) and corrected
from the usage its reply reports (:meth:`Lane.finish`): the difference is repaid, or credited.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

LaneKey = tuple[str, str]
"""(endpoint base URL, model): one budget each."""

DECREASE = 0.7
"""The pace kept after a 429 that arrived anyway (multiplicative decrease)."""

INCREASE = 0.05
"""The share of the limit each good reply gives back (additive increase): 14 good replies
bring a halved pace back to the limit."""

MIN_FACTOR = 0.05
"""The pace never falls below 5% of the limit: a lane that backs off forever is a lane that
never learns it may go again."""

SEND_HISTORY = 10.0
"""Seconds of sends kept to measure the rate an unpaced lane was sending at when it met a 429."""

PROBE_INFLIGHT = 1
"""Requests in flight while a lane knows nothing yet (no limit set, no reply seen)."""

RATE_LIMIT_STATUSES = frozenset({429, 529})
"""Statuses that are a wait, never a failure: the request goes back to the governor's queue."""

BACKOFF_STATUSES = frozenset({429, 503, 529})
"""Statuses that decrease the pace (503 is still a transport failure for the retry budget)."""

CHARS_PER_TOKEN = 4
"""The estimate before sending: a request's JSON bytes over 4 (English text and JSON are 3.5-4.5
characters a token in both vendors' tokenizers); corrected by the usage of the reply."""

DEFAULT_OUTPUT_ESTIMATE = 256
"""Output tokens expected of a request before a lane has seen any reply's usage."""


@dataclass(frozen=True)
class TrafficLimits:
    """What the user set (``None``: learn it from the wire), and how long a request may wait."""

    rpm: float | None = None
    input_tpm: float | None = None
    output_tpm: float | None = None
    tpm: float | None = None
    """Input and output counted together (OpenAI's ``x-ratelimit-limit-tokens``)."""
    max_inflight: int | None = None
    max_wait: float = 600.0
    """Seconds one request may wait for the rate limit in all before it fails (``--rate-wait``)."""

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "rpm": self.rpm,
            "input_tpm": self.input_tpm,
            "output_tpm": self.output_tpm,
            "tpm": self.tpm,
            "max_inflight": self.max_inflight,
            "max_wait": self.max_wait,
        }


@dataclass(frozen=True)
class Cost:
    """A request's tokens: estimated before it is sent, or as its reply's usage reported."""

    input_tokens: int
    output_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


def estimate_cost(payload_bytes: int, max_tokens: int | None, typical_output: int) -> Cost:
    """The cost of a request before it is sent: its size over :data:`CHARS_PER_TOKEN`, and the
    output the lane typically sees (never more than ``max_tokens`` when one is set)."""
    output = typical_output if max_tokens is None else min(max_tokens, typical_output)
    return Cost(max(1, payload_bytes // CHARS_PER_TOKEN), max(1, output))


# -- what the wire says ------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One limit a reply reported: its size per minute, what remains, seconds until reset."""

    limit: float | None = None
    remaining: float | None = None
    reset: float | None = None


@dataclass(frozen=True)
class WireLimits:
    """What one reply's headers said of the limits; every field ``None`` where absent."""

    requests: Window = Window()
    tokens: Window = Window()
    input_tokens: Window = Window()
    output_tokens: Window = Window()
    retry_after: float | None = None

    @property
    def empty(self) -> bool:
        return self == WireLimits()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """OpenAI's reset durations (``"1s"``, ``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``), a bare
    number of seconds, or ``None`` for anything else."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def _reset_at(text: str, now_wall: float) -> float | None:
    """Anthropic's reset: an RFC 3339 instant, as seconds from ``now_wall``; or a duration."""
    seconds = parse_duration(text)
    if seconds is not None:
        return seconds
    try:
        from datetime import datetime

        instant = datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            instant = email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError):
            return None
    return max(0.0, instant - now_wall)


def _number(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def _window(
    headers: Mapping[str, str], limit: str, remaining: str, reset: str, now: float
) -> Window:
    raw_reset = headers.get(reset)
    return Window(
        _number(headers, limit),
        _number(headers, remaining),
        _reset_at(raw_reset, now) if raw_reset is not None else None,
    )


def parse_rate_headers(headers: Mapping[str, str], now_wall: float | None = None) -> WireLimits:
    """The limits a reply's headers state, in either vendor's dialect (names compared in lower
    case, so pass a case-insensitive mapping or lower-cased keys)."""
    now = time.time() if now_wall is None else now_wall
    h = {k.lower(): v for k, v in headers.items()}

    def openai(kind: str) -> Window:
        return _window(
            h,
            f"x-ratelimit-limit-{kind}",
            f"x-ratelimit-remaining-{kind}",
            f"x-ratelimit-reset-{kind}",
            now,
        )

    def anthropic(kind: str) -> Window:
        p = f"anthropic-ratelimit-{kind}"
        return _window(h, f"{p}-limit", f"{p}-remaining", f"{p}-reset", now)

    def either(a: Window, b: Window) -> Window:
        return a if a != Window() else b

    retry = None
    if "retry-after-ms" in h:
        ms = _number(h, "retry-after-ms")
        retry = ms / 1000.0 if ms is not None else None
    if retry is None and "retry-after" in h:
        retry = _reset_at(h["retry-after"], now)
    return WireLimits(
        requests=either(openai("requests"), anthropic("requests")),
        tokens=either(openai("tokens"), anthropic("tokens")),
        input_tokens=anthropic("input-tokens"),
        output_tokens=anthropic("output-tokens"),
        retry_after=retry,
    )


# -- pacing ------------------------------------------------------------------------------------


class Bucket:
    """Debt pacing at ``rate`` units a second: a grant needs a level of at least zero and takes
    its whole cost at once; the level refills at ``rate`` up to zero (no saved-up burst). An
    unpaced bucket (rate ``None``) is always ready."""

    __slots__ = ("level", "rate", "updated")

    def __init__(self, rate: float | None = None) -> None:
        self.rate = rate
        self.level = 0.0
        self.updated = 0.0

    def _refill(self, now: float) -> None:
        if self.rate is not None and now > self.updated:
            self.level = min(0.0, self.level + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def ready_at(self, now: float) -> float:
        self._refill(now)
        if self.rate is None or self.level >= 0:
            return now
        return now + (-self.level) / self.rate

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        if self.rate is not None:
            self.level -= amount

    def adjust(self, amount: float, now: float) -> None:
        """A correction after the fact: positive repays debt (the estimate was high)."""
        self._refill(now)
        if self.rate is not None:
            self.level = min(0.0, self.level + amount)


@dataclass
class LaneFigures:
    """What a lane has seen (the fleet view, ``/resources``, ``result.json``)."""

    requests: int = 0
    throttled: int = 0
    """Replies that were 429/529 (each one a wait, not a failure)."""
    waits: int = 0
    """Requests that waited for the budget before they were sent."""
    wait_seconds: float = 0.0
    overloaded: int = 0
    """503s: a transport failure for the retry budget, and a reason to slow down."""
    expired: int = 0
    """Requests that waited past the ceiling and failed."""


def _per_second(per_minute: float | None) -> float | None:
    return None if per_minute is None or per_minute <= 0 else per_minute / 60.0


@dataclass
class Lane:
    """One endpoint-and-model's budget (the module docstring's rules)."""

    set_by_user: TrafficLimits
    learned: dict[str, float] = field(default_factory=dict)
    """Per-minute limits the wire reported, by budget name, where the user set none."""
    factor: float = 1.0
    hold_until: float = 0.0
    inflight: int = 0
    probing: bool = True
    figures: LaneFigures = field(default_factory=LaneFigures)
    typical_output: int = DEFAULT_OUTPUT_ESTIMATE
    sends: deque[float] = field(default_factory=deque)
    unpaced_rate: float | None = None
    """The pace an unlimited lane took after a 429 (requests a second, before the factor)."""

    def __post_init__(self) -> None:
        self.buckets = {name: Bucket() for name in ("requests", "input", "output", "tokens")}
        self.probing = not self._anything_set
        self._repace()

    @property
    def _anything_set(self) -> bool:
        u = self.set_by_user
        return any(v is not None for v in (u.rpm, u.input_tpm, u.output_tpm, u.tpm))

    def user_limit(self, name: str) -> float | None:
        u = self.set_by_user
        return {"requests": u.rpm, "input": u.input_tpm, "output": u.output_tpm, "tokens": u.tpm}[
            name
        ]

    def limit(self, name: str) -> float | None:
        """The per-minute limit in force for budget ``name``: the user's, else the learned."""
        user = self.user_limit(name)
        return user if user is not None else self.learned.get(name)

    def _repace(self) -> None:
        for name, bucket in self.buckets.items():
            rate = _per_second(self.limit(name))
            if name == "requests" and rate is None and self.unpaced_rate is not None:
                rate = self.unpaced_rate
            bucket.rate = None if rate is None else rate * self.factor

    @property
    def max_inflight(self) -> int | None:
        cap = self.set_by_user.max_inflight
        if self.probing:
            return PROBE_INFLIGHT if cap is None else min(cap, PROBE_INFLIGHT)
        return cap

    def unlimited(self, now: float) -> bool:
        """Nothing paces this lane now: a request may go at once, without a queue."""
        return (
            not self.probing
            and self.set_by_user.max_inflight is None
            and all(b.rate is None for b in self.buckets.values())
            and self.hold_until <= now
        )

    # -- granting ------------------------------------------------------------------------------

    def ready_at(self, cost: Cost, now: float) -> float | None:
        """When a request of ``cost`` may be sent (``now`` or later); ``None`` while the lane's
        in-flight cap is full (it waits for a reply, not for a time)."""
        cap = self.max_inflight
        if cap is not None and self.inflight >= cap:
            return None
        at = max(now, self.hold_until)
        for bucket in self.buckets.values():
            at = max(at, bucket.ready_at(now))
        return at

    def grant(self, cost: Cost, now: float) -> None:
        self.inflight += 1
        self.figures.requests += 1
        b = self.buckets
        b["requests"].take(1, now)
        b["input"].take(cost.input_tokens, now)
        b["output"].take(cost.output_tokens, now)
        b["tokens"].take(cost.total, now)
        self.sends.append(now)
        while self.sends and self.sends[0] < now - SEND_HISTORY:
            self.sends.popleft()

    def withdraw(self, cost: Cost, now: float) -> None:
        """A granted request that was never sent (its agent was cancelled): its budget back."""
        self.inflight = max(0, self.inflight - 1)
        self._correct(cost, Cost(0, 0), now, requests=1)

    # -- learning ------------------------------------------------------------------------------

    def observe(self, status: int, wire: WireLimits, now: float, cost: Cost | None = None) -> None:
        """A reply's status and headers, as soon as they arrive (before its body streams).
        A budget paced for the first time is charged the request that taught it (``cost``): it
        was sent unpaced, and the next must wait for it like for any other."""
        self.probing = False
        unpaced = {name for name, b in self.buckets.items() if b.rate is None}
        for name, window in (
            ("requests", wire.requests),
            ("tokens", wire.tokens),
            ("input", wire.input_tokens),
            ("output", wire.output_tokens),
        ):
            if window.limit is not None and window.limit > 0:
                self.learned[name] = window.limit
            if window.remaining is not None and window.remaining < 1 and window.reset:
                self.hold_until = max(self.hold_until, now + window.reset)
        if status in BACKOFF_STATUSES:
            if status in RATE_LIMIT_STATUSES:
                self.figures.throttled += 1
            else:
                self.figures.overloaded += 1
            self._decrease(now, wire.retry_after)
        elif 200 <= status < 300:
            self.factor = min(1.0, self.factor + INCREASE)
        self._repace()
        if cost is not None:
            amounts = {
                "requests": 1,
                "input": cost.input_tokens,
                "output": cost.output_tokens,
                "tokens": cost.total,
            }
            for name in unpaced:
                if self.buckets[name].rate is not None:
                    self.buckets[name].take(amounts[name], now)

    def _decrease(self, now: float, retry_after: float | None) -> None:
        if all(self.limit(n) is None for n in self.buckets) and self.unpaced_rate is None:
            recent = [t for t in self.sends if t >= now - SEND_HISTORY]
            span = max(1.0, now - recent[0]) if recent else 1.0
            self.unpaced_rate = max(1.0 / 60.0, len(recent) / span)
        self.factor = max(MIN_FACTOR, self.factor * DECREASE)
        self._repace()
        rate = self.buckets["requests"].rate
        pause = retry_after if retry_after is not None else (1.0 / rate if rate else 1.0)
        self.hold_until = max(self.hold_until, now + pause)

    def finish(self, estimate: Cost, usage: Cost | None, now: float) -> None:
        """The request is over (answered, failed or cut): out of flight, and its estimate
        corrected by the usage its reply reported."""
        self.inflight = max(0, self.inflight - 1)
        self.probing = False
        if usage is None:
            return
        self.typical_output = max(1, (self.typical_output * 3 + usage.output_tokens) // 4)
        self._correct(estimate, usage, now)

    def _correct(self, estimate: Cost, actual: Cost, now: float, requests: int = 0) -> None:
        b = self.buckets
        b["requests"].adjust(requests, now)
        b["input"].adjust(estimate.input_tokens - actual.input_tokens, now)
        b["output"].adjust(estimate.output_tokens - actual.output_tokens, now)
        b["tokens"].adjust(estimate.total - actual.total, now)

    def describe(self) -> dict[str, object]:
        """Limits in force (and whether set or learned), in flight, and the figures."""

        limits: dict[str, object] = {}
        for name in self.buckets:
            limit = self.limit(name)
            if limit is not None:
                source = "set" if self.user_limit(name) is not None else "learned"
                limits[name] = {"per_minute": limit, "source": source}
        return {
            "limits": limits,
            "pace": round(self.factor, 3),
            "inflight": self.inflight,
            "probing": self.probing,
            "requests": self.figures.requests,
            "throttled": self.figures.throttled,
            "overloaded": self.figures.overloaded,
            "waits": self.figures.waits,
            "wait_seconds": round(self.figures.wait_seconds, 3),
            "expired": self.figures.expired,
        }
