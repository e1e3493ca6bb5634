"""``--backend local|ray``, ``--ray-address``, ``--placement`` and the resource request
(``--num-cpus``, ``--resource NAME=AMOUNT``): where agent processes run.

``local`` (the default) keeps every agent on this machine (``--agents`` says thread or process);
``ray`` runs each agent as a Ray actor on a cluster (``actors/ray_backend.py``, implies
``--agents process``). Ray is an optional extra: without it ``--backend ray`` is refused with
the install line (exit 2), before any session directory is made.

The resource request is read where the backend is made (:func:`make_backend`), from the
command's context (``ctx.meta``), so every command with these options passes it on without
naming it; a scenario's ``[placement.PATTERN]`` tables narrow it per agent
(``runtime/fleet/placement.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

from exarch_actors.runtime.fleet.placement import (
    BadResourceRequest,
    PlacementPolicy,
    ResourceRequest,
)

F = TypeVar("F", bound=Callable[..., Any])

Backend = Literal["local", "ray"]

Agents = Literal["thread", "process"]

DEFAULT_AGENTS: Agents = "process"
"""Where agents run unless ``--agents`` says otherwise: each in an OS process of its own, so a
fleet uses every core and one agent's crash is contained (``thread`` stays selectable)."""

AGENTS_HELP = (
    "Run each agent on a thread of this process, or in an OS process of its own "
    "(supervised: a crashed agent is restarted from its files)."
)


def agents_option(*, inherit: bool = False) -> Callable[[F], F]:
    """``--agents thread|process`` (``run``, ``fleet``, ``chat``, ``resume``); ``inherit``: no
    default (``resume`` keeps what ``run.json`` says unless told otherwise)."""

    def add(fn: F) -> F:
        return click.option(
            "--agents",
            type=click.Choice(["thread", "process"]),
            default=None if inherit else DEFAULT_AGENTS,
            show_default=not inherit,
            help=AGENTS_HELP + (" Default: the run's own, from run.json." if inherit else ""),
        )(fn)

    return add


REQUEST_META = "exarch.resource-request"
"""Where ``--num-cpus`` and ``--resource`` leave the command line's base request."""


def _request(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    num_cpus, resources = ctx.meta.get(REQUEST_META, (None, ()))
    if param.name == "num_cpus":
        num_cpus = value
    else:
        resources = tuple(value)
    try:
        PlacementPolicy.of(num_cpus, resources)
    except BadResourceRequest as e:
        raise click.BadParameter(str(e), ctx, param) from None
    ctx.meta[REQUEST_META] = (num_cpus, resources)


def backend_options(fn: F) -> F:
    """The options, in ``--help`` order."""
    fn = click.option(
        "--resource",
        metavar="NAME=AMOUNT",
        multiple=True,
        expose_value=False,
        callback=_request,
        help="--backend ray: a custom Ray resource each agent's host reserves on its node "
        "(repeatable; a scenario's [placement.PATTERN] tables set it per agent).",
    )(fn)
    fn = click.option(
        "--num-cpus",
        type=click.FloatRange(min=0),
        expose_value=False,
        callback=_request,
        help="--backend ray: CPUs each agent's host reserves on its node (default 0).",
    )(fn)
    fn = click.option(
        "--placement",
        type=click.Choice(["spread", "pack"]),
        help="--backend ray: spread agents over the nodes (default: each new agent on the "
        "node with the fewest of the run's), or pack them (on the node with the most).",
    )(fn)
    fn = click.option(
        "--ray-address",
        metavar="HOST:PORT|auto",
        help="--backend ray: the cluster's head (`auto`: Ray's own discovery); "
        "none: start a local Ray instance for this run.",
    )(fn)
    fn = click.option(
        "--backend",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="Where agent processes run: this machine, or a Ray cluster (each agent a Ray "
        "actor; implies --agents process; needs pip install -e '.[ray]').",
    )(fn)
    return fn


def check_backend(
    backend: Backend, address: str | None = None, placement: str | None = None
) -> None:
    """Exit 2 with the install line when ``--backend ray`` cannot import Ray, and when a Ray
    option comes without ``--backend ray`` (it would be ignored in silence)."""
    if backend != "ray":
        if address is not None or placement is not None:
            flag = "--ray-address" if address is not None else "--placement"
            raise click.UsageError(f"{flag} needs --backend ray")
        if not _base_request().empty:
            raise click.UsageError("--num-cpus and --resource need --backend ray")
        return
    from exarch_actors.actors.ray_backend import RayNotInstalled, require_ray

    try:
        require_ray()
    except RayNotInstalled as e:
        raise click.UsageError(str(e)) from None


def _base_request() -> ResourceRequest:
    ctx = click.get_current_context(silent=True)
    num_cpus, resources = ctx.meta.get(REQUEST_META, (None, ())) if ctx else (None, ())
    return PlacementPolicy.of(num_cpus, resources).base


def make_backend(
    backend: Backend,
    address: str | None,
    placement: str | None,
    tables: tuple[tuple[str, ResourceRequest], ...] = (),
) -> Any:
    """The fleet's ``HostBackend``: None for ``local``. ``tables``: the scenario's
    ``[placement.PATTERN]`` requests, over the command line's."""
    if backend != "ray":
        return None
    from exarch_actors.actors.ray_backend import RayBackend

    check_backend(backend, address, placement)
    requests = PlacementPolicy(_base_request(), tables)
    hosts = RayBackend(address, "pack" if placement == "pack" else "spread", requests)
    try:
        hosts.connect()  # on this (the main) thread, before any UI or pool thread asks for one
    except Exception as e:
        where = f"the cluster at {address}" if address else "a local Ray instance"
        reason = f"{type(e).__name__}: {e}"
        raise BackendUnreachable(f"--backend ray: cannot join {where}: {reason}") from e
    return hosts


class BackendUnreachable(click.ClickException):
    """``--backend ray`` could not join its cluster (exit 2, before any agent starts)."""

    exit_code = 2
