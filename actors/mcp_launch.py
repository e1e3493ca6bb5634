"""The first instruction of a stdio MCP server: confine, tie to the fleet, then become it.

The fleet's MCP client (``actors/mcp_hub.py``) starts a stdio server as
``python actors/mcp_launch.py PARENT_PID RULES_JSON -- COMMAND ARG...``. This process

1. asks the kernel to SIGKILL it when its parent thread (the hub's event loop, which lives as
   long as the fleet) dies -- ``PR_SET_PDEATHSIG``, kept across ``execve`` -- and exits if that
   parent is already gone, so no server outlives the control process, even a SIGKILLed one;
2. enters the shell's kernel confinement (:func:`actors.landlock.enter`: Landlock, the seccomp
   filter, the open-file cap) when the fleet's sandbox mode confines, the same rules a shell
   host of the run's base grants enters (``runtime/shell/confinement.py``);
3. ``execvp``\\ s the server, which inherits all of it (``no_new_privs``: no way out).

Its environment is already the fleet's scrubbed one (``runtime/credentials.py``): the provider's
keys never reach a server. It imports nothing heavy (no MCP SDK): it is on every server's start.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def launch(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: mcp_launch.py PARENT_PID RULES_JSON -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent, rules_json, command = int(argv[0]), argv[1], argv[3:]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # off Linux: the hub's close and the server's stdin EOF end it
    if os.getppid() != parent:
        return 1
    rules = json.loads(rules_json)
    if rules is not None:
        # where ``exarch_actors`` is: this file is exarch_actors/actors/mcp_launch.py
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if root not in sys.path:
            sys.path.insert(0, root)
        from exarch_actors.actors.landlock import enter, limit_files
        from exarch_actors.runtime.shell.confinement import MAX_OPEN_FILES, Ruleset

        limit_files(MAX_OPEN_FILES)
        enter(
            Ruleset(
                tuple(rules["read"]),
                tuple(rules["write"]),
                tuple(rules["devices"]),
                bool(rules["network"]),
            )
        )
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"mcp server {command[0]}: cannot start: {e.strerror or e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
