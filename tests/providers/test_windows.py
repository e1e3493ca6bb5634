"""The context-window table (runtime/providers/windows.py) and how the providers use it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.http import HttpStreamingProvider
from exarch_actors.runtime.providers.windows import WINDOWS, canonical, window_for


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("claude-sonnet-4-5", 200_000),
        ("qwen3", 32_768),
        ("gemma3", 131_072),
    ],
)
def test_an_exact_name_finds_its_window(model: str, window: int) -> None:
    assert window_for(model) == window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("gpt-4.1-nano", 1_047_576),
        ("o3-mini", 200_000),
        ("claude-3-5-haiku-latest", 200_000),
        ("deepseek-r1-distill-qwen-7b", 131_072),
    ],
)
def test_a_dated_or_sized_variant_finds_its_familys_window_by_prefix(
    model: str, window: int
) -> None:
    assert window_for(model) == window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("llama3.1:8b", 131_072),
        ("llama3:latest", 8_192),
        ("qwen2.5-coder:7b", 32_768),
        ("mistral-small3.1:24b", 128_000),
        ("mixtral:8x22b", 65_536),
        ("gemma3:12b", 131_072),
        ("gemma3:1b", 32_768),
        ("gpt-oss:20b", 131_072),
    ],
)
def test_an_ollama_name_and_tag_finds_the_models_window(model: str, window: int) -> None:
    assert window_for(model) == window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("Meta-Llama-3.1-8B-Instruct", 131_072),
        ("Qwen/Qwen2.5-7B-Instruct", 32_768),
        ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 128_000),
        ("google/gemma-3-1b-it", 32_768),
        ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", 32_768),
        ("hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", 131_072),
    ],
)
def test_a_hugging_face_id_or_gguf_file_name_finds_the_same_window(model: str, window: int) -> None:
    assert window_for(model) == window


@pytest.mark.parametrize(
    "model", ["local", "my-finetune", "codellama:7b", "llama3.5", "gpt-4.5-preview", "", None]
)
def test_a_model_the_table_does_not_know_has_no_window(model: str | None) -> None:
    assert window_for(model) is None


def test_a_key_never_matches_inside_a_version_or_a_word() -> None:
    assert window_for("llama3.1") != window_for("llama3")  # llama3 is not a prefix of llama3.1
    assert window_for("gemma3:12b") != window_for("gemma3:1b")
    assert window_for("phi4-mini") != window_for("phi4")


@given(key=st.sampled_from(sorted(WINDOWS)), tag=st.sampled_from(["", ":latest", ":7b", "-it"]))
def test_every_table_key_finds_its_own_window_with_any_size_or_tag(key: str, tag: str) -> None:
    found = window_for(key + tag)
    # a longer key may claim a tagged name (gemma3 + :1b), never a shorter one
    longer = [k for k in WINDOWS if canonical(key + tag) == canonical(k) and k != key]
    assert found == (WINDOWS[longer[0]] if longer else WINDOWS[key])


def _provider(model: str, **kw: object) -> HttpStreamingProvider:
    p = make_provider("openai", model=model, base_url="http://127.0.0.1:9/v1", **kw)  # type: ignore[arg-type]
    assert isinstance(p, HttpStreamingProvider)
    return p


def test_a_provider_takes_its_window_from_the_table_when_none_is_given() -> None:
    assert _provider("llama3.1:8b").window_tokens == 131_072
    assert _provider("my-finetune").window_tokens is None  # unknown: the 500 KiB fallback


def test_window_tokens_overrides_the_table_and_survives_a_model_switch() -> None:
    p = _provider("llama3.1:8b", window_tokens=8192)
    assert p.window_tokens == 8192
    assert p.with_model("qwen3:8b").window_tokens == 8192


def test_a_model_switch_takes_the_new_models_window_from_the_table() -> None:
    p = _provider("llama3.1:8b")
    assert p.with_model("qwen3:8b").window_tokens == 32_768
    assert p.with_model("my-finetune").window_tokens is None
    assert p.window_tokens == 131_072  # the running turn's provider is untouched
