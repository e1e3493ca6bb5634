"""``--otlp-endpoint URL``: OpenTelemetry export of a run's spans (``runtime/observe/otel.py``),
on ``run``, ``fleet``, ``chat``, ``resume`` and ``trace``.

The flag names the collector's OTLP/HTTP base URL (``http://localhost:4318``; ``/v1/traces`` is
added), as the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` does; without the flag that variable (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) turns the export on. The packages are an optional extra:
the flag without them is refused (exit 2, naming the extra); the variable without them is a
warning, since it may be set for other programs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from exarch_actors.runtime.observe.otel import (
    INSTALL,
    OtelMissing,
    endpoint_from_env,
    otel_available,
)

F = TypeVar("F", bound=Callable[..., Any])

HELP = (
    "Export the run's spans live to this OpenTelemetry collector (OTLP over HTTP, base URL, "
    "e.g. http://localhost:4318), following the GenAI semantic conventions; default: "
    f"$OTEL_EXPORTER_OTLP_ENDPOINT. Needs the otel extra ({INSTALL})."
)


def otlp_endpoint_option(help_text: str = HELP) -> Callable[[F], F]:
    return click.option("--otlp-endpoint", metavar="URL", default=None, help=help_text)


def require_otel() -> None:
    """Refuse (exit 2) when the OpenTelemetry packages are missing."""
    if not otel_available():
        raise click.UsageError(str(OtelMissing()))


def live_endpoint(flag: str | None) -> str | None:
    """The collector a run exports to: the flag (refused without the extra), else the standard
    variables (a warning and no export without the extra), else None."""
    if flag:
        if not flag.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{flag!r}: give the collector's URL, e.g. http://localhost:4318",
                param_hint="--otlp-endpoint",
            )
        require_otel()
        return flag
    env = endpoint_from_env()
    if env and not otel_available():
        click.echo(f"warning: {OtelMissing()}; not exporting to {env}", err=True)
        return None
    return env
