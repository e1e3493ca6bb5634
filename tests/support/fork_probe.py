"""A fork-server child that reports what it inherited (``tests/agent_host/test_spawn_path.py``).

It runs in a process forked by the suite's fork server exactly as an agent process or a shell
host is, and answers over its pipe before doing anything else."""

from __future__ import annotations

import gc
import sys
from multiprocessing.connection import Connection


def report_inherited(conn: Connection) -> None:
    from exarch_actors.actors import fork_warm, process
    from exarch_actors.actors.agent import AgentStats
    from exarch_actors.actors.agent_process_host import EndReport
    from exarch_actors.runtime import prompt

    conn.send(
        {
            "prompt_files_cached": prompt._read.cache_info().currsize,
            "prompt_fragments_cached": prompt._fragments.cache_info().currsize,
            "prctl_loaded": process._prctl() is not None,
            "frozen_objects": gc.get_freeze_count(),
            "ral_warmed": fork_warm.ral_warmed,
            "fillers": len(fork_warm._FILLERS),
            "malloc_trimmed": fork_warm.malloc_trimmed,
            "free_block_classes": sorted(fork_warm.free_blocks()),
            "recursion_limit": sys.getrecursionlimit(),
            "slot_names_cached": [
                "__slotnames__" in cls.__dict__ for cls in (EndReport, AgentStats)
            ],
        }
    )
    conn.close()


def exit_before_born(conn: Connection, *_: object) -> None:
    """An agent process's stand-in that ends before it reports ``Born``
    (``tests/fleet_e2e/test_e2e_many_alive.py``): it reads its boot, as an agent process does,
    and exits: the spawn of its child must fail."""
    conn.recv_bytes()
    conn.close()
