"""Context windows of the models people commonly use, so compaction knows when it is due.

Compaction is due when the tokens in use enter the top 15% of the model's window
(:func:`runtime.fleet.compaction.compaction_due`); without a window it falls back to 500 KiB of
history,
far past what an 8K or 32K model holds. ``--window-tokens`` always wins; this table answers when
it is not given, and a model it does not know keeps that fallback (``None``).

**What the numbers are.** Each is the window the vendor publishes for the model (its trained
context, or the hosted API's limit), as of :data:`AS_OF`. A local server may serve *less*:
llama.cpp's ``-c``/``--ctx-size``, vLLM's ``--max-model-len`` and Ollama's ``num_ctx`` (its
default is a few thousand tokens whatever the model) set the real limit, and only
``--window-tokens`` can say so (docs/providers.md). Where a family's members differ, the entry is
the smallest common figure (Qwen3's 32,768 native, not the 131,072 it reaches with YaRN), so
compaction runs early rather than late.

**Matching.** A name is first put in one canonical spelling, so the names the servers use for
one model all meet: lower case; the part after the last ``/`` (Hugging Face ids as vLLM takes
them: ``meta-llama/Llama-3.1-8B-Instruct``); ``.gguf`` dropped (llama.cpp file names); ``:``,
``_`` and spaces become ``-`` (Ollama's ``name:tag``); a ``-`` between a letter and a digit
(``llama3.1`` and ``Llama-3.1`` both become ``llama-3.1``); a leading ``meta-`` dropped.
Then the longest table key that equals the canonical name, or is a prefix of it ending at a
``-``, wins: ``llama3.1:8b`` → ``llama-3.1-8b`` → key ``llama3.1``; ``gemma3:1b`` → key
``gemma3:1b`` before ``gemma3``. A key never matches inside a word or a version, so ``llama3``
does not claim ``llama3.5`` and ``gpt-4`` does not claim ``gpt-4.5``.
"""

from __future__ import annotations

import re
from functools import cache

AS_OF = "2025-08"
"""When these figures were taken from the vendors' model cards and API documentation."""

WINDOWS: dict[str, int] = {
    # Anthropic: every Claude 3, 3.5, 3.7, 4 and 4.5 model (1M for Sonnet 4 needs a beta header).
    "claude": 200_000,
    # OpenAI.
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "gpt-oss": 131_072,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    # Meta Llama.
    "llama3": 8_192,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    # Qwen (2.5 and 3 native windows; the 2507 and coder releases are longer).
    "qwen2.5": 32_768,
    "qwen3": 32_768,
    "qwen3-coder": 262_144,
    "qwq": 131_072,
    # Mistral.
    "mistral": 32_768,
    "mistral-nemo": 128_000,
    "mistral-small": 32_768,
    "mistral-small3.1": 128_000,
    "mistral-small3.2": 128_000,
    "mistral-large": 128_000,
    "devstral": 128_000,
    "mixtral": 32_768,
    "mixtral-8x22b": 65_536,
    # Google Gemma.
    "gemma": 8_192,
    "gemma2": 8_192,
    "gemma3": 131_072,
    "gemma3:1b": 32_768,
    "gemma3n": 32_768,
    # DeepSeek (open weights; the hosted deepseek-chat/-reasoner API limit is smaller).
    "deepseek-v3": 131_072,
    "deepseek-r1": 131_072,
    "deepseek-coder-v2": 131_072,
    "deepseek-chat": 65_536,
    "deepseek-reasoner": 65_536,
    # Microsoft Phi.
    "phi4": 16_384,
    "phi4-mini": 131_072,
}

_SEPARATORS = re.compile(r"[\s:_]+")
_LETTER_DIGIT = re.compile(r"(?<=[a-z])-?(?=\d)")
_DASHES = re.compile(r"-{2,}")
_DROPPED_PREFIXES = ("meta-",)


def canonical(name: str) -> str:
    """``name`` in the one spelling the table is matched in (see the module docstring)."""
    s = name.strip().lower().rsplit("/", 1)[-1]
    s = s.removesuffix(".gguf")
    s = _SEPARATORS.sub("-", s)
    s = _LETTER_DIGIT.sub("-", s)
    s = _DASHES.sub("-", s).strip("-")
    for prefix in _DROPPED_PREFIXES:
        s = s.removeprefix(prefix)
    return s


@cache
def _keys() -> tuple[tuple[str, int], ...]:
    """The table in canonical spelling, longest key first (the first match is the longest)."""
    table = {canonical(k): v for k, v in WINDOWS.items()}
    return tuple(sorted(table.items(), key=lambda kv: -len(kv[0])))


def window_for(model: str | None) -> int | None:
    """The window of ``model`` from :data:`WINDOWS`, or ``None`` for a model it does not know."""
    if not model:
        return None
    name = canonical(model)
    for key, window in _keys():
        if name == key or name.startswith(key + "-"):
            return window
    return None
