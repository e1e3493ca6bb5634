"""The two threads between the fleet and the UI thread.

- :class:`Bridge` (fleet → UI): drains a bus subscription and tails every agent's event log,
  turns both into :mod:`cli.tui.model` changes, samples each agent's status, and posts one
  :class:`FleetUpdate` per pass. It reads only what is safe to read from any thread (the
  subscription, the log files, inbox depths under their own lock, plain stats fields), and asks a
  shell for its worker figures with at most one probe outstanding per agent, never waiting on it.
  An agent in its own process (``--agents process``) is asked for the same figures over its
  channel (:meth:`actors.agent_process.ProcessAgent.live`), which its process answers at once.
- :class:`Control` (UI → fleet): one FIFO thread that runs every call that could wait —
  ``steer``, a slash ``Command`` push, ``interrupt``, starting the trunk, the quit sequence — so
  the UI thread never blocks on a registry or actor call. Results come back as
  :class:`ControlResult`.

Both post with :meth:`textual.message_pump.MessagePump.post_message`, which is thread-safe and
never blocks. ``App.call_from_thread`` would block the poster until the UI loop runs the
callback, and waits forever if the loop stops first (``asyncio.run_coroutine_threadsafe`` on a
loop that never runs it again); a bridge stuck that way could never be joined.

Neither thread renews a lease on its own: the only lease renewal is :meth:`Control.send` of a
plain line, which is a human message (``registry.steer``). Focus changes never reach either.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from textual.message import Message

from exarch_actors.actors.agent import Agent
from exarch_actors.actors.agent_process import ProcessAgent
from exarch_actors.actors.agent_process_host import LiveFigures
from exarch_actors.actors.agent_shell import WorkerCount
from exarch_actors.actors.slash_commands import REFUSED
from exarch_actors.cli.tui.model import Change, LogTail, Transcript
from exarch_actors.runtime.errors import ExarchError, InboxFull
from exarch_actors.runtime.events import Born, Died, Event, InboxRejected, Notice, ProviderFailed
from exarch_actors.runtime.fleet.inbox import Command

if TYPE_CHECKING:
    from textual.app import App

    from exarch_actors.actors.fleet import Fleet

POLL_SECS = 0.05
"""Bus wait per pass: a reply shows within ~50 ms of reaching the bus or the log."""

STATUS_SECS = 0.25
"""How often the status figures are sampled (4 Hz is plenty for a human-read status line)."""

Role = Literal["trunk", "branch", "sub"]


@dataclass(frozen=True)
class TabInfo:
    """A tab to open: who, under whom, and whether a human may write to it."""

    name: str
    parent: str | None
    role: Role

    @property
    def writable(self) -> bool:
        return self.role != "sub"


@dataclass(frozen=True)
class AgentStatus:
    """One agent's status-line figures, sampled on the bridge thread."""

    name: str
    state: str
    model: str
    used_tokens: int | None
    window: int | None
    inbox: int
    running_workers: int | None
    sub_agents: int
    """Live returning descendants (delegated work)."""
    branches: int
    """Live conversing descendants (``/branch`` tabs)."""
    turns: int
    ral_calls: int


@dataclass
class _Batch:
    born: list[TabInfo] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    died: list[tuple[str, str]] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    status: dict[str, AgentStatus] | None = None

    def __bool__(self) -> bool:
        return bool(self.born or self.changes or self.died or self.alerts or self.status)


class FleetUpdate(Message):
    """One bridge pass: tabs born, transcript changes, tabs ended, error-line alerts, status."""

    def __init__(self, batch: _Batch) -> None:
        super().__init__()
        self.born = batch.born
        self.changes = batch.changes
        self.died = batch.died
        self.alerts = batch.alerts
        self.status = batch.status


class ControlResult(Message):
    """What a control call came to: an error for the error line, or a short info line."""

    def __init__(self, text: str, *, error: bool) -> None:
        super().__init__()
        self.text = text
        self.error = error


class FleetClosed(Message):
    """The quit sequence finished: every agent cancelled and every process reaped."""


def post(app: App[Any], message: Message) -> None:
    """Post to the app from any thread; a closed app drops it (nothing is left to show it)."""
    try:
        app.post_message(message)
    except RuntimeError:  # the loop is already closed
        pass


