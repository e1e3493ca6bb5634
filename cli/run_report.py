"""What a running command shows while its fleet runs and when it ends (``run``, ``fleet``,
``resume``): one :class:`RunReporter`, so the three commands say the same things the same way.

Order of output, and why:

1. ``session: PATH`` on stderr, first: where to look is known before anything can go wrong.
2. While the fleet runs, on a terminal (stdout *and* stderr both; off a terminal a log would
   fill with redraws), a live status drawn with rich's ``Live``: one line per agent with its
   state, turn, ral calls, tokens so far (with the prompt-cache reads and writes), its cost in
   dollars (``$?`` while unknown: no usage reported, or no price for the model) and its last
   call (``✗`` when it failed, or the provider's ``retrying: ...`` while a request is being
   retried). ``fleet`` draws the same lines as a spawn tree.
3. As they happen, the trunk's ral errors (``ral error (trunk): ...``) and the trunk's runtime
   notes (``note (trunk): ...``): a run that ends ``quiesced`` after a failed call says why.
4. At the end: ``outcome: X``; ``error: ...`` when the trunk did not reply and has a reason
   (the budget reached, for outcome ``budget``; else its last provider error — ``connection
   refused``, ``HTTP 401`` — else its last runtime note); then the reply on stdout. A trunk
   that ended with text but never called ``reply`` (a real model that ignored the nudges) gets
   that text printed, with a note on stderr, rather than nothing; a cancelled run (Ctrl-C)
   prints nothing on stdout, its last text going to stderr under a note.

``--quiet`` keeps only the reply (or that last text) and the ``error``/note lines; ``--json``
prints exactly one JSON object on stdout and, on stderr, what ``--quiet`` keeps -- a run a full
disk stops too (:meth:`RunReporter.stopped_json`: outcome ``failed``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from exarch_actors.cli.runner import session_path
from exarch_actors.runtime.constants import TRUNK_NAME
from exarch_actors.runtime.events import Event, Io, ProviderFailed, SystemNote
from exarch_actors.runtime.messages import EMPTY_REPLY_STUB, AssistantMessage
from exarch_actors.runtime.settlement.cost import show
from exarch_actors.runtime.state.disk_full import DiskFull
from exarch_actors.runtime.state.eventlog import AgentLog
from exarch_actors.runtime.state.session_dir import SessionDir

STATE_STYLE = {
    "working": "bold yellow",
    "idle": "cyan",
    "replied": "green",
    "quiesced": "green",
    "cancelled": "magenta",
    "failed": "red",
    "capped": "red",
    "starting": "dim",
}

MAX_LINES = 24
"""Agent lines drawn at most; a wide fan-out shows ``... and N more agents``."""

CLIP = 60
"""Characters of a script shown in a status line (its first line only)."""

ERROR_LINES = 3
"""Lines of a ral error's text printed on stderr (its head: position and message)."""

NO_REPLY_NOTE = "note: the trunk ended without calling `reply`; its last text was:"
CANCELLED_NOTE = "note: cancelled before a reply (stdout stays empty); the trunk's last text was:"


def clip_first_line(text: str, limit: int = CLIP) -> str:
    first, _, rest = text.strip().partition("\n")
    return first[: limit - 1] + "…" if len(first) > limit or rest else first


@dataclass(frozen=True)
class LastCall:
    script: str
    failed: bool


