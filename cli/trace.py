"""``exarch-actors trace SESSION_DIR``: the session as a Chrome trace / Perfetto JSON
(``runtime/observe/chrome_trace.py``), optionally also sent to an OpenTelemetry collector.

Exit codes: 0 when the trace was written, 2 when the path is not a session directory (or the
OpenTelemetry extra is missing for ``--otlp-endpoint``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.cli.otlp import otlp_endpoint_option, require_otel
from exarch_actors.runtime.observe.chrome_trace import dumps
from exarch_actors.runtime.observe.spans import NotASessionDir, read_view
from exarch_actors.runtime.state.session_dir import SessionDir


@click.command("trace", context_settings=HELP_SETTINGS)
@click.argument("session_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the trace here (default: stdout).",
)
@otlp_endpoint_option(
    "Also send the session's spans to this OpenTelemetry collector (OTLP over HTTP), as "
    "`run --otlp-endpoint` would have sent them live."
)
def trace_command(session_dir: str, output: str | None, otlp_endpoint: str | None) -> None:
    """Write SESSION_DIR as a Chrome trace (JSON) that ui.perfetto.dev and chrome://tracing
    open as is: one track per agent in spawn-tree order (named by its path, `trunk/lo`), with
    its incarnations, turns, model requests (tokens, cost, latency, attempts, rate-limit wait)
    and ral calls (first line, duration, error) nested, instants for spawns, cancels,
    rollbacks, restarts, reaps, errors and rejected messages, and flow arrows from each spawn
    to the child and from each child's end back to its parent. A resumed session is one trace.

    \b
    Exit codes:
      0    the trace was written
      2    the path is not a session directory; --otlp-endpoint without the otel extra
    """
    try:
        view = read_view(SessionDir(Path(session_dir)))
    except NotASessionDir as e:
        raise click.UsageError(str(e)) from None
    text = dumps(view)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        Path(output).write_text(text + "\n", encoding="utf-8")
        counts = f"{len(view.agents)} agents, {len(view.spans)} spans"
        click.echo(f"trace: {output} ({counts})", err=True)
    if otlp_endpoint is not None:
        require_otel()
        from exarch_actors.runtime.observe.otel import export_session

        sent = export_session(SessionDir(Path(session_dir)), otlp_endpoint)
        click.echo(f"otlp: {sent} spans sent to {otlp_endpoint}", err=True)
