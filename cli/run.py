"""``exarch-actors run``: a headless trunk that ends at quiescence and prints its reply."""

from __future__ import annotations

import json
import sys

import click

from cli.limits import limit_options
from cli.runner import RunSpec, read_scenario, run_headless, session_path
from runtime.limits import ShellLimits
from runtime.providers import PROVIDER_NAMES


@click.command("run")
@click.argument("target", metavar="SCENARIO.toml|PROMPT")
@click.option(
    "--provider",
    type=click.Choice(PROVIDER_NAMES),
    default=None,
    help="Model provider (default: scripted for a .toml target, else openai).",
)
@click.option("--model", help="Model name for openai/anthropic.")
@click.option("--base-url", help="Endpoint base URL (local servers: llama.cpp, vLLM, Ollama).")
@click.option("--api-key", envvar="EXARCH_API_KEY", help="API key (else the provider's env var).")
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the run.")
@click.option("--chat", is_flag=True, help="No system prompt and no tool: a bare conversation.")
@click.option("--disk-warn-bytes", type=click.IntRange(min=1), help="Warn past this many bytes.")
@click.option("--window-tokens", type=click.IntRange(min=1), help="The model's context window.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Network providers: seconds to wait for the next byte of a reply (default 120).",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    help="Network providers: extra attempts on 408/429/5xx/transport failures (default 4).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@limit_options
def run_command(
    target: str,
    provider: str | None,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    session_dir: str | None,
    chat: bool,
    disk_warn_bytes: int | None,
    window_tokens: int | None,
    timeout: float | None,
    retries: int | None,
    as_json: bool,
    limits: ShellLimits,
) -> None:
    """Run a headless trunk on a scenario file (scripted) or a prompt (network provider)."""
    is_scenario = target.endswith(".toml")
    if provider is None:
        provider = "scripted" if is_scenario else "openai"
    scenario = read_scenario(target) if provider == "scripted" else None
    spec = RunSpec(
        provider=provider,
        prompt=None if scenario is not None else target,
        scenario=scenario,
        model=model,
        base_url=base_url,
        api_key=api_key,
        session_dir=session_dir,
        chat=chat,
        disk_warn_bytes=disk_warn_bytes,
        window_tokens=window_tokens,
        provider_options=_network_options(provider, timeout, retries),
        limits=limits,
    )
    result = run_headless(spec)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "outcome": result.outcome,
                    "reply": result.reply,
                    "session": str(result.session.root),
                    "fleetYield": result.fleet_yield.to_json(),
                }
            )
        )
    else:
        click.echo(f"session: {session_path(result.session)}", err=True)
        click.echo(f"outcome: {result.outcome}", err=True)
        if result.reply is not None:
            click.echo(result.reply)
    sys.exit(result.exit_code)


def _network_options(
    provider: str, timeout: float | None, retries: int | None
) -> tuple[tuple[str, float | int], ...]:
    """``--timeout`` / ``--retries`` as provider options; refused for the scripted provider,
    which has no network (a flag that silently did nothing would hide a mistake)."""
    options: list[tuple[str, float | int]] = []
    if timeout is not None:
        options.append(("read_timeout", timeout))
        options.append(("connect_timeout", timeout))
    if retries is not None:
        options.append(("max_retries", retries))
    if options and provider == "scripted":
        raise click.UsageError("--timeout and --retries apply to the network providers only")
    return tuple(options)
