"""LocalProcessExecutor against real processes: teardown, receipts, cancel, accounting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from settlement_support import IGNORE_TERM, SLEEP, pid_gone

import exarch_actors.runtime.settlement.local_executor as executor_mod
from exarch_actors.runtime.settlement.executor import (
    Backoff,
    CompletionGate,
    EnvironmentState,
    ExecutionSpec,
    PreSpawnRefusal,
    RetryPreSpawnRefusals,
    scratch_file_deliverable,
)
from exarch_actors.runtime.settlement.local_executor import LocalProcessExecutor
from tests.support.waiting import wait_for as wait_until


def _ready(ex: LocalProcessExecutor) -> None:
    execution = ex.execution
    assert execution is not None
    wait_until(lambda: (Path(execution.scratch) / "ready").exists())


def test_teardown_with_grace_terminates_a_live_process_and_removes_its_scratch(spawn) -> None:
    ex = spawn(SLEEP)
    pid, scratch = ex.execution.pid, ex.execution.scratch
    r = ex.teardown(2.0)
    assert r.destroyed and r.state is EnvironmentState.DESTROYED
    assert (r.pid, r.scratch, r.environment_id) == (pid, scratch, ex.environment_id)
    assert pid_gone(pid) and not Path(scratch).exists()
    assert ex.teardown(2.0) == r  # idempotent: the same receipt, not a second kill


def _signals_sent(ex: LocalProcessExecutor, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record every signal the executor sends its process group (and still send it)."""
    sent: list[int] = []
    send = ex._kill_group

    def recording(sig: signal.Signals) -> None:
        sent.append(sig)
        send(sig)

    monkeypatch.setattr(ex, "_kill_group", recording)
    return sent


