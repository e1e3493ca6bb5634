"""The runtime embedded in a Python program: run the fanout example, watch its agents come and
go, print the reply. ``python examples/embed.py`` prints the agents' lives, then 499500.

docs/api.md documents every name used here.
"""

from __future__ import annotations

import sys

import exarch_actors


def main() -> int:
    """Run ``fanout`` (a packaged example: scripted, no network, no key) and print its reply."""
    handle = exarch_actors.start("fanout", agents="thread")
    for event in handle.events():
        if event.kind in ("Born", "Died"):
            print(f"{event.kind.lower()}: {event.agent}", file=sys.stderr)
    result = handle.wait()
    print(result.reply)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
