"""``exarch-actors chat`` (and ``exarch-actors`` with no arguments): talk to a conversing trunk.

The trunk is interactive: it parks Held for its human between turns and never ends on its own;
``/branch`` opens conversing peers, sub-agents get read-only tabs. With a ``SCENARIO.toml`` the
scripted provider plays the trunk's (and every other agent's) replies, so the UI can be tried
and tested with no network; a scenario's ``[fleet] prompt`` is sent only with
``--send-prompt``. Quitting (Ctrl-C twice, ``/quit``, or the trunk ending) cancels every agent
and closes the fleet; ``result.json`` records the trunk's outcome.
"""

from __future__ import annotations

from importlib import resources

import click

from cli.runner import RunSpec, open_session, provider_factory, read_scenario, session_path
from runtime.providers import PROVIDER_NAMES


@click.command("chat")
@click.argument("scenario", required=False, metavar="[SCENARIO.toml]")
@click.option(
    "--provider",
    type=click.Choice(PROVIDER_NAMES),
    default=None,
    help="Model provider (default: scripted with a SCENARIO; no SCENARIO and no --model: the "
    "packaged scripted demo; else openai).",
)
@click.option("--model", help="Model name for openai/anthropic.")
@click.option("--base-url", help="Endpoint base URL (local servers: llama.cpp, vLLM, Ollama).")
@click.option("--api-key", envvar="EXARCH_API_KEY", help="API key (else the provider's env var).")
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the run.")
@click.option("--send-prompt", is_flag=True, help="Send the scenario's [fleet] prompt first.")
@click.option("--window-tokens", type=click.IntRange(min=1), help="The model's context window.")
@click.option("--disk-warn-bytes", type=click.IntRange(min=1), help="Warn past this many bytes.")
def chat_command(
    scenario: str | None,
    provider: str | None,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    session_dir: str | None,
    send_prompt: bool,
    window_tokens: int | None,
    disk_warn_bytes: int | None,
) -> None:
    """Talk to an interactive trunk in a terminal UI: one tab per agent."""
    from actors.fleet import Fleet, FleetConfig
    from cli.tui.app import ChatApp

    if provider is None and scenario is None and model is None:
        # Nothing chosen: the packaged scripted demo, so the bare command always opens the UI.
        scenario = str(resources.files("cli.tui").joinpath("demo.toml"))
        click.echo("no model given: playing the scripted demo (see --provider / --model)", err=True)
    if provider is None:
        provider = "scripted" if scenario is not None else "openai"
    loaded = read_scenario(scenario) if scenario is not None else None
    if send_prompt and (loaded is None or not loaded.prompt):
        raise click.UsageError("--send-prompt needs a scenario with a [fleet] prompt")
    spec = RunSpec(
        provider=provider,
        prompt=None,
        scenario=loaded if provider == "scripted" else None,
        model=model,
        base_url=base_url,
        api_key=api_key,
        session_dir=session_dir,
        disk_warn_bytes=disk_warn_bytes,
        window_tokens=window_tokens,
    )
    try:
        factory = provider_factory(spec)  # a bad flag or a missing key fails before the screen
    except click.UsageError as e:
        if scenario is not None:
            raise
        raise click.UsageError(
            f"{e.message}\n(no model at hand? a scripted conversation needs no network: "
            "exarch-actors chat examples/chat.toml)"
        ) from None
    prompt = loaded.prompt if send_prompt and loaded is not None else None
    system = loaded.system if loaded is not None else None
    session = open_session(session_dir)
    fleet = Fleet(session, factory, FleetConfig(disk_warn_bytes=disk_warn_bytes))
    app = ChatApp(fleet, start=lambda f: f.start_trunk(prompt, interactive=True, system=system))
    try:
        app.run()
    finally:
        app.control.close_fleet("quit")  # idempotent: a no-op when the app already closed it
    trunk = fleet.trunk
    outcome = (
        trunk.outcome.value if trunk is not None and trunk.outcome is not None else "cancelled"
    )
    fleet.write_result(outcome, None)
    click.echo(f"session: {session_path(session)}", err=True)
