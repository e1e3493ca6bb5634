"""How much of the cores each process of a fleet may take, and when it steps back.

The control process runs at its own priority; every fork-server child (agent process, shell
host, worker) starts below it (:data:`AGENT_NICE`, :func:`yield_to_control`), so the fleet's
hub is never starved by its own agents. An agent process that a cancel ends steps back in
stages, each only ever lower (an unprivileged process cannot raise its priority again):

- once a terminal cancel has killed its busy shell: every thread to :data:`REACHED_NICE`
  (:func:`stand_back`, on the killing thread), so the cascade's reach into the agents not
  reached yet goes first;
- once its drive loop has returned: to :data:`ENDING_NICE` (nothing, if already lower);
- once its end is reported (``Ended``): every thread to the idle class (:func:`stand_aside`):
  what is left of it is no one's wait. A shell killed behind the living has its main thread
  there too (:func:`to_idle_class`, from ``ChildProcess.kill_behind``).

The figures behind each value are in the docstrings below and in docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import os

DYING_NICE = 19
"""The nice of a thread sent to the idle class (:func:`to_idle_class`) where the platform has
no ``SCHED_IDLE``."""


AGENT_NICE = 5
"""The nice value of every fork-server child (agent process, shell host, worker; the programs
a shell starts inherit it): the control process stays at its own, so the fleet's hub -- the
registry's cancel cascade, the settlements, every agent's site calls -- is never starved by
its own agents. On 2 cores, cancelling 100 agents busy in ``sleep`` sent the 100 cancel frames
in 114-187 ms at nice 0 (each frame woke an agent that took the CPU from the cancelling thread:
the cascade's last reach past its 100 ms bound) and in 35-108 ms at nice 5
(docs/benchmarks.md)."""


def yield_to_control() -> None:
    """In a fork-server child, first thing (its later threads inherit it): lower this process to
    :data:`AGENT_NICE` (nice is per thread on Linux). Never raises: a platform or sandbox that
    refuses leaves the child at the control process's priority."""
    with contextlib.suppress(OSError, AttributeError):
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < AGENT_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)


ENDING_NICE = 10
"""The nice of an agent process whose drive loop a cancel ended (:func:`stand_back`)."""

REACHED_NICE = 12
"""The nice of an agent process once a terminal cancel has killed its shell's running
evaluation (:meth:`actors.eval_root.EvalRoot.make_terminal`'s ``after_kill``, on the thread
that killed): what is left of its end -- the cancelled call recorded, its report -- runs behind
the agents the cascade has not reached yet, which then get the cores at once. Measured on 2
cores, alternated (docs/benchmarks.md): 100 agents busy in ``sleep``, all cancelled, the last
reach (median of runs) 90-102 ms at 10 (:data:`ENDING_NICE`; one run 146), 54 at 15, 56-62
at 19, the settlement 267-287 ms whichever; 10 sleepers cancelled while 20 other agents keep
both cores busy at :data:`AGENT_NICE`, settled in 136-180 ms at 10, 257-352 at 15 and
1,170-1,538 at 19 (an end at 19 gets ~1/20 of a working agent's share of a core, at 15 ~1/9).
15 kept the reach of 19 and gave back most of what 19 cost a busy box's settlement. Once what
is left after ``Ended`` moved to the idle class (:func:`stand_aside`) the idle-class work
summed over a hundred dying processes took its share from ends at 15 (weight 36 each against 3
each): at 12, alternated in one sitting, the partial cancel settled in 112-184 ms against
289-340 at 15, the 100-agent cascade in 171-234 (median 208) against 195-226 (201), its last
reach 48-79 ms against 48-80."""


def stand_back(nice: int = ENDING_NICE) -> None:
    """Lower every thread of this process to ``nice`` (never raises; a thread at a higher nice
    keeps it). Called by an agent process whose busy shell a terminal cancel killed (at
    :data:`REACHED_NICE`, on the killing thread), and by one whose drive loop a cancel ended
    (at :data:`ENDING_NICE`, which changes nothing after the first): what is left of its end
    (the cancelled call recorded, its report, the reap) then runs behind the cascade's reach into
    the agents and shells it has not reached yet, instead of beside it. In the 100-agent
    cascade (medians of alternated runs, docs/benchmarks.md) the last reach fell from 156 to
    116 ms on 2 cores and from 282 to 207 ms on one; the price is a later settlement, the
    ends' reports arriving together once the reach is done (267 -> 287 ms on 2 cores, 409 ->
    458 ms on one). Nice 10 by default, not 19 (110 ms): a cancelled agent's settlement waits
    for this end, and on a saturated box nice 19 gets ~1/20 of a nice-5 agent's share of a
    core, nice 10 ~1/3. Only ever done by a process about to end: an unprivileged process
    cannot raise its priority back. A call at a nice no higher than an earlier call's does
    nothing, not even read ``/proc``: every thread is there already, and a thread started since
    inherited its starter's nice (an agent whose busy shell was killed stood back at
    :data:`REACHED_NICE`, then again at :data:`ENDING_NICE` when its drive loop returned)."""
    global _stood_back_at
    if _stood_back_at is not None and nice <= _stood_back_at:
        return
    _stood_back_at = nice
    for tid in _own_threads():
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)


_stood_back_at: int | None = None
"""The nice of this process's last :func:`stand_back` (None: it never stood back)."""


def to_idle_class(tid: int = 0) -> None:
    """Move thread ``tid`` (0: the calling one) to ``SCHED_IDLE``, the class that runs when no
    other thread wants the core; where the platform has none, to :data:`DYING_NICE`. Never
    raises (a thread gone is left alone). One way: an unprivileged thread cannot leave the
    idle class again, so only what is killed or done (:func:`stand_aside`) is moved."""
    with contextlib.suppress(OSError):
        if hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, DYING_NICE)


def stand_aside() -> None:
    """Move every thread of this process to the idle class (:func:`to_idle_class`). Called by
    an agent process once its end is reported (``Ended``): what is left of it -- its killed
    shell reaped, its threads stopped, the wait to be told to exit, its exit -- is no one's
    wait, so it runs when the cores have nothing else to do, not beside the agents still
    ending and the control process settling them. 100 agents busy in ``sleep``, all
    cancelled, 2 cores, alternated in one sitting (docs/benchmarks.md): settled in 200-263 ms
    (median 209) with this and the killed shells in the idle class, against 264-289 ms
    (median 279) with neither."""
    for tid in _own_threads():
        to_idle_class(tid)


def _own_threads() -> list[int]:
    """This process's threads' ids (``[0]``, the calling thread, where ``/proc`` has none)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return [0]
