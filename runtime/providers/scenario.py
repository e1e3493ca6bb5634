"""Scenario files (docs/scenarios.md): parse a TOML scenario into a typed :class:`Scenario`.

A malformed scenario raises :class:`~runtime.errors.ScenarioError` whose message starts with
``FILE:LINE:COL:`` (TOML syntax errors, from ``tomllib``) or ``FILE:LINE:`` plus the key path for
schema errors, e.g. ``s.toml:14: agents.trunk[2].stop: expected one of tool_use, end_turn,
max_tokens, got "stopp"``. The line of a schema error is found by scanning the source for the
``[[agents.NAME]]`` header of that entry; when the scenario uses inline tables the key path alone
locates it. Unknown keys are not errors (more fields are welcome) but are reported in
``Scenario.warnings`` with their position, so a typo is never silently lost.

``[grants.PATTERN]`` tables narrow the grants of every agent whose name is PATTERN or matches it
as a glob (``exec`` programs, ``roots`` directories). Parsing keeps the names as written;
:meth:`Scenario.resolve_grants` resolves them once, in the control process (a name not on PATH
is a :class:`ScenarioError` with the table's position), so a resumed run reuses what was
resolved instead of resolving again.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exarch_actors.runtime.credentials import valid_name
from exarch_actors.runtime.errors import GrantUnresolvable, ScenarioError
from exarch_actors.runtime.fleet.placement import (
    PLACEMENT_KEYS,
    BadResourceRequest,
    ResourceRequest,
)
from exarch_actors.runtime.mcp.config import McpConfigInvalid, McpServer, server_from_table
from exarch_actors.runtime.mcp.replies import McpReply, replies_from_table
from exarch_actors.runtime.messages import StopReason
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.replay.recording import drop_torn_tail

ERROR_KINDS = ("rate_limit", "transport", "truncated", "timeout", "malformed", "rejected")
"""docs/scenarios.md's contract names the first three; the last three are additions."""