class RunReporter:
    """A :class:`cli.runner.RunObserver` that prints (see the module docstring)."""

    def __init__(
        self,
        *,
        as_json: bool = False,
        quiet: bool = False,
        live: bool = True,
        view: Callable[[RunReporter], RenderableType] | None = None,
        keep_view: bool = False,
    ) -> None:
        """``keep_view``: leave the last frame on screen (``fleet``'s tree) instead of clearing
        the status when the run ends (``run``: its outcome and reply follow)."""
        self.as_json = as_json
        self.keep_view = keep_view
        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False)
        self.show_live = (
            live
            and not self.silent
            and self.console.is_terminal
            and sys.stdout.isatty()
            and sys.stderr.isatty()
        )
        self.view = view or agent_lines
        self.fleet: Any = None
        self.calls: dict[str, LastCall] = {}
        self.provider_errors: dict[str, str] = {}
        self.notes: dict[str, str] = {}
        self._sub: Any = None
        self._live: Live | None = None

    @property
    def silent(self) -> bool:
        """``--quiet`` or ``--json``: no progress, only the reply and the errors."""
        return self.as_json or self.quiet

    @property
    def trunk_name(self) -> str:
        trunk = getattr(self.fleet, "trunk", None)
        return trunk.name if trunk is not None else TRUNK_NAME

    # --- the RunObserver protocol -------------------------------------------------------------

    def attach(self, fleet: Any) -> None:
        self.fleet = fleet
        self._sub = fleet.bus.subscribe(name="run-report")
        if not self.silent:
            self.say(f"session: {session_path(fleet.session)}")
        if self.show_live:
            self._live = Live(
                get_renderable=lambda: self.view(self),
                console=self.console,
                refresh_per_second=4,
                transient=not self.keep_view,
            )
            self._live.start()

    def tick(self) -> None:
        if self._sub is None:
            return
        for event in self._sub.drain():
            self._see(event)

    def detach(self) -> None:
        self.tick()  # the fleet has closed: every event is in the buffer
        if self._sub is not None and self.fleet is not None:
            self.fleet.bus.unsubscribe(self._sub)
            self._sub = None
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    # --- events -------------------------------------------------------------------------------

    def _see(self, event: Event) -> None:
        trunk = event.agent == self.trunk_name
        if isinstance(event, Io):
            failed = event.error is not None
            self.calls[event.agent] = LastCall(event.script, failed)
            if trunk and failed and not self.silent:
                self.say(f"ral error ({event.agent}): {ral_error_text(event.value)}")
        elif isinstance(event, ProviderFailed):
            self.provider_errors[event.agent] = event.message
        elif isinstance(event, SystemNote):
            self.notes[event.agent] = event.text
            if trunk and not self.silent:
                self.say(f"note ({event.agent}): {event.text}")

    def say(self, line: str) -> None:
        """One line on stderr; above the live status while it is drawn."""
        if self._live is not None:
            self._live.console.print(Text(line), soft_wrap=True)
        else:
            click.echo(line, err=True)

    # --- the end ------------------------------------------------------------------------------

    def stopped_json(self, err: DiskFull, session: str | os.PathLike[str] | None) -> str:
        """The ``--json`` object of a run a full disk stopped (``cli/exit_guard.py`` prints it
        on stdout as the process ends): outcome ``failed``, the disk-full message as ``error``,
        the file and the space left as ``diskFull``, and ``fleetYield`` null -- nothing was
        settled and no ``result.json`` written; ``resume`` writes both once space is back.
        ``session``: the session's path when no fleet was attached yet. Reads nothing that
        waits (it runs on the thread whose write failed)."""
        root = self.fleet.session.root if self.fleet is not None else session
        record = {
            "outcome": "failed",
            "reply": None,
            "lastText": None,
            "error": str(err),
            "session": None if root is None else str(root),
            "diskFull": {"path": err.path, "freeBytes": err.free_bytes},
            "fleetYield": None,
        }
        return json.dumps(record)

    def error_for(self, outcome: str) -> str | None:
        """Why a trunk that did not reply ended: its last provider error, else (failed or
        capped) its last runtime note."""
        if outcome == "replied":
            return None
        if outcome == "budget" and self.fleet is not None:
            return str(self.fleet.spend.budget_message())
        name = self.trunk_name
        if name in self.provider_errors:
            return self.provider_errors[name]
        if outcome in ("failed", "capped"):
            return self.notes.get(name)
        return None

    def finish(
        self,
        outcome: str,
        reply: str | None,
        session: SessionDir,
        fleet_yield: dict[str, Any],
        **extra: Any,
    ) -> None:
        """Print the end of the run (see the module docstring); ``extra`` joins the JSON."""
        error = self.error_for(outcome)
        reasons: dict[str, int] = fleet_yield.get("byReason") or {}
        failed = sum(n for r, n in reasons.items() if r not in ("replied", "quiesced", "cancelled"))
        if error is None and outcome == "quiesced" and reply is None and failed:
            error = f"the trunk did not reply; {failed} of {sum(reasons.values())} children failed"
        last = trunk_last_text(self.fleet) if reply is None else None
        if self.as_json:
            record = {
                "outcome": outcome,
                "reply": reply,
                "lastText": last,
                "error": error,
                "session": str(session.root),
                **extra,
                "fleetYield": fleet_yield,
            }
            click.echo(json.dumps(record))
        elif not self.quiet:
            click.echo(f"outcome: {outcome}", err=True)
            if reasons:
                counts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
                click.echo(f"children: {counts}", err=True)
            waits = (fleet_yield.get("traffic") or {}).get("waits")
            if waits:
                t = fleet_yield["traffic"]
                click.echo(
                    f"rate limit: {waits} of {t['requests']} requests waited "
                    f"({t['wait_seconds']:.1f}s in all), {t['throttled']} answered 429",
                    err=True,
                )
        if error is not None:
            click.echo(f"error: {error}", err=True)
        if self.as_json:
            return
        if reply is not None:
            click.echo(reply)
        elif last is not None and outcome == "cancelled":
            # a cancelled trunk's last text is what it was saying when stopped, not an answer:
            # after Ctrl-C, `run examples/chat.toml` printed chat-UI text on stdout as a reply
            click.echo(CANCELLED_NOTE, err=True)
            click.echo(last, err=True)
        elif last is not None:
            click.echo(NO_REPLY_NOTE, err=True)
            click.echo(last)


