"""The chat app: one tab per live agent, an input box, a status line and an error line.

Rules:

- **Tab focus is presentation only.** The focused agent is a name local to this app; switching
  tabs calls nothing in the fleet, so it never renews a lease and never changes who may reply.
- **Enter** sends the line to the focused agent: a plain line is a human message
  (``registry.steer``, the only lease renewal), a ``/`` line is a ``Command`` pushed into its
  inbox and run at its turn boundary; a full inbox's rejection shows on the error line.
  ``/quit`` is the one command the app runs itself, at once, like Ctrl-C twice.
- **Esc** and a first **Ctrl-C** interrupt the focused agent's current turn only
  (``registry.interrupt``); its descendants keep running. A second Ctrl-C within
  :data:`QUIT_WINDOW_SECS` quits: every agent cancelled, the fleet closed, every process reaped.
- Sub-agents get read-only tabs so their work can be watched; a tab whose agent died stays,
  marked ended, until the app exits.
- The UI thread never waits on the fleet: calls go through :class:`cli.tui.bridge.Control`,
  figures come from :class:`cli.tui.bridge.Bridge`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Input, TabbedContent, TabPane

from exarch_actors.cli.tui.bridge import (
    AgentStatus,
    Bridge,
    Control,
    ControlResult,
    FleetClosed,
    FleetUpdate,
    TabInfo,
)
from exarch_actors.cli.tui.model import Append, Change, TabItem
from exarch_actors.cli.tui.widgets import ErrorLine, StatusLine, TranscriptView, status_text

if TYPE_CHECKING:
    from exarch_actors.actors.fleet import Fleet

QUIT_WINDOW_SECS = 2.0
"""A second Ctrl-C within this many seconds of the first quits."""

INFO_SECS = 6.0
"""An info line (what just happened) leaves the error line after this long; an error stays
until the human's next action (a line sent, Esc, Ctrl-C, another tab shown)."""

_GLYPH = {"trunk": "●", "branch": "⎇", "sub": "◦"}

_HINTS = {
    "trunk": (
        "You are talking to {name}; it waits for you between turns. Enter sends (typing while "
        "it works steers it after its current tool calls). Esc interrupts its turn, Ctrl-N / "
        "Ctrl-P switch tabs, Ctrl-C twice quits."
    ),
    "branch": "{name}: a conversing branch of {parent}, with its context and authority.",
    "sub": "{name}: a sub-agent of {parent}. This tab is read-only: watch its work here.",
}


