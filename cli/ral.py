"""``exarch-actors ral``: a REPL, a one-liner (``-c``), a file, or a script on stdin.

Exit status: 0 success, 1 ral error (runtime or cancelled), 2 refused before running (syntax or
elaboration) or bad input. ``--json`` prints exactly one JSON object
``{"value", "stdout", "stderr", "error"}``. Grants are full by default; ``--grant-exec`` and
``--grant-root`` narrow them. Ctrl-C cancels the run in flight (the REPL then continues); the REPL
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

from runtime.ral.context import DynamicContext, Grants
from runtime.ral.errors import RalSyntaxError
from runtime.ral.lexer import tokenize
from runtime.ral.session import RunResult, Session
from runtime.ral.values import Unit, Variant, render

HISTORY = os.path.join(os.path.expanduser("~"), ".exarch", "ral_history")


def to_json(v: Any) -> Any:
    """maps -> objects, lists -> arrays, unit -> null, variant -> {tag, payload}, else rendered."""
    t = type(v)
    if t is dict:
        return {k: to_json(x) for k, x in v.items()}
    if t is list:
        return [to_json(x) for x in v]
    if t is Unit:
        return None
    if t is Variant:
        return {"tag": v.tag, "payload": to_json(v.payload)}
    if t is bool or t is str:
        return v
    if t is int:
        return v if abs(v) < (1 << 1000) else render(v)
    if t is float:
        return v if math.isfinite(v) else render(v)
    return render(v)


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


def _show(r: RunResult, *, repl: bool = False) -> None:
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
                _show(_run_interruptibly(session, text), repl=True)
            except KeyboardInterrupt:  # a Ctrl-C as the run ended, before the handler was in
                click.echo("", err=True)
    finally:
        if readline is not None:
            try:
                readline.write_history_file(HISTORY)
            except OSError:
                pass


@click.command("ral")
@click.option("-c", "script", metavar="SCRIPT", help="Run SCRIPT and exit.")
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the result.")
@click.option("--grant-exec", multiple=True, metavar="PROG", help="Allow only these programs.")
@click.option("--grant-root", multiple=True, metavar="DIR", help="Confine file builtins here.")
def ral_command(
    script: str | None,
    file: str | None,
    as_json: bool,
    grant_exec: tuple[str, ...],
    grant_root: tuple[str, ...],
) -> None:
    """Run ral: a REPL, a one-liner (-c), a FILE, or a script piped on stdin."""
    grants = Grants(
        frozenset(grant_exec) if grant_exec else None,
        tuple(os.path.abspath(r) for r in grant_root) if grant_root else None,
    )
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
            out = {
                "value": to_json(r.value),
                "stdout": r.stdout,
                "stderr": r.stderr,
                "error": None
                if err is None
                else {"message": err.message, "line": err.line, "col": err.col},
            }
            click.echo(json.dumps(out, ensure_ascii=False))
        else:
            _show(r)
        sys.exit(_exit_code(r))
    finally:
        session.close()