class Bridge:
    """Fleet → UI. Subscribe with :meth:`start` *before* the trunk is started."""

    def __init__(self, fleet: Fleet, app: App[Any]) -> None:
        self.fleet = fleet
        self.app = app
        self._sub = fleet.bus.subscribe(name="chat-ui")
        self._views: dict[str, Transcript] = {}
        self._roles: dict[str, Role] = {}
        self._tails: dict[str, LogTail] = {}
        self._workers: dict[str, WorkerCount] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chat-bridge", daemon=True)

    @property
    def missed(self) -> int:
        """Bus events this view was handed only as an Overflow count (a /resources row)."""
        return self._sub.missed_total

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._sub.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        for tail in self._tails.values():
            tail.close()
        self._tails.clear()
        try:
            self.fleet.bus.unsubscribe(self._sub)
        except Exception:
            pass

    # --- the pass ------------------------------------------------------------------------

    def _run(self) -> None:
        last_status = 0.0
        while not self._stop.is_set():
            first = self._sub.get(timeout=POLL_SECS)
            events = ([first] if first is not None else []) + self._sub.drain()
            batch = _Batch()
            for ev in events:
                self._on_event(ev, batch)
            for name in list(self._tails):
                self._catch_up(name, batch)
            now = time.monotonic()
            if now - last_status >= STATUS_SECS:
                last_status = now
                batch.status = self._sample()
            if batch and not self._stop.is_set():
                post(self.app, FleetUpdate(batch))

    def _on_event(self, ev: Event, batch: _Batch) -> None:
        if isinstance(ev, Born):
            role: Role = "trunk" if ev.parent is None else "branch" if ev.interactive else "sub"
            self._roles[ev.agent] = role
            self._views[ev.agent] = Transcript(
                ev.agent,
                inherited_before=ev.at if role == "branch" else None,
                inherited_from=ev.parent,
                task_from=ev.parent if role == "sub" else None,
            )
            self._tails[ev.agent] = LogTail(self.fleet.session.events(ev.agent))
            batch.born.append(TabInfo(ev.agent, ev.parent, role))
            self._catch_up(ev.agent, batch)
            return
        if isinstance(ev, Notice) and ev.notice == REFUSED:
            # A refused slash command is the human's own mistake: the error line, not the tab.
            batch.alerts.append(f"{ev.agent}: {ev.text}")
            return
        existing = self._views.get(ev.agent)
        if existing is None:
            if isinstance(ev, ProviderFailed | InboxRejected):
                batch.alerts.append(f"{ev.agent}: {getattr(ev, 'message', '') or ev.kind}")
            return
        self._catch_up(ev.agent, batch)  # the ordering rule of cli.tui.model
        batch.changes.extend(existing.on_event(ev))
        if isinstance(ev, ProviderFailed):
            batch.alerts.append(f"{ev.agent}: provider error ({ev.error}): {ev.message}")
        elif isinstance(ev, InboxRejected):
            batch.alerts.append(f"{ev.agent}: undelivered {ev.source} message: {ev.reason}")
        elif isinstance(ev, Died):
            tail = self._tails.pop(ev.agent, None)
            if tail is not None:
                tail.close()
            self._workers.pop(ev.agent, None)
            batch.died.append((ev.agent, ev.outcome))

    def _catch_up(self, name: str, batch: _Batch) -> None:
        tail = self._tails.get(name)
        view = self._views.get(name)
        if tail is None or view is None:
            return
        for rec in tail.read():
            batch.changes.extend(view.on_record(rec))

    # --- status --------------------------------------------------------------------------

    def _sample(self) -> dict[str, AgentStatus]:
        out: dict[str, AgentStatus] = {}
        registry = self.fleet.registry
        for name, agent in list(self.fleet.hosted.items()):
            if name not in self._tails:
                continue  # ended (or not yet born on this view)
            try:
                figures = live_figures(agent, self._workers.setdefault(name, WorkerCount()))
                inbox = sum(agent.inbox.depths().values())
                below = registry.live_descendants(name)
            except ExarchError:
                continue
            if figures is None:
                continue
            branches = sum(1 for n in below if self._roles.get(n) == "branch")
            out[name] = AgentStatus(
                name=name,
                state=figures.state,
                model=figures.model,
                used_tokens=figures.used_tokens,
                window=figures.window,
                inbox=inbox,
                running_workers=figures.running_workers,
                sub_agents=len(below) - branches,
                branches=branches,
                turns=figures.stats.turns,
                ral_calls=figures.stats.ral_calls,
            )
        return out