def test_brutal_kill_ends_a_sigterm_ignoring_process_at_once(
    spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = spawn(IGNORE_TERM)
    _ready(ex)
    sent = _signals_sent(ex, monkeypatch)
    r = ex.teardown("brutal-kill")
    assert r.destroyed and "signal 9" in r.detail
    assert sent[0] == signal.SIGKILL and signal.SIGTERM not in sent  # no grace asked for


def test_an_expired_grace_escalates_to_sigkill(spawn, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = spawn(IGNORE_TERM)
    _ready(ex)
    sent = _signals_sent(ex, monkeypatch)
    t0 = time.monotonic()
    r = ex.teardown(0.2)
    took = time.monotonic() - t0
    assert r.destroyed and "signal 9" in r.detail and took >= 0.2  # the grace was given
    assert sent[:2] == [signal.SIGTERM, signal.SIGKILL]


def test_infinity_waits_for_the_process_to_honour_sigterm(spawn) -> None:
    ex = spawn(SLEEP)
    r = ex.teardown("infinity")
    assert r.destroyed and "signal 15" in r.detail


def test_a_process_that_crashed_before_teardown_is_gone_not_destroyed_and_keeps_its_scratch(
    spawn,
) -> None:
    ex = spawn(SLEEP)
    os.kill(ex.execution.pid, signal.SIGKILL)
    wait_until(lambda: ex.observe().state == "exited")
    r = ex.teardown(1.0)
    assert not r.destroyed and r.state is EnvironmentState.GONE
    assert "already gone" in r.detail and Path(r.scratch).is_dir()
    assert ex.teardown(1.0).state is EnvironmentState.GONE


def test_a_process_that_completed_cleanly_is_destroyed_by_its_own_completion(spawn) -> None:
    ex = spawn((sys.executable, "-c", "pass"))
    assert ex.result(5.0).status == "done"
    r = ex.teardown(1.0)
    assert r.destroyed and "completed" in r.detail and not Path(r.scratch).exists()


def test_teardown_kills_the_workers_of_the_process_group(spawn) -> None:
    script = (
        "import subprocess, pathlib, time\n"
        "p = subprocess.Popen(['sleep', '60'])\n"
        "pathlib.Path('ready').write_text(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    ex = spawn((sys.executable, "-c", script))
    _ready(ex)
    worker = int((Path(ex.execution.scratch) / "ready").read_text())
    assert ex.teardown(2.0).destroyed
    wait_until(lambda: pid_gone(worker))


def test_never_provisioned_environment_has_nothing_to_destroy_and_nothing_retained(
    scratch_root,
) -> None:
    ex = LocalProcessExecutor(scratch_root)
    r = ex.teardown(1.0)
    assert r.destroyed and r.state is EnvironmentState.NEVER_PROVISIONED
    assert ex.release_retained() == []
    assert ex.cancel().answer == "rejected"
    assert ex.recover() is None


def test_cancel_is_accepted_only_when_the_end_is_observed(spawn, monkeypatch) -> None:
    monkeypatch.setattr(executor_mod, "CANCEL_ACK_TIMEOUT", 0.1)
    ex = spawn(SLEEP)
    assert ex.cancel().answer == "accepted"
    assert ex.cancel().answer == "already-terminal"
    stubborn = spawn(IGNORE_TERM)
    _ready(stubborn)
    ack = stubborn.cancel()
    assert ack.answer == "unknown" and "no exit observed" in ack.detail
    assert stubborn.teardown("brutal-kill").destroyed


def test_accounting_keeps_unknown_tokens_distinct_from_zero(spawn) -> None:
    ex = spawn(SLEEP)
    acc = ex.accounting()
    assert acc.tokens_in is None and not acc.tokens_known and acc.wall_seconds is not None
    ex.charge(0, 0)
    assert ex.accounting().tokens_in == 0 and ex.accounting().tokens_known
    ex.charge(None, None)
    assert not ex.accounting().tokens_known and ex.accounting().unmetered_turns == 1
    ex.teardown("brutal-kill")


def test_a_missing_binary_is_a_typed_pre_spawn_refusal_that_leaves_no_scratch(scratch_root) -> None:
    ex = LocalProcessExecutor(scratch_root)
    with pytest.raises(PreSpawnRefusal, match="nothing was started"):
        ex.execute(ExecutionSpec("n", argv=("/nonexistent/binary",)))
    assert list(scratch_root.iterdir()) == []


def test_retry_wrapper_retries_pre_spawn_refusals_then_succeeds(scratch_root, reap) -> None:
    calls = []

    def flaky(scratch: Path) -> subprocess.Popen[bytes]:
        calls.append(scratch)
        if len(calls) < 3:
            raise OSError("EAGAIN: fork refused")
        return subprocess.Popen(list(SLEEP), cwd=scratch, start_new_session=True)

    inner = reap(LocalProcessExecutor(scratch_root))
    ex = RetryPreSpawnRefusals(inner, Backoff(attempts=3, base=0.001))
    got = ex.execute(ExecutionSpec("n", starter=flaky))
    assert len(calls) == 3 and len(ex.refusals) == 2 and got.pid > 0
    assert ex.teardown(1.0).destroyed


def test_retry_wrapper_gives_up_after_its_attempts_with_the_typed_refusal(scratch_root) -> None:
    ex = RetryPreSpawnRefusals(LocalProcessExecutor(scratch_root), Backoff(attempts=2, base=0.001))
    with pytest.raises(PreSpawnRefusal):
        ex.execute(ExecutionSpec("n", argv=("/nonexistent/binary",)))
    assert len(ex.refusals) == 2


def test_completion_gate_settles_a_done_child_without_its_deliverable_as_down(spawn) -> None:
    gate = CompletionGate(spawn((sys.executable, "-c", "pass")), scratch_file_deliverable("out"))
    res = gate.result(5.0)
    assert res is not None
    assert res.status == "down" and "out missing" in res.reason


def test_completion_gate_passes_a_done_child_with_its_deliverable(scratch_root, reap) -> None:
    gate = CompletionGate(reap(LocalProcessExecutor(scratch_root)), scratch_file_deliverable("out"))
    gate.execute(ExecutionSpec("n", argv=(sys.executable, "-c", "open('out','w').write('x')")))
    res = gate.result(5.0)
    assert res is not None and res.status == "done"
    assert gate.teardown(1.0).destroyed


def test_adopt_never_signals_a_reused_pid(spawn) -> None:
    ex = spawn(SLEEP)
    e = ex.execution
    stranger = LocalProcessExecutor.adopt(e.environment_id, e.pid, e.scratch, e.pid_started_at - 99)
    r = stranger.teardown("brutal-kill")
    assert not r.destroyed and r.state is EnvironmentState.GONE
    assert ex.observe().state == "running"  # the real process was not touched
    assert ex.teardown(1.0).destroyed
