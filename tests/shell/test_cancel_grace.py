"""A host that cannot honour a cancel (spinning in C code, holding the GIL) is killed once the
cancellation grace has passed, and the call is rolled back like any other panic."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from exarch_actors.actors.shell import CANCEL_GRACE
from exarch_actors.runtime.state.durable import read_jsonl
from tests.support.waiting import ended, wait_for


def _spinning(pid: int) -> bool:
    """The host is busy on CPU (the spin has started, not just the run frame)."""
    try:
        return psutil.Process(pid).cpu_times().user > 0.2
    except psutil.Error:
        return False


@pytest.mark.slow
def test_interrupting_a_host_spinning_in_c_code_kills_it_and_rolls_the_call_back(
    start_shell, tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    assert shell.run("let kept = 41").get().error is None
    spinner = psutil.Process(shell.host_pid().get())
    future = shell.run("let lost = 1; fault spin")
    wait_for(lambda: root.busy and _spinning(spinner.pid), what="the host spinning")
    root.interrupt("esc")
    r = future.get(timeout=CANCEL_GRACE + 30)
    assert r.rolled_back and r.error_kind == "panic"
    assert "did not stop within" in (r.error or "")
    wait_for(lambda: ended(spinner))
    assert shell.host_pid().get() != spinner.pid
    assert shell.run("add $kept 1").get().value == "42"
    assert shell.run("echo $lost").get().error == "1:6 undefined variable lost"
    (rec,) = [r for r in read_jsonl(tmp_path / "record.jsonl").records if r["kind"] == "Rollback"]
    assert "did not stop within" in rec["reason"]


@pytest.mark.slow
def test_cancelling_the_root_of_a_spinning_host_leaves_the_shell_cancelled_and_no_spinner(
    start_shell,
) -> None:
    shell = start_shell().proxy()
    root = shell.eval_root.get()
    spinner = psutil.Process(shell.host_pid().get())
    future = shell.run("fault spin")
    wait_for(lambda: root.busy and _spinning(spinner.pid), what="the host spinning")
    root.cancel("agent-cancel")
    r = future.get(timeout=CANCEL_GRACE + 30)
    assert r.rolled_back
    wait_for(lambda: ended(spinner))
    later = shell.run("echo hi").get()
    assert later.error_kind == "cancelled" and "agent-cancel" in (later.error or "")
