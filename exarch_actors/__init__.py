"""exarch-actors as a library: run a fleet of LLM agents from Python (docs/api.md).

::

    import exarch_actors

    result = exarch_actors.run("fanout")          # a packaged example; no network, no key
    print(result.outcome, result.reply)           # replied 499500

    handle = exarch_actors.start("examples/fanout.toml", agents="thread")
    for event in handle.events():                 # Born, Io (a ral call), Progress, Died, ...
        print(event.kind, event.agent)
    print(handle.wait().fleet_yield.to_json())

The public names are those of ``__all__``; each is documented in docs/api.md. Importing this
package is cheap: the runtime is imported by the first use of a public name.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exarch_actors.api import (
        Progress,
        Result,
        Run,
        RunRefused,
        check,
        replay_recording,
        report,
        resume,
        run,
        start,
        trace,
    )

__all__ = [
    "Progress",
    "Result",
    "Run",
    "RunRefused",
    "check",
    "replay_recording",
    "report",
    "resume",
    "run",
    "start",
    "trace",
]


def __getattr__(name: str) -> Any:
    """The public names, imported from ``exarch_actors.api`` on first use."""
    if name in __all__:
        value = getattr(import_module("exarch_actors.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exarch_actors' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
