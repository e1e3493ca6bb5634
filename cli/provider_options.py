"""The model-provider options every running command shares (``run``, ``fleet``, ``chat``,
``resume``), declared once as a click decorator so the commands cannot drift apart.

:func:`provider_options` adds ``--provider``, ``--model``, ``--base-url``, ``--api-key``,
``--timeout``, ``--retries`` and ``--secret-env`` (the variables kept from every shell with the
provider's keys) and hands them to the command as one frozen
:class:`ProviderChoice` (keyword ``connection``), so a command's signature does not grow with
every provider flag. Where a value comes from when a flag is absent is the provider's own rule
(``runtime/providers/http.py``): the key from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``, the
endpoint from ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``, else the hosted service.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import click

from exarch_actors.runtime.credentials import valid_name
from exarch_actors.runtime.providers import PROVIDER_NAMES
from exarch_actors.runtime.providers.traffic import TrafficLimits

F = TypeVar("F", bound=Callable[..., Any])

KEY_HELP = (
    "API key (else OPENAI_API_KEY / ANTHROPIC_API_KEY; a local server at --base-url needs none)."
)


SECRET_HELP = (
    "Keep environment variable NAME out of every agent's shell and the programs it runs "
    "(repeatable). The provider's keys (OPENAI_API_KEY, ANTHROPIC_API_KEY, any *_API_KEY, the "
    "--api-key value wherever it appears) are always kept out."
)


def _secret_names(names: tuple[str, ...]) -> tuple[str, ...]:
    bad = [n for n in names if not valid_name(n)]
    if bad:
        raise click.UsageError(f"--secret-env {bad[0]!r}: not an environment variable's name")
    return tuple(names)


@dataclass(frozen=True)
class ProviderChoice:
    """The provider flags as given; ``None`` means "not given" (a default applies)."""

    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float | None = None
    retries: int | None = None
    rpm: float | None = None
    input_tpm: float | None = None
    output_tpm: float | None = None
    tpm: float | None = None
    max_inflight: int | None = None
    rate_wait: float | None = None
    secret_env: tuple[str, ...] = ()
    """``--secret-env NAME`` (repeatable): variables no shell may see besides the provider's
    keys (``runtime/credentials.py``)."""

    @property
    def network_flags(self) -> tuple[str, ...]:
        """The network-only flags that were given (for refusing them on ``scripted``)."""
        given = (
            ("--timeout", self.timeout),
            ("--retries", self.retries),
            ("--rpm", self.rpm),
            ("--input-tpm", self.input_tpm),
            ("--output-tpm", self.output_tpm),
            ("--tpm", self.tpm),
            ("--max-inflight", self.max_inflight),
            ("--rate-wait", self.rate_wait),
        )
        return tuple(flag for flag, value in given if value is not None)

    @property
    def traffic(self) -> TrafficLimits:
        """The traffic governor's limits as given; what is not given is learned from the wire."""
        wait = TrafficLimits().max_wait if self.rate_wait is None else self.rate_wait
        return TrafficLimits(
            self.rpm, self.input_tpm, self.output_tpm, self.tpm, self.max_inflight, wait
        )

    def network_options(self, provider: str) -> tuple[tuple[str, Any], ...]:
        """The network flags as provider options (``traffic``: the run's governor's limits,
        always present for a network provider, so every run of one is governed); refused for
        the scripted provider, which has no network (a flag that silently did nothing would
        hide a mistake)."""
        if provider == "scripted":
            flags = self.network_flags
            if flags:
                verb = "applies" if len(flags) == 1 else "apply"
                raise click.UsageError(
                    f"{', '.join(flags[:-1])}{' and ' if len(flags) > 1 else ''}{flags[-1]} "
                    f"{verb} to the network providers only"
                )
            return ()
        options: list[tuple[str, Any]] = []
        if self.timeout is not None:
            options.append(("read_timeout", self.timeout))
            options.append(("connect_timeout", self.timeout))
        if self.retries is not None:
            options.append(("max_retries", self.retries))
        options.append(("traffic", self.traffic))
        return tuple(options)


_FIELDS = tuple(f.name for f in fields(ProviderChoice))


def provider_options(provider_help: str | None) -> Callable[[F], F]:
    """Add the shared provider flags; the command receives them as ``connection``.

    ``provider_help`` is the command's own ``--provider`` text (each command has its own
    default: a scenario means ``scripted``, a prompt ``openai``); ``None`` leaves ``--provider``
    out (``resume``: a run resumes on the provider its ``run.json`` names)."""
    options = (
        [
            click.option(
                "--provider", type=click.Choice(PROVIDER_NAMES), default=None, help=provider_help
            )
        ]
        if provider_help is not None
        else []
    )
    options += [
        click.option("--model", help="Model name for openai/anthropic."),
        click.option(
            "--base-url",
            help="Endpoint base URL, e.g. a local server: http://127.0.0.1:8080/v1 "
            "(llama.cpp, vLLM, Ollama).",
        ),
        click.option("--api-key", help=KEY_HELP),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True),
            help="Network providers: seconds to wait for the next byte of a reply (default 120).",
        ),
        click.option(
            "--retries",
            type=click.IntRange(min=0),
            help="Network providers: extra attempts on 408/5xx and transport failures "
            "(default 4; 401/403 and other 4xx are never retried; a 429 is a wait, not an "
            "attempt: see --rpm).",
        ),
        click.option(
            "--rpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Traffic governor: requests per minute for the whole fleet, per endpoint and "
            "model (default: learned from the server's rate-limit headers).",
        ),
        click.option(
            "--input-tpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Traffic governor: input tokens per minute for the whole fleet "
            "(default: learned).",
        ),
        click.option(
            "--output-tpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Traffic governor: output tokens per minute for the whole fleet (default: "
            "learned).",
        ),
        click.option(
            "--tpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Traffic governor: input and output tokens per minute together (OpenAI's TPM; "
            "default: learned).",
        ),
        click.option(
            "--max-inflight",
            type=click.IntRange(min=1),
            help="Traffic governor: requests in flight at once for the whole fleet (default: "
            "no cap).",
        ),
        click.option(
            "--rate-wait",
            type=click.FloatRange(min=0),
            help="Seconds one request may wait for the rate limit in all before it fails "
            "(default 600).",
        ),
    ]

    options.append(
        click.option(
            "--secret-env",
            multiple=True,
            metavar="NAME",
            help=SECRET_HELP,
        )
    )

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name, None) for name in _FIELDS}
            given["secret_env"] = _secret_names(given.get("secret_env") or ())
            choice = ProviderChoice(**given)
            return f(*args, connection=choice, **kwargs)

        wrapped: Any = command
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped

    return decorate


def output_options(f: F) -> F:
    """``--json`` and ``--quiet``, shared by the commands that print a run's outcome."""
    f = click.option(
        "--quiet",
        "-q",
        is_flag=True,
        help="For scripts: only the reply on stdout; on stderr only warnings and the error.",
    )(f)
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print exactly one JSON object on stdout (outcome, reply, session, error, ...).",
    )(f)
