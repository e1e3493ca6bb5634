"""``exarch-actors ral``: a REPL, a one-liner (``-c``), a file, or a script on stdin.

Exit status: 0 success, 1 ral error (runtime or cancelled), 2 refused before running (syntax or
elaboration) or bad input. ``--json`` prints exactly one JSON object
``{"value", "stdout", "stderr", "error"}``. Grants are full by default; ``--grant-exec`` and
``--grant-root`` narrow them (resolved once, here: a program not on PATH or a root that is not a
directory exits 2). Ctrl-C cancels the run in flight (the REPL then continues); the REPL
never expires a binding.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import click

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.cli.grants import grant_options, grants_from_flags
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.errors import RalSyntaxError
from exarch_actors.runtime.ral.lexer import tokenize
from exarch_actors.runtime.ral.session import RunResult, Session
from exarch_actors.runtime.ral.values import Part, Unit, Variant, render, separators, write_nested

HISTORY = os.path.join(os.path.expanduser("~"), ".exarch", "ral_history")


def _dumps(obj: Any) -> str:
    """JSON text that is valid UTF-8: non-ASCII as itself, but a lone surrogate (a byte that
    was not UTF-8, from a file name or the environment) as a ``\\udcXX`` escape."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj)
    return text


def _json_leaf(v: Any) -> str:
    t = type(v)
    if t is Unit:
        return "null"
    if t is bool or t is str:
        return _dumps(v)
    if t is int and abs(v) < (1 << 1000):
        return str(v)
    if t is float and math.isfinite(v):
        return json.dumps(v)
    return _dumps(render(v))


def _json_part(v: Any) -> Part:
    t = type(v)
    if t is dict:
        pairs = zip(separators(), v, v.values())
        return "{", ((f"{s}{_dumps(k)}: ", x) for s, k, x in pairs), "}"
    if t is list:
        return "[", zip(separators(), v), "]"
    if t is Variant:
        tag = _dumps(v.tag)
        return '{"tag": ' + tag + ', "payload": ', iter((("", v.payload),)), "}"
    return _json_leaf(v)


def json_text(v: Any) -> str:
    """A value as JSON text: maps -> objects, lists -> arrays, unit -> null, a variant ->
    ``{"tag", "payload"}``, bools, strings, ints (under 1000 bits) and finite floats as
    themselves, anything else as its rendered string.

    Any depth the evaluator can build is written (:func:`write_nested` keeps its own stack);
    ``json.dumps`` of nested data recurses in C and fails on deep values.
    """
    return write_nested(v, _json_part)


def _exit_code(r: RunResult) -> int:
    if r.error is None:
        return 0
    return 2 if r.error.kind in ("syntax", "elaboration") else 1


def _cancel_on_sigint(session: Session) -> Callable[[int, FrameType | None], None]:
    def handler(_signum: int, _frame: FrameType | None) -> None:
        session.cancel("interrupted")

    return handler


def _run_interruptibly(session: Session, source: str) -> RunResult:
    """Run on a helper thread; Ctrl-C meanwhile becomes ``session.cancel`` (a SIGINT handler).

    No KeyboardInterrupt is raised during a run: one landing between two bytecodes of the wait
    escaped it, and the REPL exited with click's "Aborted!" (seen under load)."""
    box: list[RunResult] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append(session.run(source))
        except BaseException as e:  # an internal panic: re-raised on the main thread
            failure.append(e)
        finally:
            done.set()

    t = threading.Thread(target=target, name="ral-run", daemon=True)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _cancel_on_sigint(session)) if main else None
    try:
        t.start()
        # Wait on an Event, not Thread.join: an interrupt landing inside join() can leave
        # CPython 3.11's thread marked finished while it still runs (seen here: Ctrl-C during
        # `sleep 5` made the REPL read an empty result and crash).
        while not done.wait(0.1):
            pass
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    t.join()
    if failure:
        raise failure[0]
    return box[0]