def ral_error_text(value: str) -> str:
    """The head of a digested ral error (``[error]\\n1:9 unknown command ...``), one line."""
    body = value.removeprefix("[error]").strip()
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()][:ERROR_LINES]
    return " / ".join(lines) or "(no message)"


def trunk_last_text(fleet: Any) -> str | None:
    """The trunk's last assistant text, from its log (``None`` without one). The stub that
    admission puts in place of an empty reply is not text the model wrote: it is skipped.
    A trunk that ran in an agent process (``--agents process``) left its log on disk only."""
    trunk = getattr(fleet, "trunk", None)
    if trunk is None:
        return None
    log = getattr(trunk, "log", None)
    if log is None:
        log, _ = AgentLog.load(fleet.session.events(trunk.name))
    for event in reversed(log.events):
        msg = event.message()
        if isinstance(msg, AssistantMessage):
            text = msg.text.strip()
            if text and text != EMPTY_REPLY_STUB:
                return text
    return None


@dataclass(frozen=True)
class AgentView:
    """What a live line shows of one agent, wherever it runs."""

    name: str
    parent: str | None
    stats: Any
    """Its :class:`actors.agent.AgentStats`: live for a thread; for an agent process, as its
    process reads them now (one round trip on its channel), or as of its end."""


def live_agents(fleet: Any) -> dict[str, AgentView]:
    """Every live agent of ``fleet`` in spawn order, threads and agent processes alike."""
    out: dict[str, AgentView] = {}
    for name, agent in list(dict(fleet.hosted).items()):
        stats = agent.stats
        live = getattr(agent, "live", None)  # an agent process: ask it
        if live is not None and not agent.done.is_set():
            figures = live()
            stats = figures.stats if figures is not None else stats
        out[name] = AgentView(name, agent.parent, stats)
    return out


def agent_line(report: RunReporter, agent: Any) -> Text:
    """``name state · turn N · N calls · N tok · last: SCRIPT`` for one agent."""
    s = agent.stats
    line = Text()
    line.append(agent.name, style="bold")
    line.append(" ")
    line.append(s.state, style=STATE_STYLE.get(s.state, ""))
    tokens = f"{s.input_tokens + s.output_tokens} tok" if s.tokens_known else "tok ?"
    money = s.spend.read()
    if money.cache_read or money.cache_write:
        tokens += f" (cache r {money.cache_read} w {money.cache_write})"
    calls = f"{s.ral_calls} call" + ("" if s.ral_calls == 1 else "s")
    line.append(f" · turn {s.turns} · {calls} · {tokens} · {show(money.cost)}")
    flight = s.in_flight  # replaced, never shrunk, by the agent's thread: a stable reference
    latest = flight[-1] if flight else None
    call = report.calls.get(agent.name)
    if isinstance(latest, dict) and latest.get("event") == "rate_wait" and not latest.get("waited"):
        since = float(latest.get("since") or time.time())
        line.append(
            f" · waiting for the rate limit ({max(0.0, time.time() - since):.0f}s)",
            style="yellow",
        )
    elif isinstance(latest, dict) and latest.get("event") == "stream_reset":
        line.append(
            f" · retrying: {clip_first_line(str(latest.get('reason', '')))}", style="yellow"
        )
    elif call is not None and call.failed:
        line.append(" · last ✗ ", style="red")
        line.append(clip_first_line(call.script))
    elif call is not None:
        line.append(" · last: ")
        line.append(clip_first_line(call.script), style="dim")
    return line


def agent_lines(report: RunReporter) -> RenderableType:
    """The live status of ``run``: one line per agent, in spawn order."""
    agents = list(live_agents(report.fleet).values())
    rows: list[RenderableType] = [agent_line(report, a) for a in agents[:MAX_LINES]]
    if len(agents) > MAX_LINES:
        rows.append(Text(f"… and {len(agents) - MAX_LINES} more agents", style="dim"))
    return Group(*rows)
