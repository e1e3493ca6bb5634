"""The recorded form: a run's model replies written, as they arrive, as an ordinary scenario.

A recording is a scenario file (docs/scenarios.md) that the scripted provider plays exactly:
a ``[recording]`` table saying which provider and model produced it, the ``[fleet]`` table the run
started with, the scenario's ``[grants.PATTERN]`` tables as written, then one ``[[agents.NAME]]``
block per model reply in the order the replies arrived (TOML lets the blocks of different agents
interleave: each agent's blocks still form its array in file order).

Why TOML appended block by block, rather than a JSON-lines sidecar rendered at the end: the file
the user asked for is a playable scenario at every moment of the run, so ``exarch-actors run
FILE.toml`` replays a crashed recording with no extra step. Each block is written with one
``write(2)`` on an ``O_APPEND`` descriptor, and a write to a regular file completes or does not
happen when its process is SIGKILLed, so a killed run leaves only whole blocks. A block can only
be torn by a full disk or a power loss (there is no fsync per reply: measured here, rendering
one two-call reply and writing it to both files takes 0.14 ms, an fsync of one 500-byte append
3.6 ms per file, and the recording must not add that to every round-trip; :meth:`Recorder.close`
fsyncs once); :func:`drop_torn_tail` finds such a
block by two rules the writer keeps -- a ``# NAME, reply N`` line before every header and
``stop = "..."`` as every block's last line -- and the scenario reader drops it with a warning.
A block a person adds by hand has no such mark and is never dropped.

Invariants (property-tested in tests/replay/test_recording_format.py):

- :func:`reply_block` of any assistant message, parsed back and played by the scripted provider,
  gives the same message (text, tool-call names, arguments and ids, stop reason, usage), so it
  is admitted (X2/X7) to the same message the recorded run committed;
- strings are TOML basic strings on one line (every control character escaped), so a line that
  starts with ``[[agents.`` is always a block header and no other line of a block starts with
  ``[``;
- any prefix of a recording reads as a prefix of its replies: whole blocks kept, a torn last
  block dropped and reported.

Secrets never enter: a block is built from the :class:`~runtime.messages.AssistantMessage` the
provider returned (text, tool calls, stop reason, usage), which holds no request header; the
header names the provider and model, never the endpoint's key.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.mcp.replies import McpReply, mcp_result_block
from exarch_actors.runtime.messages import AssistantMessage, ToolCall
from exarch_actors.runtime.state.private import FILE_MODE, private_dirs

RECORDED_ERRORS = ("rate_limit", "transport", "truncated", "timeout", "malformed", "rejected")
"""Provider failure kinds a scenario can play (``runtime.providers.scenario.ERROR_KINDS``); a
failure of any other kind is recorded as ``transport`` with its message kept."""

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TABLE_LINE = re.compile(r"^\[.*$", re.MULTILINE)
_BLOCKS = ("[[agents.", "[[mcp.")
"""The headers of the blocks a recorder appends: a model reply, an MCP result
(``runtime/mcp/replies.py``)."""
_MARK = re.compile(r"^# .+, reply \d+( \(spawned by .+\))?$")
_STOP_LINE = re.compile(r'^\s*stop\s*=\s*"[a-z_]+"[ \t]*(#.*)?$', re.MULTILINE)
_RECORDING_TABLE = re.compile(r"^\[recording\]\s*$", re.MULTILINE)

# ---------------------------------------------------------------------------------------------
# TOML values (the few shapes a recording uses)


def toml_string(s: str) -> str:
    """``s`` as a one-line TOML basic string: quote, backslash and every control character
    (U+0000-U+001F and U+007F, which TOML forbids raw) escaped; all else kept as is."""
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:  # a lone surrogate cannot be encoded: keep it visible
            out.append("\\uFFFD")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_key(key: str) -> str:
    """A bare key when TOML allows it, else a quoted one."""
    return key if _BARE_KEY.match(key) else toml_string(key)


def _strings(values: Iterable[str]) -> str:
    items = [f"  {toml_string(v)}," for v in values]
    return "[\n" + "\n".join(items) + "\n]" if items else "[]"


def _line(key: str, value: Any) -> str:
    if isinstance(value, bool):
        rendered = "true" if value else "false"
    elif isinstance(value, int):
        rendered = str(value)
    elif isinstance(value, str):
        rendered = toml_string(value)
    else:
        rendered = _strings(value)
    return f"{toml_key(key)} = {rendered}\n"


# ---------------------------------------------------------------------------------------------
# The header


@dataclass(frozen=True)
class RecordingHeader:
    """What a recording says before its first reply."""

    provider: str
    model: str
    started: str
    prompt: str | None = None
    system: str | None = None
    window_tokens: int | None = None
    chat: bool = False
    """``--chat``: no system prompt and no tool (``run --chat`` plays it the same way)."""
    interactive: bool = False
    """Recorded in the chat UI: the replies answer messages a person typed."""
    source: str | None = None
    """The scenario the recorded run started from, if any."""
    grant_flags: tuple[str, ...] = ()
    """``--grant-exec X`` / ``--grant-root D`` as given (a replay with ``run`` needs them too)."""
    grants: tuple[tuple[str, Mapping[str, Sequence[str] | None]], ...] = ()
    """The scenario's ``[grants.PATTERN]`` tables as written: (pattern, {exec, roots})."""