def _show(r: RunResult) -> None:
    if r.stdout:
        sys.stdout.write(r.stdout)
        sys.stdout.flush()
    if r.stderr:
        sys.stderr.write(r.stderr)
    if r.error is not None:
        e = r.error
        sys.stderr.write(f"error: {e.line}:{e.col} {e.message}\n")
    elif not isinstance(r.value, Unit):
        click.echo(render(r.value))
    sys.stderr.flush()


def needs_more(text: str) -> bool:
    """Whether a REPL entry is unfinished: an open bracket or quote, or a trailing backslash."""
    if text.rstrip("\n").endswith("\\"):
        return True
    try:
        tokenize(text)
    except RalSyntaxError as e:
        return e.message.startswith(("unclosed", "unterminated"))
    return False


def _repl(session: Session) -> int:
    try:
        import readline
    except ImportError:  # pragma: no cover - platform without readline
        readline = None  # type: ignore[assignment]
    if readline is not None:
        try:
            os.makedirs(os.path.dirname(HISTORY), exist_ok=True)
            if os.path.exists(HISTORY):
                readline.read_history_file(HISTORY)
        except OSError:
            pass
    click.echo("ral — Ctrl-D to leave, Ctrl-C cancels a run", err=True)
    try:
        while True:
            try:
                text = input("ral> ")
                while needs_more(text):
                    text += "\n" + input("...> ")
            except EOFError:
                click.echo("", err=True)
                return 0
            except KeyboardInterrupt:
                click.echo("", err=True)
                continue
            if not text.strip():
                continue
            try:
                _show(_run_interruptibly(session, text))
            except KeyboardInterrupt:  # a Ctrl-C as the run ended, before the handler was in
                click.echo("", err=True)
    finally:
        if readline is not None:
            try:
                readline.write_history_file(HISTORY)
            except OSError:
                pass


def _bytes_through_stdio() -> None:
    """Read and write stdio with ``surrogateescape``, as Python already does in the C locale.

    Bytes that are not UTF-8 then survive: in a script on stdin they reach the lexer, which
    refuses them with their position (as it does for a ``-c`` argument, which Python decodes
    this way); in a value (an environment variable, a file name) they are written back out as
    the bytes they were. With a strict UTF-8 locale either one was a traceback.
    """
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # absent on a test runner's stream
        if reconfigure is not None:
            reconfigure(errors="surrogateescape")


@click.command("ral", context_settings=HELP_SETTINGS)
@click.option("-c", "script", metavar="SCRIPT", help="Run SCRIPT and exit.")
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the result.")
@grant_options
def ral_command(
    script: str | None,
    file: str | None,
    as_json: bool,
    grant_exec: tuple[str, ...],
    grant_root: tuple[str, ...],
) -> None:
    """Run ral: a REPL, a one-liner (-c), a FILE, or a script piped on stdin.

    \b
    Exit codes:
      0    success (the REPL: you left it with Ctrl-D)
      1    a ral error at run time, or the run was cancelled (Ctrl-C)
      2    refused before running (a syntax or elaboration error), or bad input
    """
    _bytes_through_stdio()
    grants = grants_from_flags(grant_exec, grant_root)
    session = Session(context=DynamicContext(grants=grants))
    try:
        if script is not None and file is not None:
            raise click.UsageError("give either -c SCRIPT or FILE, not both")
        if script is None and file is None and sys.stdin.isatty() and not as_json:
            sys.exit(_repl(session))
        if script is not None:
            source = script
        elif file is not None:
            try:
                with open(file, encoding="utf-8") as fh:
                    source = fh.read()
            except (OSError, UnicodeDecodeError) as e:
                click.echo(f"error: cannot read {file}: {e}", err=True)
                sys.exit(2)
        else:
            source = sys.stdin.read()
        r = _run_interruptibly(session, source)
        if as_json:
            err = r.error
            rest = {
                "stdout": r.stdout,
                "stderr": r.stderr,
                "error": None
                if err is None
                else {"message": err.message, "line": err.line, "col": err.col},
            }
            rest_text = _dumps(rest)
            click.echo('{"value": ' + json_text(r.value) + ", " + rest_text[1:])
        else:
            _show(r)
        sys.exit(_exit_code(r))
    finally:
        session.close()
