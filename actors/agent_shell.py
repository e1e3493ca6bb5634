"""An agent's shell as whoever hosts the agent runs it: start, one call, stop, the probe fold.

The same four steps serve an agent driven in the control process (:class:`actors.fleet.Fleet`)
and one driven in its own agent process (``actors/agent_process.py``): the shell is always a
child of the agent's host, so these run where the agent runs, and only what they report
(notices, surfaced worker results, commit records) reaches shared state -- through the
callbacks they are given.

Invariants:
- A surfaced worker completion reaches the agent's inbox only through ``deliver`` (the
  registry's rule: quota-checked, generation-guarded, recorded when refused).
- Every call that committed (no error, no rollback) appends one ``Commit`` record to the
  agent's own ``commits.jsonl``, which the drill checker reads (docs/drills.md).
- Stopping is idempotent: a shell already stopped is the state wanted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka

from exarch_actors.actors.agent_site import ShellOutput, ShellParts
from exarch_actors.actors.eval_root import EvalRoot
from exarch_actors.actors.host_start import HostStart
from exarch_actors.actors.shell import ShellActor, run_call
from exarch_actors.actors.shell_workers import WorkerSurfaces
from exarch_actors.runtime.events import Event, Resources
from exarch_actors.runtime.fleet.digest import digest_tool_result
from exarch_actors.runtime.fleet.diskwarn import disk_usage
from exarch_actors.runtime.fleet.inbox import Surface
from exarch_actors.runtime.fleet.probes import ResourceFigures, event_rows, resources
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.shell.confinement import Sandbox
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state import durability
from exarch_actors.runtime.state.durable import append_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import commit_record

if TYPE_CHECKING:
    from exarch_actors.actors.agent import Agent
    from exarch_actors.runtime.ral.context import DynamicContext
    from exarch_actors.runtime.state.snapshot import MobileSnapshot

log = logging.getLogger(__name__)


def start_agent_shell(
    name: str,
    session: SessionDir,
    desk: Any,
    context: DynamicContext | None,
    snapshot: MobileSnapshot | None,
    *,
    limits: ShellLimits,
    publish: Callable[[Event], None],
    deliver: Callable[[str, Surface, str], None],
    sync_log: bool = False,
    host_start: HostStart | None = None,
) -> ShellParts:
    """The agent's shell actor, its eval root and its worker surfaces (held here so no
    mailbox is in the way). ``sync_log``: fsync each binding-log frame (``--durability
    machine``); ``host_start``: its host, already started (an agent process's)."""
    root = EvalRoot()

    def surface(worker: str, item: Surface) -> None:
        deliver(name, item, f"worker {worker}")

    surfaces = WorkerSurfaces(surface)
    ref = ShellActor.start(
        name=name,
        session=session,
        desk=desk,
        notice_sink=publish,
        context=context,
        snapshot=snapshot,
        eval_root=root,
        limits=limits,
        surfaces=surfaces,
        sync_log=sync_log,
        host_start=host_start,
    )
    return ShellParts(root, ref.proxy(), surfaces)


def run_agent_shell(agent: Agent, commits: Path, script: str) -> ShellOutput:
    """One ral call in ``agent``'s shell, digested as the model sees it; a clean call's
    ``Commit`` record goes to ``commits``, the agent's own file (``SessionDir.commits``)."""
    with durability.each_acknowledged():  # a spawn's journal record is acknowledged before
        result = agent.await_run(run_call(agent.shell, script, agent.turn))  # its child runs
    if result.error is None and not result.rolled_back:  # drills: what this call committed
        pid = result.host_pid if result.host_pid is not None else agent.shell_pid()
        append_jsonl(commits, commit_record(agent.name, result, pid))
    notes: list[str] = []  # a rollback already says so in its error text
    content = digest_tool_result(
        result.value if result.error is None else None,
        result.stdout,
        result.stderr,
        result.error,
        notes,
    )
    return ShellOutput(
        content,
        result.error is not None or result.rolled_back,
        notices=result.notices,
        defined=result.defined,
    )


def stop_agent_shell(name: str, shell: Any) -> None:
    """Close and stop one shell actor; any failure but "already stopped" is logged, and the
    stop is still attempted. A stopped actor (closed at its agent's end, ``_end_shell``) has
    nothing left to close: two asks refused with ``ActorDeadError`` cost more than its end."""
    if not shell.actor_ref.is_alive():
        return
    try:
        shell.close().get(timeout=10.0)
    except pykka.ActorDeadError:
        pass
    except Exception:
        log.exception("closing %s's shell failed", name)
    try:
        shell.actor_ref.stop(block=True, timeout=5.0)
    except pykka.ActorDeadError:
        pass
    except Exception:
        log.exception("stopping %s's shell actor failed", name)


def agent_resources(
    agent: Agent,
    session: SessionDir,
    disk_ceiling: int | None,
    lease: dict[str, Any],
) -> Resources:
    """The probe fold for ``/resources``: read-only, renews nothing, never model-facing."""
    probe = agent.shell.probe().get()
    figures = ResourceFigures(
        workers={
            "running": probe.running_workers,
            "settled": probe.settled_workers,
            "nearest_reap_calls": probe.nearest_worker_reap_calls,
            "nearest_backstop_secs": probe.nearest_worker_backstop_secs,
        },
        ledger={
            "armed": True,
            "live": probe.live_bindings,
            "baseline": probe.baseline_bindings,
            "pinned": probe.pinned_bindings,
            "nearest_expiry_calls": probe.nearest_binding_expiry_calls,
            "bytes_held": probe.bytes_held,
        },
        inbox_depths=agent.inbox.depths(),
        event_count=agent.log.event_count,
        history_bytes=agent.log.history_bytes,
        disk=disk_usage(  # the scratch lives inside the log dir: each byte counted once
            {"log dir": session.root, "scratch": session.scratch(agent.name)}
        ),
        disk_ceiling=disk_ceiling,
        lease_nearest_reap_secs=lease.get("nearest_reap_secs"),
        lease_demote_secs=lease.get("bound_secs"),
        spend=agent.stats.spend.read().to_json(),
        prices_date=agent.site.prices().date,
        traffic=lease.get("traffic"),
        sandbox=sandbox_line(agent.spec.context),
    )
    rows, card = resources(figures, title=f"resources of {agent.name}")
    return Resources(agent.name, rows=event_rows(rows), card=card)


def sandbox_line(context: DynamicContext | None) -> str | None:
    """What confinement the agent's shell is in, one line (None when its context is not
    known here)."""
    if context is None:
        return None
    sandbox = context.sandbox or Sandbox()
    return sandbox.describe()


class WorkerCount:
    """A shell's running-worker count as of its last answered probe, for live views.

    The shell actor answers between ral calls, so the figure can lag a long call; at most one
    probe is outstanding, so a busy shell's mailbox never fills with them, and :meth:`read`
    never waits. Display only: a shell that is gone keeps its last figure.

    No probe is asked of a shell that is evaluating (``busy``): it would wait behind the call,
    and a cancel of that call then found the actor's mailbox not empty, so the agent's end
    closed the shell through the mailbox and waited there for the killed host's exit instead
    of reaping it after its report (:meth:`actors.shell.ShellActor.end_here`): with the fleet
    view (or the benchmark's wait for busy shells) polling, 57 of 100 cancelled agents ended
    that way, each end's wall ~84 ms in the cascade's window."""

    def __init__(self) -> None:
        self._future: Any = None
        self._last: int | None = None

    def read(self, shell: Any, *, busy: bool = False) -> int | None:
        """The last answered count; asks for a new one unless one is outstanding or the shell
        is ``busy`` evaluating a call."""
        future = self._future
        if future is None:
            if busy:
                return self._last
            try:
                self._future = shell.probe()
            except Exception:  # the shell is gone
                pass
            return self._last
        try:
            probe = future.get(timeout=0)
        except pykka.Timeout:  # not answered yet: keep the last figure
            return self._last
        except Exception:  # the shell is gone
            probe = None
        self._future = None
        if probe is not None:
            self._last = int(probe.running_workers)
        return self._last
