"""What the model sees of the shell: a panic mid-turn rolls back and the turn goes on; a huge
result is clipped head + tail with the banner, and the transcript records exactly that."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exarch_actors.runtime.constants import STDOUT_CAP, VALUE_CAP
from tests.agent.conftest import Run


@pytest.mark.slow
def test_a_shell_crash_mid_turn_rolls_back_and_the_turn_continues_with_earlier_bindings(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = ["let a = 5", "let b = 6; fault crash", "add $a 1", "echo $b"]

        [[agents.trunk]]
        ral = ["reply $a"]
        repeat = 2
        """,
        env={"EXARCH_FAULTS": "1"},
    )
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "5"
    results = [e["message"] for e in run.events("trunk") if e["kind"] == "tool_result"]
    crashed = results[1]
    assert crashed["is_error"] and "rolled back" in crashed["content"]
    assert results[2]["content"] == "[value]\n6", "an earlier call's binding survives the crash"
    assert "undefined variable b" in results[3]["content"], "the crashed call's binding is gone"
    rollbacks = [r for r in run.jsonl("record.jsonl") if r["kind"] == "Rollback"]
    assert len(rollbacks) == 1 and rollbacks[0]["agent"] == "trunk"
    assert "signal 9" in rollbacks[0]["reason"]
    assert run.result["outcome"] == "replied"


@pytest.mark.slow
def test_a_50_mb_result_is_clipped_head_and_tail_and_the_transcript_records_what_the_model_saw(
    run_scenario: Callable[..., Run],
) -> None:
    # 12 bytes doubled 22 times is 50,331,648 bytes, built in ral; the value and stdout are
    # each clipped to their own cap.
    run = run_scenario(
        """
        [fleet]
        prompt = "go"

        [[agents.trunk]]
        ral = [
          "let rec dbl = { |s, n| if (eq $n 0) { $s } else { dbl (concat $s $s) (sub $n 1) } }",
          "concat 'HEAD' (dbl '0123456789ab' 22) 'TAIL'",
          "echo (concat 'OUTHEAD' (dbl '0123456789ab' 22) 'OUTTAIL')",
        ]

        [[agents.trunk]]
        ral = ["reply ok"]
        repeat = 2
        """,
        timeout=90,
    )
    assert run.code == 0, run.stderr
    results = [e["message"] for e in run.events("trunk") if e["kind"] == "tool_result"]
    value, out = results[1]["content"], results[2]["content"]
    total = 12 * 2**22 + 8
    assert value.startswith("[value]\nHEAD0123") and value.endswith("89abTAIL")
    assert f"of {total} bytes elided from the middle" in value
    assert "Scope the query at its source" in value
    assert len(value.encode()) <= VALUE_CAP + len("[value]\n")
    assert out.startswith("[value]\nunit\n[stdout]\nOUTHEAD0123")
    assert out.rstrip("\n").endswith("OUTTAIL")
    assert len(out.encode()) <= STDOUT_CAP + 64
    io = {r["call_id"]: r["value"] for r in run.kinds("transcript.jsonl", "Io")}
    assert io[results[1]["tool_call_id"]] == value
    assert io[results[2]["tool_call_id"]] == out
    assert (run.session / "transcript.jsonl").stat().st_size < 200_000