def live_figures(agent: Agent | ProcessAgent, workers: WorkerCount) -> LiveFigures | None:
    """An agent's live figures wherever it runs: read here from a thread-backend agent,
    asked of its process for an agent process (which counts its shell's workers itself); None
    once that process is gone."""
    if isinstance(agent, ProcessAgent):
        return agent.live()
    provider = agent.provider.current()
    return LiveFigures(
        state=agent.stats.state,
        model=provider.describe(),
        used_tokens=agent.log.used_tokens,
        window=provider.window_tokens,
        running_workers=workers.read(agent.shell, busy=agent.eval_root.busy),
        running_eval=agent.eval_root.busy,
        stats=agent.stats,
    )


def _state(fleet: Fleet, name: str) -> str | None:
    """``name``'s drive state now (``working``, ``idle``, ...), wherever it runs; None when it
    is not (or no longer) an agent of this fleet."""
    agent = fleet.hosted.get(name)
    if isinstance(agent, ProcessAgent):
        figures = agent.live()
        return figures.state if figures is not None else None
    return agent.stats.state if agent is not None else None


class Control:
    """UI → fleet, one call at a time in arrival order, on a thread of its own."""

    def __init__(self, fleet: Fleet, app: App[Any]) -> None:
        self.fleet = fleet
        self.app = app
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="chat-control", daemon=True)
        self._closed = False
        self._close_lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=15.0)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as e:  # a bug in one call must not take the lane down
                self._error(f"{type(e).__name__}: {e}")

    def _error(self, text: str) -> None:
        post(self.app, ControlResult(text, error=True))

    def _info(self, text: str) -> None:
        post(self.app, ControlResult(text, error=False))

    # --- the calls -----------------------------------------------------------------------

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def send(self, name: str, text: str) -> None:
        """A typed line for ``name``: a slash line as a ``Command``, else a human message."""
        self.submit(lambda: self._send(name, text))

    def _send(self, name: str, text: str) -> None:
        entry = self.fleet.registry.lookup(name)
        if entry is None:
            self._error(f"{name} has ended; nothing was sent")
            return
        try:
            if text.startswith("/"):
                entry.inbox.push(Command(text))
            else:
                self.fleet.registry.steer(name, text)
        except InboxFull as full:
            what = text.split()[0] if text.startswith("/") else "message"
            self._error(f"{what} rejected: {full}")
            return
        except ExarchError as e:
            self._error(f"not sent to {name}: {e}")
            return
        if _state(self.fleet, name) == "working":
            when = "at its next turn boundary" if text.startswith("/") else "after its tool calls"
            self._info(f"queued for {name}: it reads this {when}")

    def interrupt(self, name: str, *, hint: str = "") -> None:
        """Esc / Ctrl-C: stop ``name``'s current turn only; its descendants keep running."""
        self.submit(lambda: self._interrupt(name, hint))

    def _interrupt(self, name: str, hint: str) -> None:
        state = _state(self.fleet, name)
        if state is not None and state != "working":
            # No turn to stop: an idle agent's turn scope, tripped now, would only sit until
            # the next turn boundary replaced it. Read racily, like the status line: a turn that
            # starts just after this read is not one the human saw running.
            self._info(f"{name} is {state}: no turn to interrupt{hint}")
            return
        try:
            self.fleet.registry.interrupt(name)
        except ExarchError as e:
            self._error(f"cannot interrupt {name}: {e}{hint}")
            return
        self._info(f"interrupted {name}'s turn (its sub-agents keep running){hint}")

    def start_trunk(self, start: Callable[[Fleet], Any]) -> None:
        def job() -> None:
            try:
                start(self.fleet)
            except Exception as e:
                self._error(f"the trunk could not start: {type(e).__name__}: {e}")

        self.submit(job)

    def quit(self, cause: str = "quit") -> None:
        """Cancel every agent, close the fleet (every process reaped), then post FleetClosed."""

        def job() -> None:
            self.close_fleet(cause)
            post(self.app, FleetClosed())

        self.submit(job)

    def close_fleet(self, cause: str = "quit") -> None:
        """Idempotent and callable from any thread but the UI's: it waits for the fleet."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.fleet.cancel_all(cause)
            finally:
                self.fleet.close()

    @property
    def closed(self) -> bool:
        with self._close_lock:
            return self._closed