class ChatApp(App[None]):
    """The interactive frontend over one :class:`actors.fleet.Fleet`.

    ``start`` is called once on the control thread after the bus subscription exists (so the
    trunk's ``Born`` is seen); the app owns the fleet's end: quitting closes it.
    """

    TITLE = "exarch-actors chat"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    TabbedContent { height: 1fr; }
    TabPane { padding: 0; }
    Input { dock: bottom; margin: 0 0 1 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "interrupt", "Interrupt turn", priority=True),
        Binding("ctrl+c", "ctrl_c", "Interrupt · twice: quit", priority=True),
        Binding("ctrl+n", "next_tab", "Next tab", priority=True),
        Binding("ctrl+p", "prev_tab", "Prev tab", priority=True),
        Binding("ctrl+q", "quit_fleet", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        fleet: Fleet,
        *,
        start: Callable[[Fleet], Any] | None = None,
        intro: str | None = None,
        quit_window: float = QUIT_WINDOW_SECS,
        info_secs: float = INFO_SECS,
    ) -> None:
        from exarch_actors.actors.process import ensure_fork_server

        # Before textual swaps sys.stderr for its capture object (fileno -1): multiprocessing's
        # resource tracker passes stderr's fd to its child and fails on -1.
        ensure_fork_server()
        super().__init__()
        self.fleet = fleet
        self._start = start
        self.intro = intro
        """A note for the trunk's tab, under its hint (what the command chose for the human)."""
        self.quit_window = quit_window
        self.info_secs = info_secs
        self._shown = 0
        """How many lines the error line has shown: a fade timer clears only its own line."""
        self.bridge = Bridge(fleet, self)
        self.control = Control(fleet, self)
        self.tabs: dict[str, TabInfo] = {}
        self.ended: dict[str, str] = {}
        self.status: dict[str, AgentStatus] = {}
        self.views: dict[str, TranscriptView] = {}
        self._panes: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._labels: dict[str, str] = {}
        self.focused_agent: str | None = None
        """The agent whose tab is shown: presentation only, never read by the fleet."""
        self._last_ctrl_c: float | None = None
        self.quitting = False

    # --- layout and lifecycle ------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield TabbedContent(id="tabs")
        yield StatusLine(id="status")
        yield ErrorLine(id="error")
        yield Input(placeholder="starting…", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.bridge.start()
        self.control.start()
        if self._start is not None:
            self.control.start_trunk(self._start)
        self.query_one(Input).focus()

    def on_unmount(self) -> None:
        self.bridge.stop()
        self.control.stop()

    # --- what the tests and the status line read -----------------------------------------

    def transcript_text(self, name: str) -> str:
        view = self.views.get(name)
        return "" if view is None else view.plain_text()

    def entries(self, name: str) -> list[TabItem]:
        view = self.views.get(name)
        return [] if view is None else view.entries()

    @property
    def error_text(self) -> str:
        line = self.query_one(ErrorLine)
        return line.text if line.is_error else ""

    @property
    def info_text(self) -> str:
        return self.query_one(ErrorLine).text

    @property
    def status_line(self) -> str:
        return str(self.query_one(StatusLine).render())

    # --- fleet → screen ------------------------------------------------------------------

    async def on_fleet_update(self, msg: FleetUpdate) -> None:
        found = self.query(TabbedContent)
        if not found:  # a batch that arrives while the screen is torn down (quit) has no view
            return
        tabbed = found.first()
        for info in msg.born:
            await self._open_tab(tabbed, info)
        by_agent: dict[str, list[Change]] = {}
        for change in msg.changes:
            if isinstance(change, Append) and change.entry.kind == "resources":
                change = Append(change.agent, self._with_frontend_rows(change.agent, change.entry))
            by_agent.setdefault(change.agent, []).append(change)
        for name, changes in by_agent.items():
            view = self.views.get(name)
            if view is not None:
                view.apply(changes)
        for name, outcome in msg.died:
            self.ended[name] = outcome
            self.status.pop(name, None)
        for alert in msg.alerts:
            self._show(alert, error=True)
        if msg.status is not None:
            self.status = msg.status
        self._refresh_labels(tabbed)
        self._refresh_status()
        trunk = next((n for n, t in self.tabs.items() if t.role == "trunk"), None)
        if trunk is not None and trunk in self.ended and not self.quitting:
            self._begin_quit(f"the trunk ended ({self.ended[trunk]}); closing the fleet…")

    async def _open_tab(self, tabbed: TabbedContent, info: TabInfo) -> None:
        if info.name in self.tabs:
            return
        pane_id = f"agent-{len(self._panes) + 1}"
        self.tabs[info.name] = info
        self._panes[info.name] = pane_id
        self._names[pane_id] = info.name
        view = TranscriptView(info.name)
        self.views[info.name] = view
        hint = _HINTS[info.role].format(name=info.name, parent=info.parent)
        view.apply([Append(info.name, TabItem("hint", "note", hint))])
        if info.role == "trunk" and self.intro:
            view.apply([Append(info.name, TabItem("intro", "note", self.intro))])
        label = self._label(info.name)
        self._labels[info.name] = label
        await tabbed.add_pane(TabPane(label, view, id=pane_id))
        # A branch the human just made from the focused tab is where they want to be; a
        # sub-agent's tab never steals focus.
        if self.focused_agent is None or (
            info.role == "branch" and info.parent == self.focused_agent
        ):
            tabbed.active = pane_id
            self._set_focus(info.name)

    def _with_frontend_rows(self, agent: str, entry: TabItem) -> TabItem:
        """Rows for what the frontend itself owns, appended at render time (probe-convention)."""
        rows = (
            f"  ui.tabs {len(self.tabs)}  ·  ui.entries {len(self.entries(agent))}"
            f"  ·  ui.bus_missed {self.bridge.missed}"
        )
        return TabItem(entry.key, entry.kind, f"{entry.text}\n{rows}")

    def _label(self, name: str) -> str:
        info = self.tabs[name]
        if name in self.ended:
            return f"✗ {name}"
        status = self.status.get(name)
        busy = " …" if status is not None and status.state == "working" else ""
        suffix = " (watch)" if info.role == "sub" else ""
        return f"{_GLYPH[info.role]} {name}{suffix}{busy}"

    def _refresh_labels(self, tabbed: TabbedContent) -> None:
        for name, pane_id in self._panes.items():
            label = self._label(name)
            if self._labels.get(name) != label:
                self._labels[name] = label
                try:
                    tabbed.get_tab(pane_id).label = label
                except Exception:  # the tab was removed since: nothing left to label
                    pass

    def _refresh_status(self) -> None:
        name = self.focused_agent
        found = self.query(StatusLine)
        if not found:  # the screen is being torn down (quit) while a batch still arrives
            return
        line = found.first()
        if name is None:
            line.update(Text(" starting…"))
            return
        info = self.tabs.get(name)
        line.update(
            status_text(
                self.status.get(name),
                name,
                ended=self.ended.get(name),
                role=info.role if info else "sub",
            )
        )
        prompt = self.query_one(Input)
        if name in self.ended:
            prompt.placeholder = f"{name} has ended — Ctrl-N / Ctrl-P for another tab"
        elif info is not None and not info.writable:
            prompt.placeholder = f"{name} is a sub-agent: read-only, watch only — Esc interrupts"
        else:
            prompt.placeholder = (
                f"message {name}  ·  /branch /clear /compact /model NAME /resources /close /quit"
            )

    def _show(self, text: str, *, error: bool) -> None:
        found = self.query(ErrorLine)
        if not found:
            return
        found.first().show(text, error=error)
        self._shown += 1
        if not error:
            shown = self._shown
            self.set_timer(self.info_secs, lambda: self._clear_line(only=shown))

    def _clear_line(self, only: int | None = None) -> None:
        """Empty the error line: at the human's next action, or (``only``) when that info
        line's fade is due and nothing has replaced it since."""
        if only is not None and only != self._shown:
            return
        found = self.query(ErrorLine)
        if found and found.first().text:
            found.first().show("", error=False)

    def on_control_result(self, msg: ControlResult) -> None:
        self._show(msg.text, error=msg.error)

    def on_fleet_closed(self, _: FleetClosed) -> None:
        self.exit()

    # --- focus (presentation only) -------------------------------------------------------

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        pane_id = event.pane.id
        if pane_id is not None and pane_id in self._names:
            self._set_focus(self._names[pane_id])

    def _set_focus(self, name: str) -> None:
        if name != self.focused_agent:
            self._clear_line()  # what the line said was about what the human did before
        self.focused_agent = name
        self._refresh_status()

    def _cycle(self, step: int) -> None:
        if not self._panes:
            return
        order = list(self._panes)
        i = order.index(self.focused_agent) if self.focused_agent in order else 0
        name = order[(i + step) % len(order)]
        self.query_one(TabbedContent).active = self._panes[name]
        self._set_focus(name)

    def action_next_tab(self) -> None:
        self._cycle(1)

    def action_prev_tab(self) -> None:
        self._cycle(-1)

    # --- screen → fleet ------------------------------------------------------------------

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        event.input.value = ""
        if not text:
            return
        self._clear_line()
        if text == "/quit":
            self.action_quit_fleet()
            return
        name = self.focused_agent
        if name is None:
            self._show("no agent yet: the trunk is starting", error=True)
            return
        if name in self.ended:
            self._show(f"{name} has ended; nothing was sent", error=True)
            return
        if not self.tabs[name].writable:
            self._show(f"{name} is a sub-agent: its tab is read-only", error=True)
            return
        self.control.send(name, text)

    def action_interrupt(self) -> None:
        self._interrupt_focused()

    def _interrupt_focused(self, hint: str = "") -> None:
        self._clear_line()
        name = self.focused_agent
        if name is None:
            self._show(f"the trunk is starting: nothing to interrupt yet{hint}", error=False)
            return
        if name in self.ended:
            self._show(f"{name} has ended: nothing to interrupt{hint}", error=False)
            return
        self.control.interrupt(name, hint=hint)

    def action_ctrl_c(self) -> None:
        now = time.monotonic()
        if self._last_ctrl_c is not None and now - self._last_ctrl_c <= self.quit_window:
            self.action_quit_fleet()
            return
        self._last_ctrl_c = now
        self._interrupt_focused(f"  —  Ctrl-C again within {self.quit_window:g} s quits")

    def action_quit_fleet(self) -> None:
        self._begin_quit("quitting: cancelling every agent and reaping every process…")

    def _begin_quit(self, text: str) -> None:
        if self.quitting:
            return
        self.quitting = True
        self._show(text, error=False)
        self.query_one(Input).disabled = True
        self.control.quit("quit")
