"""The chat app's widgets: a tab's transcript, the status line and the error line.

Widgets only render: every figure they show was computed on the bridge thread
(:mod:`cli.tui.bridge`), and none of them calls the fleet.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.panel import Panel
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from exarch_actors.cli.tui.bridge import AgentStatus
from exarch_actors.cli.tui.model import Append, Change, Reset, TabItem, Update

_LABEL_STYLE = {
    "user": ("you", "bold cyan"),
    "steering": ("you (steering)", "bold cyan"),
    "inbound": ("inbox", "bold magenta"),
    "assistant": ("", ""),
}


def render_entry(entry: TabItem, agent: str) -> RenderableType:
    """One entry as rich renders it; user text is never parsed as markup."""
    dim = " dim" if entry.inherited else ""
    if entry.kind in ("user", "steering", "inbound"):
        label, style = _LABEL_STYLE[entry.kind]
        if entry.kind == "user" and entry.speaker:
            label, style = f"task from {entry.speaker}", "bold magenta"
        return Text.assemble((f"{label} › ", style + dim), (entry.text, dim.strip()))
    if entry.kind == "assistant":
        speaker = entry.speaker or agent
        return Text.assemble((f"{speaker} › ", "bold green" + dim), (entry.text, dim.strip()))
    if entry.kind == "ral":
        head = Text.assemble(("  ral ", "bold yellow" + dim), (entry.text, "yellow" + dim))
        if entry.result is None:
            body = Text("    running…", style="italic dim")
        else:
            style = "red" if entry.is_error else "dim"
            body = Text("\n".join("    " + ln for ln in entry.result.split("\n")), style=style)
        return Text.assemble(head, "\n", body)
    if entry.kind == "resources":
        return Panel(Text(entry.text), title="/resources", border_style="blue", expand=False)
    if entry.kind == "error":
        return Text(f"✗ {entry.text}", style="bold red")
    if entry.kind == "ended":
        return Text(f"■ {entry.text}", style="bold magenta")
    if entry.kind in ("cleared", "separator"):
        return Text(f"─── {entry.text} ───", style="bold blue")
    if entry.kind == "compacted":
        return Text(f"⋯ {entry.text}", style="blue")
    return Text(f"· {entry.text}", style="italic dim")


class EntryView(Static):
    """One transcript entry; a ral call's view is updated in place when its result lands."""

    DEFAULT_CSS = """
    EntryView { margin: 0 0 1 0; }
    """

    def __init__(self, entry: TabItem, agent: str) -> None:
        super().__init__(render_entry(entry, agent), classes=entry.kind)
        self.entry = entry
        self.agent = agent

    def set_entry(self, entry: TabItem) -> None:
        self.entry = entry
        self.update(render_entry(entry, self.agent))


class TranscriptView(VerticalScroll):
    """A tab's transcript. Changes that arrive before it is mounted are applied at mount.

    It follows its end while the human has not scrolled up, also while its tab is hidden:
    scrolling a hidden view does nothing (its size is not laid out), so a view that was
    following when hidden scrolls to its end when it is shown again.
    """

    DEFAULT_CSS = """
    TranscriptView { height: 1fr; padding: 0 1; }
    """

    def __init__(self, agent: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.agent = agent
        self._views: dict[str, EntryView] = {}
        self._order: list[str] = []
        self._pending: list[Change] = []
        self._ready = False
        self._follow = True

    def _at_end(self) -> bool:
        return self.max_scroll_y - self.scroll_y <= 2

    def on_hide(self) -> None:
        self._follow = self._at_end()  # the last figures laid out, as the human left them

    def on_show(self) -> None:
        if self._follow:
            self.call_after_refresh(self.scroll_end, animate=False)

    def on_mount(self) -> None:
        self._ready = True
        pending, self._pending = self._pending, []
        self.apply(pending)

    def apply(self, changes: list[Change]) -> None:
        if not self._ready or not self.is_attached:
            self._pending.extend(changes)
            return
        if self.region:  # shown: where the human is now; hidden: where they left it
            self._follow = self._at_end()
        new: list[EntryView] = []
        for change in changes:
            if isinstance(change, Reset):
                for view in new:
                    self._views.pop(view.entry.key, None)
                new = []
                for view in list(self._views.values()):
                    view.remove()
                self._views.clear()
                self._order.clear()
            elif isinstance(change, Append):
                view = EntryView(change.entry, self.agent)
                self._views[change.entry.key] = view
                self._order.append(change.entry.key)
                new.append(view)
            elif isinstance(change, Update):
                existing = self._views.get(change.entry.key)
                if existing is not None:
                    existing.set_entry(change.entry)
        if new:
            self.mount(*new)
        if self._follow:
            self.call_after_refresh(self.scroll_end, animate=False)

    def entries(self) -> list[TabItem]:
        """What the tab shows now, in order (also read by the tests)."""
        return [self._views[k].entry for k in self._order if k in self._views] + [
            c.entry for c in self._pending if isinstance(c, Append)
        ]

    def plain_text(self) -> str:
        return "\n".join(e.plain for e in self.entries())


def status_text(status: AgentStatus | None, name: str, *, ended: str | None, role: str) -> Text:
    """The status line of the focused tab."""
    if status is None:
        tail = f"ended: {ended}" if ended else "starting…"
        return Text.assemble((f" {name} ", "bold reverse"), f"  {tail}")
    used = "?" if status.used_tokens is None else f"{status.used_tokens:,}"
    window = "?" if status.window is None else f"{status.window:,}"
    workers = "?" if status.running_workers is None else str(status.running_workers)
    state_style = "bold yellow" if status.state == "working" else "green"
    parts: list[tuple[str, str] | str] = [
        (f" {name} ", "bold reverse"),
        " ",
        (status.state, state_style),
        f" · {status.model}",
        f" · tokens {used}/{window}",
        f" · inbox {status.inbox}",
        f" · workers {workers} running",
        f" · sub-agents {status.sub_agents}",
    ]
    if status.branches:
        parts.append(f" · branches {status.branches}")
    parts.append(f" · turns {status.turns}")
    if role == "sub":
        parts.append((" · read-only", "dim"))
    return Text.assemble(*parts)


class StatusLine(Static):
    """The focused agent's figures; wraps onto a second row in a narrow (80-column) terminal."""

    DEFAULT_CSS = """
    StatusLine { height: auto; max-height: 2; background: $panel; color: $text; }
    """


class ErrorLine(Static):
    """The last error (red) or info (dim) line; the app empties it (see ``cli.tui.app``).

    A long message (a refusal naming a file path) wraps onto at most three rows."""

    DEFAULT_CSS = """
    ErrorLine { height: auto; max-height: 3; color: $text-muted; }
    ErrorLine.error { color: $error; text-style: bold; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.text = ""
        self.is_error = False

    def show(self, text: str, *, error: bool) -> None:
        self.text = text
        self.is_error = error
        self.set_class(error, "error")
        self.update(Text(("✗ " if error else "") + text))
