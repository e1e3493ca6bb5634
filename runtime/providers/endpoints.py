"""Where each network provider talks by default, and when it needs an API key.

The rule the CLI applies before any request (docs/providers.md): **a key is required only when
the endpoint is the provider's default public API** (``https://api.openai.com/v1``,
``https://api.anthropic.com``). Any other ``--base-url`` — llama.cpp, vLLM or Ollama on this
machine or the LAN, a proxy — may need none, so a missing key is not refused up front; a server
that does want one answers 401, and that error names the key's environment variable.
"""

from __future__ import annotations

from urllib.parse import urlsplit

OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"

DEFAULT_BASE_URLS: dict[str, str] = {"openai": OPENAI_BASE_URL, "anthropic": ANTHROPIC_BASE_URL}
"""The endpoint each network provider uses when ``--base-url`` is not given."""


def api_key_required(provider: str, base_url: str | None) -> bool:
    """Whether ``provider`` at ``base_url`` (``None``: its default) must be given an API key.

    True only for a network provider whose endpoint is its default public API (compared by host
    name, so ``https://api.openai.com/v1/`` and ``https://API.openai.com/v1`` count too)."""
    default = DEFAULT_BASE_URLS.get(provider)
    if default is None:
        return False  # the scripted provider, or a name make_provider refuses anyway
    if base_url is None or not base_url.strip():
        return True
    try:
        host = urlsplit(base_url.strip()).hostname
    except ValueError:
        return False  # not a URL: the provider's own check reports it
    return host is not None and host == urlsplit(default).hostname
