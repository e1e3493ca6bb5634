"""The span model of a session (``runtime/observe/spans.py``) and what the report and the trace
make of it, on a session directory whose every record is written here: a network run's money,
a ral error, a provider error, a failed child, a rejected message and a rollback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from exarch_actors.runtime.observe.chrome_trace import chrome_trace
from exarch_actors.runtime.observe.report_html import render_report
from exarch_actors.runtime.observe.spans import read_view
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.observe.conftest import flow_pairs, tracks, valid_chrome_trace


def _at(ms: int) -> str:
    return f"2026-12-04T10:00:{ms // 1000:02d}.{ms % 1000:03d}Z"


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def troubled_session(root: Path) -> SessionDir:
    session = SessionDir(root)
    _write(
        session.transcript,
        [
            {"kind": "Born", "agent": "trunk", "parent": None, "at": _at(0)},
            {
                "kind": "ModelCall",
                "agent": "trunk",
                "model": "gpt-x",
                "provider": "openai",
                "operation": "chat",
                "seconds": 0.8,
                "input_tokens": 1200,
                "output_tokens": 300,
                "cost": "0.004200",
                "stop_reason": "tool_use",
                "attempts": 2,
                "rate_wait": 0.25,
                "at": _at(900),
            },
            {
                "kind": "Io",
                "agent": "trunk",
                "call_id": "c1",
                "script": "agent kid 'go'",
                "value": '[value]\n[agent: "kid"]',
                "error": None,
                "seconds": 0.05,
                "at": _at(960),
            },
            {"kind": "Born", "agent": "kid", "parent": "trunk", "returns": True, "at": _at(970)},
            {
                "kind": "Io",
                "agent": "trunk",
                "call_id": "c2",
                "script": "read-text missing.txt",
                "value": "[error]\nread-text: cannot read missing.txt",
                "error": "error",
                "seconds": 0.01,
                "at": _at(1000),
            },
            {
                "kind": "ProviderError",
                "agent": "kid",
                "error": "http",
                "message": "503 again",
                "at": _at(1500),
            },
            {
                "kind": "Died",
                "agent": "kid",
                "outcome": "failed",
                "cause": "provider http",
                "at": _at(1600),
            },
            {
                "kind": "InboxRejected",
                "agent": "trunk",
                "source": "agent_result",
                "reason": "inbox full",
                "message": {"child": "kid"},
                "at": _at(1610),
            },
            {"kind": "Died", "agent": "trunk", "outcome": "replied", "at": _at(2000)},
        ],
    )
    _write(
        session.journal,
        [
            {"kind": "spawned", "seq": 0, "id": "kid", "parent": "trunk", "at": _at(965)},
            {
                "kind": "settled",
                "seq": 1,
                "id": "kid",
                "status": "down",
                "reason": "failed",
                "at": _at(1605),
            },
        ],
    )
    _write(
        session.record,
        [
            {
                "kind": "Rollback",
                "agent": "trunk",
                "reason": "host crashed",
                "epoch": 1,
                "at": _at(990),
            }
        ],
    )
    _write(
        session.events("trunk"),
        [
            {"kind": "user", "source": "user", "text": "do it", "at": _at(50)},
            {"kind": "assistant", "message": {"role": "assistant", "text": ""}, "at": _at(900)},
            {"kind": "tool_result", "message": {}, "at": _at(1000)},
        ],
    )
    session.result.write_text(
        json.dumps(
            {
                "outcome": "replied",
                "reply": "42",
                "fleetYield": {"byReason": {"failed": 1}, "cost": {"agents": {}}},
            }
        )
    )
    return session


def test_the_report_lists_every_error_and_rejected_message_and_the_money(tmp_path: Path) -> None:
    page = render_report(read_view(troubled_session(tmp_path / "s")))
    section = {
        key: body for key, body in re.findall(r'<section id="([a-z]+)">(.*?)</section>', page, re.S)
    }
    errors = section["errors"]
    assert "read-text: cannot read missing.txt" in errors
    assert errors.count("<td>provider error</td>") == 1 and "503 again" in errors
    assert "host crashed" in errors and "failed" in errors
    assert "inbox full" in section["rejected"]
    assert re.search(r'id="fact-tokens">1,200 in / 300 out<', page)
    assert re.search(r'id="fact-cost">\$0\.0042<', page)
    costly = section["costly"]
    assert "0.004200" in costly and ">2<" in costly and "0.250s" in costly  # attempts, wait
    assert re.search(
        r'data-agent="kid"[^>]*><span class="name">kid</span> '
        r'<span class="reason bad">failed</span>',
        page,
    )


def test_the_trace_of_a_failed_child_has_an_end_arrow_and_marks_the_rollback(
    tmp_path: Path,
) -> None:
    events = valid_chrome_trace(chrome_trace(read_view(troubled_session(tmp_path / "s"))))
    tid = tracks(events)
    assert flow_pairs(events, "spawn") == [(tid["trunk"], tid["trunk/kid"])]
    assert flow_pairs(events, "end") == [(tid["trunk/kid"], tid["trunk"])]
    marks = {(e["tid"], e["cat"]) for e in events if e["ph"] == "i"}
    assert {
        (tid["trunk"], "rollback"),
        (tid["trunk"], "rejected"),
        (tid["trunk/kid"], "error"),
    } <= marks
    (model,) = [e for e in events if e["ph"] == "X" and e["cat"] == "model"]
    assert model["args"]["attempts"] == 2 and abs(model["dur"] - 800_000) < 1  # 0.8 s in us
