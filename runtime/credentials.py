"""Which environment variables are secrets, and the environment a shell gets without them.

Agents run programs a model wrote, so nothing below the agent process may see the provider's
credentials: the shell's environment (ral's ``env``, every program it starts, every worker)
and everything the runtime persists from it (the shell's snapshot) are scrubbed by a
:class:`SecretPolicy` (docs/security.md). The agent process keeps the key: it calls the model
with the provider object it was handed, never reading the environment.

A variable is a secret when

- its name is one a provider reads its key from (:data:`PROVIDER_KEY_VARIABLES`) or ends in
  ``_API_KEY`` (the convention of every hosted model API: a key set for another service, or for
  the same one under another name, is a credential just the same);
- its name was marked secret by the user (``--secret-env NAME``, a scenario's
  ``[fleet] secret_env``);
- or its value holds a key in use: the ``--api-key`` value, or the value of any variable
  secret by name in the same environment (``MY_KEY=$OPENAI_API_KEY`` is the key under another
  name). A key shorter than :data:`MIN_KEY_CHARS` is matched only whole, so a toy key like
  ``x`` does not scrub every variable holding that letter.

Only names ever leave a policy for a file (:meth:`SecretPolicy.to_json`); its values live in
memory alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PROVIDER_KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
"""The variables the network providers read their key from (``api_key_env`` of
``runtime/providers/openai.py`` and ``anthropic.py``; a test holds them equal)."""

SECRET_SUFFIXES = ("_API_KEY",)
"""A variable whose name ends so is a credential, whoever set it."""

MIN_KEY_CHARS = 8
"""Keys at least this long are scrubbed wherever a value contains them; shorter ones only where
a value equals them."""


def secret_by_name(name: str, marked: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` is a secret whatever its value (see the module docstring)."""
    return name in marked or name in PROVIDER_KEY_VARIABLES or name.endswith(SECRET_SUFFIXES)


@dataclass(frozen=True)
class SecretPolicy:
    """The variables kept out of every shell (see the module docstring).

    ``names``: the variables the user marked secret. ``values``: keys in use that need not
    sit in any variable (``--api-key``); never written anywhere."""

    names: frozenset[str] = frozenset()
    values: tuple[str, ...] = ()

    def __repr__(self) -> str:  # never print a key, in a traceback or a log
        return f"SecretPolicy(names={sorted(self.names)!r}, values=<{len(self.values)} hidden>)"

    def marking(self, names: Iterable[str]) -> SecretPolicy:
        """This policy with ``names`` marked secret too."""
        return SecretPolicy(self.names | frozenset(names), self.values)

    def holding(self, values: Iterable[str | None]) -> SecretPolicy:
        """This policy with the non-empty ``values`` as keys in use too."""
        kept = tuple(v for v in values if v and v not in self.values)
        return SecretPolicy(self.names, self.values + kept)

    def secret_names(self, env: Mapping[str, str]) -> list[str]:
        """The names in ``env`` that are secrets: by name, or by holding a key in use."""
        by_name = [k for k in env if secret_by_name(k, self.names)]
        keys = {v for v in self.values if v}
        keys.update(env[k] for k in by_name if env[k])
        if not keys:
            return by_name
        whole = {k for k in keys if len(k) < MIN_KEY_CHARS}
        inner = [k for k in keys if len(k) >= MIN_KEY_CHARS]
        hidden = set(by_name)
        for k, v in env.items():
            if k not in hidden and (v in whole or any(key in v for key in inner)):
                hidden.add(k)
        return [k for k in env if k in hidden]

    def scrub(self, env: Mapping[str, str]) -> dict[str, str]:
        """A copy of ``env`` without its secrets."""
        hidden = set(self.secret_names(env))
        return {k: v for k, v in env.items() if k not in hidden}

    def to_json(self) -> list[str]:
        """The marked names, sorted: what ``run.json`` keeps (never a value)."""
        return sorted(self.names)

    @classmethod
    def from_json(cls, data: Any) -> SecretPolicy:
        """The policy ``run.json`` kept (a list of names; anything else marks none)."""
        if not isinstance(data, list):
            return cls()
        return cls(frozenset(str(n) for n in data if isinstance(n, str) and n))


DEFAULT = SecretPolicy()
"""The provider variables and every ``*_API_KEY``, with no key in use given by flag."""


def valid_name(name: str) -> bool:
    """Whether ``name`` can be an environment variable's name (for ``--secret-env``)."""
    return bool(name) and "=" not in name and "\0" not in name
