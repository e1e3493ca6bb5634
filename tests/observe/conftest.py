"""What the observability tests share: the ``exarch-actors`` command as a user runs it, and the
rules of the Chrome trace format a trace is checked against."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FANOUT = ROOT / "examples" / "fanout.toml"


def exarch(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120, before: str = ""
) -> subprocess.CompletedProcess[str]:
    """``exarch-actors ARGS`` in a process of its own, from the repository's root (``before``:
    Python run first in that process)."""
    return subprocess.run(
        [sys.executable, "-c", f"{before}\nfrom exarch_actors.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=None if env is None else dict(env),
    )


def valid_chrome_trace(doc: Any) -> list[dict[str, Any]]:
    """The trace's events, once every rule of the JSON object format that chrome://tracing
    and Perfetto rely on has been checked (an AssertionError names the first broken one)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    json.dumps(doc)  # plain JSON all the way down
    events: list[dict[str, Any]] = doc["traceEvents"]
    flows: dict[int, list[str]] = defaultdict(list)
    slices: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        assert e["ph"] in {"M", "X", "i", "s", "f"}, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "M":
            continue
        assert isinstance(e["tid"], int) and isinstance(e["ts"], int | float), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            slices[e["tid"]].append((round(e["ts"], 3), round(e["ts"] + e["dur"], 3)))
        if e["ph"] in ("s", "f"):
            assert isinstance(e["id"], int), e
            flows[e["id"]].append(e["ph"])
        if e["ph"] == "f":
            assert e["bp"] == "e", e
    assert all(phases == ["s", "f"] for phases in flows.values()), flows
    for tid, spans in slices.items():  # every track's slices nest: none straddles another
        open_: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1] <= start:
                open_.pop()
            assert not open_ or end <= open_[-1], f"track {tid}: {start}-{end} straddles"
            open_.append(end)
    for e in events:  # a flow's end is inside a slice of its track (bp "e": the enclosing one)
        if e["ph"] in ("s", "f"):
            assert any(a <= e["ts"] <= b for a, b in slices[e["tid"]]), e
    return events


def tracks(events: list[dict[str, Any]]) -> dict[str, int]:
    return {
        e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }


def flow_pairs(events: list[dict[str, Any]], name: str) -> list[tuple[int, int]]:
    by_id: dict[int, dict[str, int]] = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f") and e["name"] == name:
            by_id[e["id"]][e["ph"]] = e["tid"]
    return sorted((ends["s"], ends["f"]) for ends in by_id.values())
