"""Providers: one interface (``base``), the embedded ``scripted`` default, ``openai``,
``anthropic``.

:func:`make_provider` is the one constructor the CLI and the agent use. For a fork, seed the
child's handle with ``parent_handle.current().for_agent(child_name)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from exarch_actors.runtime.errors import ExarchError
from exarch_actors.runtime.providers.base import Provider
from exarch_actors.runtime.providers.scenario import Scenario, load_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback

if TYPE_CHECKING:
    from exarch_actors.runtime.providers.http import HttpStreamingProvider

PROVIDER_NAMES = ("scripted", "openai", "anthropic")


class UnknownProvider(ExarchError):
    """A provider name outside :data:`PROVIDER_NAMES`, or one missing what it needs."""


def make_provider(
    name: str = "scripted",
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    scenario: Scenario | ScenarioPlayback | str | Path | None = None,
    agent_name: str = "trunk",
    **options: Any,
) -> Provider:
    """Build a provider.

    ``scripted`` needs ``scenario`` (a parsed :class:`Scenario`, a shared
    :class:`ScenarioPlayback`, or a path); the result plays ``agent_name``'s script. ``openai`` and
    ``anthropic`` need ``model``; ``options`` go to their constructors (``connect_timeout``,
    ``read_timeout``, ``max_retries``, ``backoff_base``, ``backoff_max``, ``max_tokens``,
    ``window_tokens``, ...). With no key (``api_key``, else the provider's variable) for the
    hosted service they raise :class:`UnknownProvider` at once. ``traffic`` (a
    :class:`~runtime.providers.traffic.TrafficLimits`) gives the provider a traffic governor of
    its own (``runtime/providers/governor.py``), shared by every agent it is handed to: a run
    makes its base provider once, so that is one governor per run.
    """
    traffic = options.pop("traffic", None)
    if traffic is not None and name != "scripted":
        from exarch_actors.runtime.providers.governor import Governor

        options["governor"] = Governor(traffic)
    if name == "scripted":
        if scenario is None:
            raise UnknownProvider("the scripted provider needs a scenario file")
        if isinstance(scenario, ScenarioPlayback):
            playback = scenario
        elif isinstance(scenario, Scenario):
            playback = ScenarioPlayback(scenario)
        else:
            playback = ScenarioPlayback(load_scenario(scenario))
        return playback.provider(agent_name)
    if name == "openai":
        from exarch_actors.runtime.providers.openai import OpenAIProvider

        if not model:
            raise UnknownProvider("the openai provider needs --model")
        return _keyed(OpenAIProvider(model=model, base_url=base_url, api_key=api_key, **options))
    if name == "anthropic":
        from exarch_actors.runtime.providers.anthropic import AnthropicProvider

        if not model:
            raise UnknownProvider("the anthropic provider needs --model")
        return _keyed(AnthropicProvider(model=model, base_url=base_url, api_key=api_key, **options))
    raise UnknownProvider(f"unknown provider {name!r}; expected one of {', '.join(PROVIDER_NAMES)}")


def _keyed(provider: HttpStreamingProvider) -> Provider:
    """Refuse a hosted service with no key at once: retrying a request that cannot succeed
    only hides the reason (a local server at another base URL may need no key)."""
    if provider.missing_key is not None:
        raise UnknownProvider(provider.missing_key)
    return provider
