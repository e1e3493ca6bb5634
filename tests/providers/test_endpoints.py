"""When a network provider needs an API key (runtime/providers/endpoints.py)."""

from __future__ import annotations

import pytest

from exarch_actors.runtime.providers.endpoints import DEFAULT_BASE_URLS, api_key_required
from exarch_actors.runtime.providers.openai import OpenAIProvider


@pytest.mark.parametrize(
    ("provider", "base_url"),
    [
        ("openai", None),
        ("openai", "https://api.openai.com/v1"),
        ("openai", "https://API.openai.com/v1/"),
        ("anthropic", None),
        ("anthropic", "https://api.anthropic.com"),
    ],
)
def test_the_default_public_endpoint_requires_a_key(provider: str, base_url: str | None) -> None:
    assert api_key_required(provider, base_url)


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:8080/v1",  # llama.cpp
        "http://localhost:8000/v1",  # vLLM
        "http://localhost:11434/v1",  # Ollama
        "http://[::1]:8080/v1",
        "http://gpu-box.lan:8000/v1",
        "https://openrouter.ai/api/v1",  # needs one, and says so with a 401
        "not a url",
    ],
)
def test_any_other_base_url_does_not_require_a_key_up_front(base_url: str) -> None:
    assert not api_key_required("openai", base_url)
    assert not api_key_required("anthropic", base_url)


def test_the_scripted_provider_never_requires_a_key() -> None:
    assert not api_key_required("scripted", None)


def test_the_providers_default_to_the_endpoints_the_rule_names() -> None:
    assert OpenAIProvider.default_base_url == DEFAULT_BASE_URLS["openai"]
