"""A surfaced worker result on its way into the agent's inbox still counts as awaited.

An agent process's surface sink is a round trip (its process to the control side and back into
its own inbox). While a surface is in the sink the worker is no longer watched and the inbox
does not hold it yet: ``waiting`` must stay true then, or the agent's park verdict reads "no
worker, nothing queued" and it quiesces as the result arrives."""

from __future__ import annotations

from typing import Any

from exarch_actors.actors.shell_workers import WorkerSurfaces
from exarch_actors.actors.worker_process import WorkerLink, WorkerOutcome
from exarch_actors.runtime.ral.codec import encode_value


def test_waiting_stays_true_while_a_surface_is_in_the_sink_and_ends_after_it() -> None:
    seen: list[bool] = []
    holder: dict[str, WorkerSurfaces] = {}

    def sink(wid: str, surface: Any) -> None:
        seen.append(holder["s"].waiting)  # read from inside the hand-over, as the agent may

    surfaces = WorkerSurfaces(sink)
    holder["s"] = surfaces
    link = WorkerLink("w1-1")
    assert surfaces.park({"w1-1": link}, {}, stamp=1)  # the turn ended: w1-1 is watched
    assert surfaces.waiting
    link.outcome = WorkerOutcome(encode_value(42), None)
    surfaces.settled("w1-1")
    assert seen == [True]
    assert not surfaces.waiting  # handed over: the inbox holds it now
