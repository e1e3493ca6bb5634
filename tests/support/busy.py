"""Whether a fleet's agent is busy in a ral call: what a test waits for before it cancels one."""

from __future__ import annotations

from exarch_actors.actors.agent_process import evaluating
from exarch_actors.actors.fleet import Fleet


def busy_in_its_call(fleet: Fleet, name: str) -> bool:
    """Whether ``name``'s shell is evaluating its call: the call is in its event log and its
    shell is evaluating (:func:`actors.agent_process.evaluating`). The log alone is not
    enough: the call is recorded before the run reaches the shell, and a cancel in between
    stops no evaluation (a benchmark's smoke run on a loaded box cancelled one so)."""
    agent = fleet.hosted.get(name)
    return agent is not None and evaluating(agent, fleet.session.events(name))