def render_header(h: RecordingHeader) -> str:
    """The file's opening: how to play it, ``[recording]``, ``[fleet]``, ``[grants.*]``."""
    lines = [
        "# Recorded with --record: every agent's model replies, in the order they arrived, as\n",
        "# an ordinary scenario (docs/scenarios.md). Play it offline with\n",
        "# `exarch-actors run THIS.toml`; compare a session's ral results with\n",
        "# `exarch-actors replay SESSION_DIR`. Edit it like any scenario.\n",
    ]
    if h.interactive:
        lines.append(
            "# Recorded in the chat UI: play it with `exarch-actors chat THIS.toml` and type the\n"
            "# same messages; each reply answers the message typed then.\n"
        )
    if h.chat:
        lines.append("# Recorded with --chat: play it with `exarch-actors run --chat THIS.toml`.\n")
    if h.grant_flags:
        lines.append(f"# Recorded with {' '.join(h.grant_flags)}: pass the same flags to `run`.\n")
    lines.append("\n[recording]\n")
    lines.append(_line("provider", h.provider))
    lines.append(_line("model", h.model))
    lines.append(_line("started", h.started))
    if h.chat:
        lines.append(_line("chat", True))
    if h.interactive:
        lines.append(_line("interactive", True))
    if h.source is not None:
        lines.append(_line("source", h.source))
    lines.append("\n[fleet]\n")
    for key, value in (
        ("prompt", h.prompt),
        ("system", h.system),
        ("window_tokens", h.window_tokens),
    ):
        if value is not None:
            lines.append(_line(key, value))
    for pattern, table in h.grants:
        lines.append(f"\n[grants.{toml_key(pattern)}]\n")
        for key in ("exec", "roots"):
            names = table.get(key)
            if names is not None:
                lines.append(_line(key, list(names)))
    return "".join(lines)


# ---------------------------------------------------------------------------------------------
# Reply blocks


def _plain_ral(call: ToolCall) -> str | None:
    """The script of a call the ``ral = [...]`` form reproduces exactly, else None."""
    if call.name != "ral" or not isinstance(call.arguments, dict):
        return None
    script = call.arguments.get("script")
    if set(call.arguments) != {"script"} or not isinstance(script, str):
        return None
    return script


def _call_table(call: ToolCall) -> str:
    args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return (
        f"  {{ id = {toml_string(call.id)}, name = {toml_string(call.name)}, "
        f"arguments = {toml_string(args)} }},"
    )


def reply_mark(agent: str, n: int, parent: str | None = None) -> str:
    """The comment the writer puts before the ``n``-th block of ``agent`` (and how the reader
    tells a block it wrote from one a person added: only the former can be torn)."""
    spawned = f" (spawned by {parent})" if parent else ""
    return f"{agent}, reply {n}{spawned}"


def reply_block(
    agent: str,
    msg: AssistantMessage,
    *,
    error: str | None = None,
    error_message: str | None = None,
    mark: str | None = None,
) -> str:
    """One ``[[agents.AGENT]]`` block reproducing ``msg`` (as the provider returned it, before
    admission), or the failure ``error`` (a kind of :data:`RECORDED_ERRORS`) with ``msg`` as
    the partial reply of a truncation. ``stop`` is always the last line, and ``mark`` (the
    writer's ``# NAME, reply N`` line, :func:`reply_mark`) the line before the header."""
    out = [f"\n# {mark}\n" if mark else "\n", f"[[agents.{toml_key(agent)}]]\n"]
    if msg.text:
        out.append(_line("text", msg.text))
    scripts = [_plain_ral(c) for c in msg.tool_calls]
    if msg.tool_calls and all(s is not None for s in scripts):
        out.append(_line("ral", [s for s in scripts if s is not None]))
        out.append(f"ids = [{', '.join(toml_string(c.id) for c in msg.tool_calls)}]\n")
    elif msg.tool_calls:
        out.append("calls = [\n" + "\n".join(_call_table(c) for c in msg.tool_calls) + "\n]\n")
    if msg.usage is not None:
        out.append(_line("usage_tokens", msg.usage.input_tokens))
        out.append(_line("usage_output_tokens", msg.usage.output_tokens))
        if msg.usage.cache_write_tokens:
            out.append(_line("usage_cache_write_tokens", msg.usage.cache_write_tokens))
        if msg.usage.cache_read_tokens:
            out.append(_line("usage_cache_read_tokens", msg.usage.cache_read_tokens))
    if error is not None:
        out.append(_line("error", error if error in RECORDED_ERRORS else "transport"))
        if error_message:
            out.append(_line("error_message", error_message))
    out.append(_line("stop", msg.stop_reason.value))
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Reading a recording cut mid-write


@dataclass(frozen=True)
class TornBlock:
    """A final reply block the reader dropped: its 1-based header line and what it was."""

    line: int
    what: str


