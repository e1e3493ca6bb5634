"""One provider round trip as the agent meters it for the :class:`~runtime.events.ModelCall`
event: when it began, how many transport attempts it took and how long it waited in the
traffic governor (both read from the provider's stream events), and what it cost.

Pure and per agent (one drive thread): no lock. The clock is the wall clock for the start (a
transcript's ``at`` is wall time) and the monotonic clock for the duration (a wall-clock step
never makes a request last a negative time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from exarch_actors.runtime.events import ModelCall
from exarch_actors.runtime.messages import AssistantMessage
from exarch_actors.runtime.providers.base import RateWait, StreamReset


@dataclass
class RoundTrip:
    """The figures of one round trip in flight; :meth:`event` is its record once it returned."""

    started: float = field(default_factory=time.monotonic)
    attempts: int = 1
    rate_wait: float = 0.0

    def note(self, ev: Any) -> None:
        """A stream event of this round trip: a reset is one more attempt, a finished rate
        wait adds its seconds."""
        if isinstance(ev, StreamReset):
            self.attempts = max(self.attempts, ev.attempt + 1)
        elif isinstance(ev, RateWait) and ev.waited is not None:
            self.rate_wait += ev.waited

    def event(
        self,
        agent: str,
        msg: AssistantMessage,
        *,
        model: str,
        provider: str,
        cost: Decimal | None,
        operation: str = "chat",
    ) -> ModelCall:
        usage = msg.usage
        return ModelCall(
            agent,
            model=model,
            provider=provider,
            operation=operation,
            seconds=round(max(0.0, time.monotonic() - self.started), 6),
            input_tokens=usage.input_tokens if usage else None,
            output_tokens=usage.output_tokens if usage else None,
            cache_write_tokens=usage.cache_write_tokens if usage else None,
            cache_read_tokens=usage.cache_read_tokens if usage else None,
            cost=str(cost) if cost is not None else None,
            stop_reason=msg.stop_reason.value,
            tool_calls=len(msg.tool_calls),
            attempts=self.attempts,
            rate_wait=round(self.rate_wait, 6),
        )
