"""Worker results that wake their agent: which ral worker completions are surfaced, and when.

An agent that ends its turn while workers it spawned are still running does not end, and is not
nudged to reply: it waits (``runtime.fleet.park``'s ``HeldByWorkers``, ``runtime.fleet.nudge``'s
suspended
verdict), and each worker's completion is pushed into its inbox as a ``Surface`` item, which
starts its next turn. :class:`SurfaceRule` is the bookkeeping behind that, pure and
single-threaded (the shell actor wraps it in a lock, since completions arrive on worker watcher
threads); :func:`surface_text` is what the model reads.

Rules:

- **Park.** When the agent's turn ends (:meth:`SurfaceRule.park`), every worker still running is
  *watched*, and every worker that settled during the turn without being claimed by ``await``
  and without being surfaced before is surfaced at once. The agent waits while anything is
  watched (:attr:`SurfaceRule.waiting`).
- **Settle.** A watched worker that settles while the agent is parked is surfaced at once
  (:meth:`SurfaceRule.settled` says so). One that settles while the agent is in a model turn is
  left for the next park: the running turn may still ``await`` it, and a claimed result is
  never surfaced.
- **Once.** A worker is surfaced at most once. Surfacing does not claim it: ``await`` on its
  handle still yields the value until the registry's retention sweep expires the entry.
- **Never.** A worker the model cancelled itself, or one the registry reaped by policy (its reap
  notice stays in the transcript, not in the model's context), is dismissed: never surfaced.
- **Stamp.** Surfaces carry the generation stamped at the park that watched them, so after
  ``/clear`` the registry's generation guard drops (and records) a completion from before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exarch_actors.runtime.fleet.digest import digest_tool_result


@dataclass(frozen=True)
class Parked:
    """What :meth:`SurfaceRule.park` decided: surface ``now``; ``watched`` are still running."""

    now: tuple[str, ...]
    watched: tuple[str, ...]

    @property
    def waits(self) -> bool:
        """Whether the agent has any worker result coming (now or later)."""
        return bool(self.now or self.watched)


class SurfaceRule:
    """Which worker completions are surfaced, and when (see the module docstring). Pure."""

    def __init__(self) -> None:
        self._watched: set[str] = set()
        self._closed: set[str] = set()
        """Surfaced or dismissed: never surfaced (again)."""
        self._parked = False
        self.stamp = 0
        """The generation of the last park: what a surface is stamped with."""

    @property
    def waiting(self) -> bool:
        """Watched workers are still running: the agent waits for them."""
        return bool(self._watched)

    @property
    def parked(self) -> bool:
        return self._parked

    def pending(self, running: Iterable[str], settled: Iterable[str]) -> bool:
        """Whether a :meth:`park` now would leave the agent a result to wait for: a running
        worker, or a settled unclaimed one not surfaced before. Changes nothing."""
        return any(w not in self._closed for w in (*running, *settled))

    def park(self, running: Iterable[str], settled: Iterable[str], stamp: int) -> Parked:
        """The agent's turn ended: watch ``running``; surface the ``settled`` unclaimed results
        not surfaced before. ``running`` and ``settled`` are the registry's whole content, so
        ids no longer in it (claimed, reaped) are forgotten here."""
        running, settled = list(running), list(settled)
        present = set(running) | set(settled)
        self._closed &= present
        self._watched = {w for w in running if w not in self._closed}
        now = tuple(w for w in settled if w not in self._closed)
        self._closed |= set(now)
        self._parked = True
        self.stamp = stamp
        return Parked(now, tuple(sorted(self._watched)))

    def unpark(self) -> None:
        """A model turn began: completions wait for the next park."""
        self._parked = False

    def settled(self, worker: str) -> bool:
        """``worker`` settled: True when it must be surfaced now (watched, agent parked)."""
        if worker not in self._watched:
            return False
        self._watched.discard(worker)
        if not self._parked or worker in self._closed:
            return False
        self._closed.add(worker)
        return True

    def dismiss(self, worker: str) -> None:
        """Never surface ``worker`` (cancelled by the model, reaped by policy, claimed)."""
        self._watched.discard(worker)
        self._closed.add(worker)

    def reset(self) -> None:
        """A fresh worker registry (``/clear``) or a closed shell: nothing is watched."""
        self._watched.clear()
        self._closed.clear()


def surface_text(
    worker: str,
    *,
    value: str | None,
    error: str | None,
    stdout: str = "",
    stderr: str = "",
) -> str:
    """What the model reads for one surfaced completion: a header, then the result digested
    under the same per-section caps as a tool result (value or error, stdout, stderr)."""
    status = "failed" if error is not None else "done"
    body = digest_tool_result(value, stdout, stderr, error)
    return f"[worker {worker} finished: {status}; `await` on its handle still yields it]\n{body}"
