"""The records of a session's two shared logs: what their readers rely on, and the one record
the fleet writes itself.

``transcript.jsonl`` (the bus) and ``record.jsonl`` (forensic records) are read by ``resume``
and the invariant checker; :data:`TRANSCRIPT_SHAPE` and :data:`RECORD_SHAPE` say what those
readers rely on, so a line that breaks it is damage named by file and line, never a failure deep
inside a reader. (The journal's and the event log's shapes live with their formats:
``runtime/state/journal.py``, ``runtime/state/eventlog.py``; where the files are:
``runtime/state/session_dir.py``.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psutil

from exarch_actors.runtime.settlement.fleet_yield import OUTCOMES
from exarch_actors.runtime.state.durable import ListOf, Shape

CONTROL_DIED = "control process died"
"""The ``Died`` cause ``resume`` records for an incarnation that died with the control process."""


def _known_outcome(r: dict[str, object]) -> str | None:
    outcome = r.get("outcome")
    return None if outcome is None or outcome in OUTCOMES else f"Died outcome {outcome!r}"


TRANSCRIPT_SHAPE = Shape(
    {
        "Born": {"agent": (str,), "parent?": (str, None), "returns?": (bool,)},
        "Died": {"agent": (str,), "outcome?": (str,), "cause?": (str, None), "reply?": (str, None)},
        "InboxRejected": {"agent": (str,), "message?": (dict,)},
        "MessageSent": {"agent": (str,), "sender": (str,), "id": (str,), "text": (str,)},
        "ProviderError": {"agent": (str,)},
        "Notice": {"agent": (str,), "notice?": (str,), "text?": (str,)},
    },
    {"Died": _known_outcome},
)
"""``transcript.jsonl``: the fields ``resume`` and the checker read."""

RECORD_SHAPE = Shape(
    {
        "Commit": {
            "agent": (str,),
            "epoch": (int,),
            "defined": (ListOf(str),),
            "pid?": (int, None),
            "pidStartedAt?": (int, float, None),
        },
        "Prune": {"agent": (str,), "epoch?": (int, None), "names": (ListOf(str),)},
    }
)
"""``record.jsonl``: the fields the checker (and ``resume``'s process sweep) read."""


def born_children(transcript: Iterable[dict[str, Any]]) -> set[str]:
    """Children the bus saw born (a parent, and a result owed). A spawned child is journalled
    (``spawned``, acknowledged) before its ``Born`` is published, so every one of these must be in
    the spawn journal: one that is not is a journal that lost records."""
    return {
        str(r["agent"])
        for r in transcript
        if r.get("kind") == "Born" and isinstance(r.get("parent"), str) and r.get("returns")
    }


def logged_messages(events: Iterable[dict[str, Any]]) -> set[str]:
    """The ids of the agent ``message`` items an agent's event log holds (``user`` records of
    source ``agent_message`` with a ``messageId``): what a restart reads to tell a message
    that reached the log from one its dead process took along."""
    return {
        str(r["messageId"])
        for r in events
        if r.get("kind") == "user" and r.get("source") == "agent_message" and "messageId" in r
    }


def sent_messages(transcript: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``MessageSent`` records of a transcript, in the order sent (each sender's calls are
    sequential, so each sender's messages are in its own order): every agent ``message`` a
    recipient's inbox took before its sender's call returned."""
    return [r for r in transcript if r.get("kind") == "MessageSent"]


def rejected_messages(transcript: Iterable[dict[str, Any]]) -> set[str]:
    """The ids of the agent messages ``transcript.jsonl`` records undelivered (``InboxRejected``
    whose ``message`` is an ``AgentMessage`` with an id)."""
    out: set[str] = set()
    for r in transcript:
        msg = r.get("message") if r.get("kind") == "InboxRejected" else None
        if isinstance(msg, dict) and msg.get("type") == "AgentMessage" and msg.get("id"):
            out.add(str(msg["id"]))
    return out


def logged_results(events: Iterable[dict[str, Any]]) -> set[str]:
    """The children whose result an agent's event log holds: each ``user`` record of source
    ``agent_result`` opens ``[agent NAME finished: STATUS]`` (``Agent._admit_input``). What
    ``resume``, a restart and the checker read to tell a result that reached its parent."""
    found: set[str] = set()
    for r in events:
        if r.get("kind") != "user" or r.get("source") != "agent_result":
            continue
        head = str(r.get("text", ""))
        if head.startswith("[agent ") and " finished" in head:
            found.add(head[len("[agent ") : head.index(" finished")])
    return found


def commit_record(agent: str, result: Any, pid: int | None) -> dict[str, Any]:
    """The ``Commit`` forensic record of one clean ral call (``result`` is the shell's
    ToolResult: ``.epoch``, ``.defined``), with the shell pid that ran it and that pid's create
    time (the result's ``host_started_at`` when it names the same pid, else read now), so the
    process scan (``runtime/state/run_processes.py``) can find it later without blaming a reused
    pid."""
    started: float | None = None
    known = getattr(result, "host_started_at", None)
    if pid and known is not None and getattr(result, "host_pid", None) == pid:
        started = round(known, 2)  # read once per host by the shell: ~21 us a call saved
    elif pid:
        try:
            started = round(psutil.Process(pid).create_time(), 2)
        except psutil.Error:
            started = None
    return {
        "kind": "Commit",
        "agent": agent,
        "epoch": int(getattr(result, "epoch", 0)),
        "defined": sorted(set(getattr(result, "defined", ()) or ())),
        "pid": pid,
        "pidStartedAt": started,
    }