def drop_torn_tail(text: str) -> tuple[str, TornBlock | None]:
    """``text`` without a torn final reply block, and which block was dropped (None if none).

    Applies only to a block the writer wrote (its ``# NAME, reply N`` mark line, then a header
    starting ``[[agents.``, or any prefix of one: a header cut short) when it is the last table
    of a recording (a file with a ``[recording]`` table): that block is whole iff a complete
    ``stop = "..."`` line follows, the line the writer always writes last. A block a person
    added without a mark is never dropped; anything else is left to the ordinary parser."""
    if _RECORDING_TABLE.search(text) is None:
        return text, None
    opens = list(_TABLE_LINE.finditer(text))
    if not opens:
        return text, None
    last = opens[-1]
    line = last.group(0)
    if not any(line.startswith(b) or b.startswith(line) for b in _BLOCKS):
        return text, None
    before = text.rfind("\n", 0, max(last.start() - 1, 0))
    mark = text[before + 1 : max(last.start() - 1, 0)]
    if _MARK.match(mark) is None:
        return text, None
    if _STOP_LINE.search(text, last.end()) is not None:
        return text, None
    number = text.count("\n", 0, last.start()) + 1
    return text[: before + 1], TornBlock(number, line.strip())


# ---------------------------------------------------------------------------------------------
# The writer


class RecordingBusy(ExarchError):
    """``--record FILE`` names a file another live run is recording into.

    Two runs appending to one file interleaved their blocks (16 agent blocks where one run
    writes 8), and the result still parsed and replayed as neither run. Each recorder holds an
    exclusive ``flock`` on its files while it writes, so the second run is refused instead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"recording busy: another live run is recording into {path}; "
            "give this run another --record FILE, or wait for that run to end"
        )


def recording_busy(path: Path) -> bool:
    """Whether a live recorder holds ``path`` (probed with a shared lock taken and dropped)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
    return False


class Recorder:
    """Appends a recording to one or more files while a run goes on. Thread-safe.

    The header is written when the recorder is made; each reply is one block written with one
    ``write(2)`` per file (see the module doc). :meth:`close` fsyncs and closes; it is
    idempotent, and a reply after close is ignored (a straggler of a closing fleet). A write that
    fails (a full disk) stops the recording, never the run: :attr:`error` says so, and what was
    written stays readable (a torn last block is dropped by the reader). Each file is locked
    for the recorder's life: a file another live recorder holds is refused with
    :class:`RecordingBusy`, untouched."""

    def __init__(self, paths: Sequence[Path], header: RecordingHeader) -> None:
        unique: list[Path] = []
        for p in paths:
            if all(not _same(p, q) for q in unique):
                unique.append(p)
        self.paths = tuple(unique)
        self.header = header
        self._lock = threading.Lock()
        self._fds: list[int] = []
        self._counts: dict[str, int] = {}
        self._parents: dict[str, str] = {}
        self.replies = 0
        self.error: str | None = None
        """Why the recording stopped before the run ended (a write failed), else None."""
        try:
            for p in self.paths:
                private_dirs(p.parent)
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
                self._fds.append(fd)
                try:  # held until close: one live writer per file (:class:`RecordingBusy`)
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise RecordingBusy(p) from None
                    raise
                os.ftruncate(fd, 0)  # truncated only once it is ours
            self._write(render_header(header))
        except BaseException:
            self.close()
            raise

    def spawned(self, child: str, parent: str) -> None:
        """``child`` was made from ``parent``'s provider (a fork or a branch)."""
        with self._lock:
            self._parents.setdefault(child, parent)

    def reply(self, agent: str, msg: AssistantMessage) -> None:
        self._block(agent, msg, None, None)

    def failure(self, agent: str, kind: str, message: str, partial: AssistantMessage) -> None:
        self._block(agent, partial, kind, message)

    def mcp_reply(self, server: str, reply: McpReply) -> None:
        """One MCP result (or failure) of the fleet's server ``server``, as it arrived."""
        self._append(
            f"mcp {server}", lambda mark: mcp_result_block(server, reply, mark, toml_string)
        )

    def _block(
        self, agent: str, msg: AssistantMessage, error: str | None, message: str | None
    ) -> None:
        parent = self._parents.get(agent)
        self._append(
            agent,
            lambda mark: reply_block(agent, msg, error=error, error_message=message, mark=mark),
            parent,
        )

    def _append(self, who: str, block: Callable[[str], str], parent: str | None = None) -> None:
        with self._lock:
            if not self._fds:
                return
            n = self._counts[who] = self._counts.get(who, 0) + 1
            mark = reply_mark(who, n, parent if n == 1 else None)
            try:
                self._write(block(mark))
            except OSError as e:  # a full disk must not fail the run: the recording stops here
                self.error = f"recording stopped after {self.replies} replies: {e.strerror or e}"
                fds, self._fds = self._fds, []
                for fd in fds:
                    os.close(fd)
                return
            self.replies += 1

    def _write(self, text: str) -> None:
        data = text.encode("utf-8")
        for fd in self._fds:
            view = memoryview(data)
            while view:  # one write(2) unless the disk fills up mid-block
                n = os.write(fd, view)
                view = view[n:]

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, []
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)
