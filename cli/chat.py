"""``exarch-actors chat`` (and ``exarch-actors`` with no arguments): talk to a conversing trunk.

The trunk is interactive: it parks Held for its human between turns and never ends on its own;
``/branch`` opens conversing peers, sub-agents get read-only tabs. With a ``SCENARIO.toml`` the
scripted provider plays the trunk's (and every other agent's) replies, so the UI can be tried
and tested with no network; a scenario's ``[fleet] prompt`` is sent only with
``--send-prompt``. Quitting (Ctrl-C twice, ``/quit``, or the trunk ending) cancels every agent
and closes the fleet; ``result.json`` records the trunk's outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

import click

from exarch_actors.cli import HELP_SETTINGS
from exarch_actors.cli.backend_options import (
    Agents,
    Backend,
    agents_option,
    backend_options,
    check_backend,
    make_backend,
)
from exarch_actors.cli.config import with_config
from exarch_actors.cli.durability import durability_option
from exarch_actors.cli.grants import fleet_policy, grant_options
from exarch_actors.cli.limits import limit_options, sandboxed
from exarch_actors.cli.mcp_options import check_grants, mcp_options, run_servers
from exarch_actors.cli.otlp import live_endpoint, otlp_endpoint_option
from exarch_actors.cli.provider_options import ProviderChoice, provider_options
from exarch_actors.cli.recording import open_recording, record_option
from exarch_actors.cli.runner import (
    RunSpec,
    open_session,
    provider_factory,
    read_scenario,
    secret_policy,
    session_path,
)
from exarch_actors.runtime.mcp.config import McpServer
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.prices import PriceTable
from exarch_actors.runtime.shell.limits import ShellLimits
from exarch_actors.runtime.state.durability import Durability


@click.command("chat", context_settings=HELP_SETTINGS)
@click.argument("scenario", required=False, metavar="[SCENARIO.toml]")
@provider_options(
    "Model provider (default: scripted with a SCENARIO; no SCENARIO and no --model: the "
    "packaged scripted demo; else openai)."
)
@click.option("--session-dir", type=click.Path(file_okay=False), help="Where to write the run.")
@click.option("--send-prompt", is_flag=True, help="Send the scenario's [fleet] prompt first.")
@click.option("--window-tokens", type=click.IntRange(min=1), help="The model's context window.")
@click.option("--disk-warn-bytes", type=click.IntRange(min=1), help="Warn past this many bytes.")
@grant_options
@mcp_options
@limit_options
@record_option
@durability_option()
@agents_option()
@backend_options
@otlp_endpoint_option()
def chat_command(
    scenario: str | None,
    connection: ProviderChoice,
    session_dir: str | None,
    send_prompt: bool,
    window_tokens: int | None,
    disk_warn_bytes: int | None,
    grant_exec: tuple[str, ...],
    grant_root: tuple[str, ...],
    mcp: tuple[McpServer, ...],
    grant_mcp: tuple[str, ...],
    limits: ShellLimits,
    record: str | None,
    durability: Durability,
    agents: Agents,
    backend: Backend,
    ray_address: str | None,
    placement: str | None,
    otlp_endpoint: str | None,
) -> None:
    """Talk to an interactive trunk in a terminal UI: one tab per agent. With no SCENARIO and
    no --model (and so a bare `exarch-actors`) it plays a packaged scripted demo: no network,
    no key. Enter sends; a line starting with `/` is a command (/branch, /clear, /compact,
    /model NAME, /resources, /close, /quit); Esc interrupts the focused agent; Ctrl-C twice
    quits. Every agent (the trunk too) runs in an OS process of its own (--agents process,
    the default); --agents thread runs them as threads of this one; --backend ray starts each
    agent's process on a node of a Ray cluster (docs/scale-out.md). See docs/chat.md.

    \b
    Exit codes:
      0    you quit (result.json records the trunk's outcome)
      2    bad input: an unreadable scenario, a bad flag, no API key for the hosted service,
           --backend ray without Ray installed
    """
    from exarch_actors.actors.fleet import Fleet, FleetConfig
    from exarch_actors.actors.mcp_site import McpSetup
    from exarch_actors.cli.tui.app import ChatApp

    check_backend(backend, ray_address, placement)
    connection = with_config(connection, scenario=scenario is not None)
    provider, model = connection.provider, connection.model
    intro = None
    if provider is None and scenario is None and model is None:
        # Nothing chosen: the packaged scripted demo, so the bare command always opens the UI.
        scenario = str(resources.files("exarch_actors.cli.tui").joinpath("demo.toml"))
        intro = "no model given: this is the scripted demo (see --provider / --model)"
        click.echo("no model given: playing the scripted demo (see --provider / --model)", err=True)
    if provider is None:
        provider = "scripted" if scenario is not None else "openai"
    loaded = read_scenario(scenario) if scenario is not None else None
    if send_prompt and (loaded is None or not loaded.prompt):
        raise click.UsageError("--send-prompt needs a scenario with a [fleet] prompt")
    limits = sandboxed(limits, provider)
    spec = RunSpec(
        provider=provider,
        prompt=None,
        limits=limits,
        scenario=loaded if provider == "scripted" else None,
        model=model,
        base_url=connection.base_url,
        api_key=connection.api_key,
        session_dir=session_dir,
        disk_warn_bytes=disk_warn_bytes,
        window_tokens=window_tokens,
        provider_options=connection.network_options(provider),
        record=record,
        durability=durability,
    )
    servers = run_servers(mcp, loaded)
    check_grants(grant_mcp, servers)
    grants = fleet_policy(grant_exec, grant_root, spec.scenario, grant_mcp)
    try:
        made = provider_factory(spec)  # a bad flag or a missing key fails before the screen
    except click.UsageError as e:
        if scenario is not None:
            raise
        raise click.UsageError(
            f"{e.message}\n(no model at hand? a scripted conversation needs no network: "
            "exarch-actors chat examples/chat.toml)"
        ) from None
    factory: Callable[[str], Provider] = made
    prompt = loaded.prompt if send_prompt and loaded is not None else None
    system = loaded.system if loaded is not None else None
    session, lock = open_session(session_dir)
    try:
        recording = open_recording(
            spec, session, factory, prompt=prompt, system=system, interactive=True
        )
    except BaseException:
        lock.release()
        raise
    if recording is not None:
        factory = recording.factory
    hosts = make_backend(
        backend, ray_address, placement, loaded.placement if loaded is not None else ()
    )
    try:
        fleet = Fleet(
            session,
            factory,
            FleetConfig(
                disk_warn_bytes=disk_warn_bytes,
                grants=grants,
                limits=limits,
                durability=durability,
                agents="process" if hosts is not None else agents,
                backend=hosts,
                traffic=made.governor,
                prices=PriceTable().free_of_charge() if provider == "scripted" else PriceTable(),
                secrets=secret_policy(connection.secret_env, loaded, connection.api_key),
                mcp=McpSetup(
                    servers,
                    loaded.mcp_replies if loaded is not None else {},
                    recording.recorder.mcp_reply if recording is not None else None,
                ),
                otlp_endpoint=live_endpoint(otlp_endpoint),
            ),
        )
        app = ChatApp(
            fleet,
            start=lambda f: f.start_trunk(prompt, interactive=True, system=system),
            intro=intro,
        )
        try:
            app.run()
        finally:
            app.control.close_fleet("quit")  # idempotent: a no-op when the app already closed it
    finally:
        if hosts is not None:
            hosts.close()
        if recording is not None:
            recording.close()
        if made.governor is not None:
            made.governor.close()
    trunk = fleet.trunk
    outcome = (
        trunk.outcome.value if trunk is not None and trunk.outcome is not None else "cancelled"
    )
    fleet.write_result(outcome, None)
    lock.release()
    click.echo(f"session: {session_path(session)}", err=True)