_MESSAGE_KEYS = frozenset(
    {
        "text",
        "ral",
        "stop",
        "repeat",
        "usage_tokens",
        "fn_arguments",
        "delay_ms",
        "error",
        # what a recording adds (docs/scenarios.md, "Recording and replay")
        "ids",
        "calls",
        "usage_output_tokens",
        "usage_cache_write_tokens",
        "usage_cache_read_tokens",
        "error_message",
    }
)
_CALL_KEYS = frozenset({"id", "name", "arguments"})
_FLEET_KEYS = frozenset({"prompt", "window_tokens", "system", "secret_env"})
_GRANT_KEYS = ("exec", "roots")
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call of a ``calls = [...]`` entry: any tool name, raw or object arguments, and
    the id the model gave it (``None``: the provider's deterministic one)."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


@dataclass(frozen=True)
class ScriptedMessage:
    """One scripted assistant message (before ``repeat`` expansion)."""

    text: str = ""
    ral: tuple[str, ...] = ()
    stop: StopReason = StopReason.END_TURN
    repeat: int = 1
    usage_tokens: int | None = None
    fn_arguments: dict[str, Any] | str | None = None
    delay_ms: int = 0
    error: str | None = None
    where: str = ""
    """Key path of this entry, e.g. ``agents.trunk[2]`` (for diagnostics)."""
    ids: tuple[str, ...] = ()
    """The call ids of ``ral`` (as many as scripts), as the recorded model gave them."""
    calls: tuple[ScriptedCall, ...] = ()
    """Tool calls that are not plain ``ral`` scripts (another tool, raw arguments)."""
    usage_output_tokens: int | None = None
    error_message: str | None = None
    usage_cache_write_tokens: int = 0
    usage_cache_read_tokens: int = 0
    """Parts of ``usage_tokens`` written to / read from a prompt cache (priced apart)."""


@dataclass(frozen=True)
class FleetTable:
    """The ``[fleet]`` table as written: the trunk's prompt, system prompt and window."""

    prompt: str | None = None
    window_tokens: int | None = None
    system: str | None = None
    secret_env: tuple[str, ...] = ()
    """Variables kept out of every shell besides the provider's keys (``runtime/credentials.py``),
    as ``--secret-env`` marks them."""


@dataclass(frozen=True)
class GrantTable:
    """One ``[grants.PATTERN]`` table as written: ``None`` leaves that part unnarrowed."""

    pattern: str
    exec: tuple[str, ...] | None = None
    roots: tuple[str, ...] | None = None
    where: tuple[str, str] = ("", "")
    """``FILE:LINE`` of the ``exec`` and the ``roots`` key (``FILE`` alone when written inline),
    for diagnostics."""
    mcp: tuple[str, ...] | None = None
    """The MCP servers agents of the pattern may call (``None``: unnarrowed)."""


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario. ``agents`` keys are exact names; ``patterns`` are globs in file order."""

    fleet: FleetTable = field(default_factory=FleetTable)
    agents: Mapping[str, tuple[ScriptedMessage, ...]] = field(default_factory=dict)
    patterns: tuple[tuple[str, tuple[ScriptedMessage, ...]], ...] = ()
    source: str = "<scenario>"
    warnings: tuple[str, ...] = ()
    grants: tuple[GrantTable, ...] = ()
    recording: Mapping[str, Any] | None = None
    """The ``[recording]`` table of a recorded scenario (provider, model, ...), else None."""
    mcp: tuple[McpServer, ...] = ()
    """The ``[mcp.NAME]`` servers (docs/mcp.md)."""
    mcp_replies: Mapping[str, tuple[McpReply, ...]] = field(default_factory=dict)
    """Recorded MCP results by server (``[[mcp.NAME.replies]]``): a run that has them for a
    server serves that server from them and never starts it (``runtime/mcp/replies.py``)."""
    placement: tuple[tuple[str, ResourceRequest], ...] = ()
    """``[placement.PATTERN]`` tables: each agent's Ray resource request
    (``runtime/fleet/placement.py``), in file order."""

    @property
    def prompt(self) -> str | None:
        return self.fleet.prompt

    @property
    def window_tokens(self) -> int | None:
        return self.fleet.window_tokens

    @property
    def system(self) -> str | None:
        return self.fleet.system

    @property
    def secret_env(self) -> tuple[str, ...]:
        return self.fleet.secret_env

    def entries_for(self, agent_name: str) -> tuple[ScriptedMessage, ...]:
        """The entries scripted for ``agent_name``: an exact name wins, else the first matching
        pattern in file order (``worker-*`` matches every name starting with ``worker-``)."""
        exact = self.agents.get(agent_name)
        if exact is not None:
            return exact
        for pattern, entries in self.patterns:
            if fnmatch.fnmatchcase(agent_name, pattern):
                return entries
        return ()

    def resolve_grants(
        self, *, cwd: str, search_path: str | None = None
    ) -> tuple[tuple[str, Grants], ...]:
        """Each ``[grants.PATTERN]`` table made into grants, resolved now (relative roots against
        ``cwd``, programs on ``search_path``, default this process's PATH)."""
        out = []
        for t in self.grants:
            try:
                g = Grants.granting(
                    t.exec, t.roots, search_path=search_path, cwd=cwd, mcp=t.mcp
                )
            except GrantUnresolvable as e:
                i = 0 if e.what.startswith("exec ") else 1
                key, where = _GRANT_KEYS[i], t.where[i]
                raise ScenarioError(f"{where}: grants.{_quote(t.pattern)}.{key}: {e}") from None
            out.append((t.pattern, g))
        return tuple(out)

    def script_for(self, agent_name: str) -> tuple[ScriptedMessage, ...]:
        """The messages ``agent_name`` plays, in order, with ``repeat`` expanded in place."""
        out: list[ScriptedMessage] = []
        for entry in self.entries_for(agent_name):
            out.extend([entry] * entry.repeat)
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# Loading


def load_scenario(path: str | Path) -> Scenario:
    """Read and parse a scenario file; every failure is a :class:`ScenarioError`."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read scenario: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{p}: scenario is not UTF-8 (byte {e.start})") from e
    return parse_scenario(text, source=str(p))


def parse_scenario(text: str, *, source: str = "<scenario>") -> Scenario:
    """Parse ``text``. A recording cut mid-write (a crash, a full disk) loses only its torn
    final reply block, reported as a warning (:func:`runtime.replay.recording.drop_torn_tail`)."""
    text, torn = drop_torn_tail(text)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(_toml_error(source, text, e)) from e
    parser = _Parser(text, source)
    if torn is not None:
        parser.warn(torn.line, torn.what, "torn final reply block dropped (cut mid-write)")
    return parser.scenario(doc)


def _toml_error(source: str, text: str, e: tomllib.TOMLDecodeError) -> str:
    msg = str(e)
    # tomllib formats "Invalid value (at line 3, column 9)"; lift the position to the front.
    m = re.search(r"\(at line (\d+), column (\d+)\)$", msg)
    if m:
        reason = msg[: m.start()].rstrip()
        return f"{source}:{m.group(1)}:{m.group(2)}: invalid TOML: {reason}"
    m = re.search(r"\(at end of document\)$", msg)
    if m:
        line = text.count("\n") + 1
        return f"{source}:{line}: invalid TOML: {msg[: m.start()].rstrip()} (at end of document)"
    return f"{source}: invalid TOML: {msg}"


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source
        self.here = str(Path(source).resolve().parent) if not source.startswith("<") else None
        self.warnings: list[str] = []

    # -- positions ---------------------------------------------------------------------------

    def _header_line(self, agent: str, index: int | None) -> int | None:
        """1-based line of the ``index``-th ``[[agents.<agent>]]`` header (or ``[agents.x]``)."""
        seen = 0
        for n, line in enumerate(self.lines, 1):
            m = re.match(r"\s*\[\[?\s*agents\s*\.\s*(.+?)\s*\]\]?\s*(#.*)?$", line)
            if not m:
                continue
            if _unquote(m.group(1)) != agent:
                continue
            if index is None or seen == index:
                return n
            seen += 1
        return None

    def _table_line(self, table: str, name: str) -> int | None:
        """1-based line of the ``[TABLE.NAME]`` header (None when written inline)."""
        for n, line in enumerate(self.lines, 1):
            m = re.match(rf"\s*\[\s*{table}\s*\.\s*(.+?)\s*\]\s*(#.*)?$", line)
            if m and _unquote(m.group(1)) == name:
                return n
        return None

    def _key_line(self, start: int | None, key: str) -> int | None:
        if start is None:
            return None
        for n in range(start, len(self.lines)):
            line = self.lines[n]
            if re.match(r"\s*\[", line):
                break
            if re.match(rf"\s*\"?{re.escape(key)}\"?\s*=", line):
                return n + 1
        return start

    def _section_line(self, name: str) -> int | None:
        for n, line in enumerate(self.lines, 1):
            if re.match(rf"\s*\[\s*{re.escape(name)}\s*\]", line):
                return n
        return None

    def fail(self, line: int | None, path: str, what: str) -> ScenarioError:
        where = f"{self.source}:{line}" if line else self.source
        return ScenarioError(f"{where}: {path}: {what}")

    def warn(self, line: int | None, path: str, what: str) -> None:
        where = f"{self.source}:{line}" if line else self.source
        self.warnings.append(f"{where}: {path}: {what}")

    # -- schema ------------------------------------------------------------------------------

    def scenario(self, doc: dict[str, Any]) -> Scenario:
        for key in doc:
            if key not in ("fleet", "agents", "grants", "recording", "mcp", "placement"):
                self.warn(self._section_line(key), key, "unknown top-level key (ignored)")
        fleet = self.fleet(doc.get("fleet", {}))
        agents_doc = doc.get("agents", {})
        if not isinstance(agents_doc, dict):
            raise self.fail(None, "agents", "expected a table of agent names")
        exact: dict[str, tuple[ScriptedMessage, ...]] = {}
        patterns: list[tuple[str, tuple[ScriptedMessage, ...]]] = []
        for name, entries in agents_doc.items():
            parsed = self.agent(name, entries)
            if _GLOB_CHARS.search(name):
                patterns.append((name, parsed))
            else:
                exact[name] = parsed
        grants = self.grants(doc.get("grants", {}))
        mcp, replies = self.mcp(doc.get("mcp", {}))
        placement = self.placement(doc.get("placement", {}))
        return Scenario(
            fleet=fleet,
            agents=exact,
            patterns=tuple(patterns),
            source=self.source,
            warnings=tuple(self.warnings),
            grants=grants,
            recording=self.recording(doc.get("recording")),
            mcp=mcp,
            mcp_replies=replies,
            placement=placement,
        )

    def mcp(
        self, doc: Any
    ) -> tuple[tuple[McpServer, ...], dict[str, tuple[McpReply, ...]]]:
        """The ``[mcp.NAME]`` tables, and the ``replies`` a recording appended to them."""
        if not isinstance(doc, dict):
            raise self.fail(self._section_line("mcp"), "mcp", "expected a table of names")
        servers: list[McpServer] = []
        replies: dict[str, tuple[McpReply, ...]] = {}
        for name, table in doc.items():
            line = self._table_line("mcp", name)
            where = f"{self.source}:{line}" if line else self.source
            table = dict(table) if isinstance(table, dict) else table
            try:
                if isinstance(table, dict) and "replies" in table:
                    replies[name] = replies_from_table(name, table.pop("replies"), where)
                    if "command" not in table and "url" not in table:  # served from replies
                        described = str(table.get("description", ""))
                        servers.append(McpServer(name, description=described))
                        continue
                servers.append(server_from_table(name, table, where, self.here))
            except McpConfigInvalid as e:
                raise ScenarioError(str(e)) from None
        return tuple(servers), replies
    def placement(self, doc: Any) -> tuple[tuple[str, ResourceRequest], ...]:
        if not isinstance(doc, dict):
            raise self.fail(self._section_line("placement"), "placement", "expected a table")
        out = []
        for name, table in doc.items():
            path = f"placement.{_quote(name)}"
            line = self._table_line("placement", name)
            if not isinstance(table, dict):
                raise self.fail(line, path, _expected(f"a table ([{path}])", table))
            for key in table:
                if key not in PLACEMENT_KEYS:
                    self.warn(self._key_line(line, key), f"{path}.{key}", "unknown key (ignored)")
            try:
                out.append((name, ResourceRequest.from_table(path, table)))
            except BadResourceRequest as e:
                key_path, _, what = str(e).partition(": ")
                raise self.fail(line, key_path, what) from None
        return tuple(out)

    def recording(self, table: Any) -> Mapping[str, Any] | None:
        if table is None:
            return None
        if not isinstance(table, dict):
            raise self.fail(self._section_line("recording"), "recording", "expected a table")
        return table

    def grants(self, doc: Any) -> tuple[GrantTable, ...]:
        if not isinstance(doc, dict):
            raise self.fail(self._section_line("grants"), "grants", "expected a table of names")
        return tuple(self.grant_table(name, table) for name, table in doc.items())

    def grant_table(self, name: str, table: Any) -> GrantTable:
        path = f"grants.{_quote(name)}"
        line = self._table_line("grants", name)
        if not name:
            raise self.fail(line, path, "an agent name cannot be empty")
        if not isinstance(table, dict):
            raise self.fail(line, path, _expected(f"a table ([{path}])", table))
        for key in table:
            if key not in (*_GRANT_KEYS, "mcp"):
                self.warn(self._key_line(line, key), f"{path}.{key}", "unknown key (ignored)")
        parts: dict[str, tuple[str, ...] | None] = {}
        for key in (*_GRANT_KEYS, "mcp"):
            v = table.get(key)
            if v is not None and (
                not isinstance(v, list) or not all(isinstance(x, str) and x for x in v)
            ):
                raise self.fail(
                    self._key_line(line, key),
                    f"{path}.{key}",
                    _expected("a list of non-empty strings", v),
                )
            parts[key] = None if v is None else tuple(v)
        where = []
        for key in _GRANT_KEYS:
            n = self._key_line(line, key)
            where.append(f"{self.source}:{n}" if n else self.source)
        return GrantTable(
            name, parts["exec"], parts["roots"], (where[0], where[1]), mcp=parts["mcp"]
        )

    def fleet(self, table: Any) -> FleetTable:
        line = self._section_line("fleet")
        if not isinstance(table, dict):
            raise self.fail(line, "fleet", "expected a table ([fleet])")
        for key in table:
            if key not in _FLEET_KEYS:
                self.warn(self._key_line(line, key), f"fleet.{key}", "unknown key (ignored)")
        prompt = table.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise self.fail(
                self._key_line(line, "prompt"), "fleet.prompt", _expected("a string", prompt)
            )
        system = table.get("system")
        if system is not None and not isinstance(system, str):
            raise self.fail(
                self._key_line(line, "system"), "fleet.system", _expected("a string", system)
            )
        window = table.get("window_tokens")
        if window is not None and (not _is_int(window) or window <= 0):
            raise self.fail(
                self._key_line(line, "window_tokens"),
                "fleet.window_tokens",
                _expected("a positive integer", window),
            )
        secret_env = table.get("secret_env", [])
        if not isinstance(secret_env, list) or not all(
            isinstance(n, str) and valid_name(n) for n in secret_env
        ):
            raise self.fail(
                self._key_line(line, "secret_env"),
                "fleet.secret_env",
                _expected("a list of variable names", secret_env),
            )
        return FleetTable(
            prompt=prompt, window_tokens=window, system=system, secret_env=tuple(secret_env)
        )

    def agent(self, name: str, entries: Any) -> tuple[ScriptedMessage, ...]:
        path = f"agents.{_quote(name)}"
        if not name:
            raise self.fail(self._header_line(name, None), path, "an agent name cannot be empty")
        if isinstance(entries, dict):
            raise self.fail(
                self._header_line(name, None),
                path,
                f"expected an array of tables ([[{path}]]), got a single table ([{path}])",
            )
        if not isinstance(entries, list):
            raise self.fail(None, path, _expected("an array of tables", entries))
        return tuple(self.message(name, i, e) for i, e in enumerate(entries))

    def message(self, agent: str, index: int, entry: Any) -> ScriptedMessage:
        path = f"agents.{_quote(agent)}[{index}]"
        header = self._header_line(agent, index)
        if not isinstance(entry, dict):
            raise self.fail(header, path, _expected("a table", entry))

        def fail(key: str, what: str) -> ScenarioError:
            return self.fail(self._key_line(header, key), f"{path}.{key}", what)

        for key in entry:
            if key not in _MESSAGE_KEYS:
                self.warn(self._key_line(header, key), f"{path}.{key}", "unknown key (ignored)")

        text = entry.get("text", "")
        if not isinstance(text, str):
            raise fail("text", _expected("a string", text))

        ral_raw = entry.get("ral", [])
        if isinstance(ral_raw, str):
            ral_raw = [ral_raw]
        if not isinstance(ral_raw, list):
            raise fail("ral", _expected("a list of strings", ral_raw))
        for j, script in enumerate(ral_raw):
            if not isinstance(script, str):
                raise self.fail(
                    self._key_line(header, "ral"),
                    f"{path}.ral[{j}]",
                    _expected("a string (one ral script)", script),
                )
        ral = tuple(ral_raw)
        ids = self._ids(entry.get("ids"), ral, fail)
        calls = self._calls(entry.get("calls"), path, header)
        if calls and (ral or "fn_arguments" in entry):
            raise fail("calls", "a message has ral scripts or calls, not both")

        fn_raw = entry.get("fn_arguments")
        fn_arguments: dict[str, Any] | str | None
        if fn_raw is None or isinstance(fn_raw, str | dict):
            fn_arguments = fn_raw
        else:  # any other TOML value is sent as its (non-object) JSON text
            fn_arguments = json.dumps(fn_raw, default=str)
        has_calls = bool(ral) or bool(calls) or fn_arguments is not None

        stop_raw = entry.get("stop")
        if stop_raw is None:
            stop = StopReason.TOOL_USE if has_calls else StopReason.END_TURN
        else:
            try:
                stop = StopReason(stop_raw)
            except ValueError:
                raise fail(
                    "stop",
                    "expected one of tool_use, end_turn, max_tokens, got " + _show(stop_raw),
                ) from None

        repeat = entry.get("repeat", 1)
        if not _is_int(repeat) or repeat < 0:
            raise fail("repeat", _expected("a non-negative integer", repeat))
        usage = entry.get("usage_tokens")
        if usage is not None and (not _is_int(usage) or usage < 0):
            raise fail("usage_tokens", _expected("a non-negative integer", usage))
        delay = entry.get("delay_ms", 0)
        if not _is_int(delay) or delay < 0:
            raise fail("delay_ms", _expected("a non-negative integer (milliseconds)", delay))
        output = entry.get("usage_output_tokens")
        if output is not None and (not _is_int(output) or output < 0):
            raise fail("usage_output_tokens", _expected("a non-negative integer", output))
        cache: dict[str, int] = {}
        for key in ("usage_cache_write_tokens", "usage_cache_read_tokens"):
            value = entry.get(key, 0)
            if not _is_int(value) or value < 0:
                raise fail(key, _expected("a non-negative integer", value))
            cache[key] = value
        if sum(cache.values()) > (usage or 0):
            raise fail(
                "usage_cache_read_tokens",
                "cache write + cache read tokens are part of usage_tokens and exceed it",
            )
        error = entry.get("error")
        if error is not None and error not in ERROR_KINDS:
            raise fail("error", f"expected one of {', '.join(ERROR_KINDS)}, got {_show(error)}")
        error_message = entry.get("error_message")
        if error_message is not None and not isinstance(error_message, str):
            raise fail("error_message", _expected("a string", error_message))

        return ScriptedMessage(
            text=text,
            ral=ral,
            stop=stop,
            repeat=repeat,
            usage_tokens=usage,
            fn_arguments=fn_arguments,
            delay_ms=delay,
            error=error,
            where=path,
            ids=ids,
            calls=calls,
            usage_output_tokens=output,
            error_message=error_message,
            **cache,
        )

    def _ids(
        self, raw: Any, ral: tuple[str, ...], fail: Callable[[str, str], ScenarioError]
    ) -> tuple[str, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list) or not all(isinstance(i, str) for i in raw):
            raise fail("ids", _expected("a list of strings (one call id per ral script)", raw))
        if len(raw) != len(ral):
            raise fail("ids", f"expected {len(ral)} ids (one per ral script), got {len(raw)}")
        return tuple(raw)

    def _calls(self, raw: Any, path: str, header: int | None) -> tuple[ScriptedCall, ...]:
        if raw is None:
            return ()
        line = self._key_line(header, "calls")
        if not isinstance(raw, list):
            raise self.fail(line, f"{path}.calls", _expected("a list of inline tables", raw))
        out = []
        for j, call in enumerate(raw):
            where = f"{path}.calls[{j}]"
            if not isinstance(call, dict):
                raise self.fail(line, where, _expected("a table {name, arguments, id}", call))
            for key in call:
                if key not in _CALL_KEYS:
                    self.warn(line, f"{where}.{key}", "unknown key (ignored)")
            name, arguments, call_id = call.get("name"), call.get("arguments", {}), call.get("id")
            if not isinstance(name, str):
                raise self.fail(line, f"{where}.name", _expected("a string", name))
            if not isinstance(arguments, str | dict):
                raise self.fail(
                    line, f"{where}.arguments", _expected("a string or a table", arguments)
                )
            if call_id is not None and not isinstance(call_id, str):
                raise self.fail(line, f"{where}.id", _expected("a string", call_id))
            out.append(ScriptedCall(name, arguments, call_id))
        return tuple(out)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    return f"{type(v).__name__} {v!r}"


def _expected(what: str, got: Any) -> str:
    return f"expected {what}, got {_show(got)}"


def _quote(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _unquote(key: str) -> str:
    key = key.strip()
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "\"'":
        return key[1:-1]
    return key
