"""The runtime's bounds and constants, in one place, under recognisable names."""

from __future__ import annotations

BINDING_IDLE_CALLS = 256
"""A session binding unused for this many ral calls is pruned (docs/language.md, Binding leases)."""

LARGE_BINDING_BYTES = 1 << 20
"""Writing a session binding whose encoding exceeds this emits one LargeBinding notice."""

SETTLED_WORKER_RETENTION = 256
"""A settled worker entry expires unclaimed this many ral calls after first seen settled."""

INBOX_SOURCE_CAP = 64
INBOX_TOTAL_CAP = 256

MAX_STEPS = 250
"""Provider round-trips per turn before the turn ends as Capped."""

SPAWN_FUEL = 3
"""Spawn fuel at the trunk; each fork generation gets one less."""

COMPACT_WINDOW_FRACTION = 0.15
"""Compaction is due when used tokens enter the top 15% of a known window."""

COMPACT_THRESHOLD = 500 * 1024
"""Fallback when the window is unknown: serialised history past 500 KiB."""

DISK_WARN_CHECK_INTERVAL = 32

VALUE_CAP = 20 * 1024
STDOUT_CAP = 10 * 1024
STDERR_CAP = 10 * 1024
OPAQUE_CAP = 4 * 1024
"""Opaque error blobs (provider errors, tracebacks): a short head+tail is all a model can use."""
AGENT_REPLY_CAP = 20 * 1024
"""A child's reply shown to its parent: the same budget as a value."""

TRUNK_NAME = "trunk"

SCRATCH_ENV = "EXARCH_SCRATCH"
"""The shell variable naming an agent's own scratch directory (``scratch/<name>/`` of the
session): temporary files go there, not to /tmp, so a run leaves nothing outside its session
directory (a child's is removed with its environment)."""

SESSION_ENV = "EXARCH_SESSION"
"""Set in every agent's shell to its session directory (absolute), so every program the shell
starts inherits it however it detaches: ``check`` finds a program that outlived its run by it
(``runtime/drills/invariant_check.py``). A marker, not the guarantee (a program may unset it):
the guarantee is that a shell host reaps every descendant (docs/security.md)."""
