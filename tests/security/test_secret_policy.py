"""Which variables are secrets (``runtime/credentials.py``): by name, by mark, by value."""

from __future__ import annotations

import pytest

from exarch_actors.runtime.credentials import PROVIDER_KEY_VARIABLES, SecretPolicy
from exarch_actors.runtime.providers.anthropic import AnthropicProvider
from exarch_actors.runtime.providers.openai import OpenAIProvider
from exarch_actors.runtime.ral.context import DynamicContext

KEY = "sk-test-abcdefghijklmnop"


def test_every_provider_key_variable_is_a_secret_by_name() -> None:
    assert {OpenAIProvider.api_key_env, AnthropicProvider.api_key_env} <= set(
        PROVIDER_KEY_VARIABLES
    )
    env = {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b", "GROQ_API_KEY": "c", "HOME": "/h"}
    assert SecretPolicy().scrub(env) == {"HOME": "/h"}


def test_a_variable_holding_a_key_in_use_is_scrubbed_whatever_its_name() -> None:
    env = {
        "OPENAI_API_KEY": KEY,
        "MY_COPY": KEY,
        "AUTH_HEADER": f"Bearer {KEY}",
        "FLAG_KEY": "sk-flag-0123456789",
        "PATH": "/bin",
    }
    policy = SecretPolicy().holding(["sk-flag-0123456789", None])
    assert policy.scrub(env) == {"PATH": "/bin"}


def test_a_marked_name_is_scrubbed_and_only_names_are_kept_for_files() -> None:
    policy = SecretPolicy().marking(["GITHUB_TOKEN"]).holding([KEY])
    assert policy.scrub({"GITHUB_TOKEN": "t", "LANG": "C"}) == {"LANG": "C"}
    assert policy.to_json() == ["GITHUB_TOKEN"]
    assert KEY not in repr(policy)
    assert SecretPolicy.from_json(policy.to_json()).names == frozenset({"GITHUB_TOKEN"})


def test_a_short_key_is_matched_whole_so_a_toy_key_scrubs_only_its_copies() -> None:
    policy = SecretPolicy().holding(["x"])
    assert policy.scrub({"A": "x", "B": "xyz"}) == {"B": "xyz"}


def test_a_fresh_shell_context_starts_without_the_provider_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ALSO_THE_KEY", KEY)
    env = DynamicContext().env
    assert "OPENAI_API_KEY" not in env and "ALSO_THE_KEY" not in env and "PATH" in env
