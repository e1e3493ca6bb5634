"""Detached workers in their own processes: spawn/await/cancel, retention, idle bound, teardown."""

from __future__ import annotations

from pathlib import Path

import psutil

from exarch_actors.actors.worker_process import start_worker
from exarch_actors.runtime.ral.codec import encode_value
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.state.durable import read_jsonl
from tests.support.waiting import HANG_GUARD, ended, wait_for


def _reaps(tmp_path: Path) -> list[dict]:
    return [r for r in read_jsonl(tmp_path / "record.jsonl").records if r["kind"] == "Reap"]


def test_a_worker_runs_in_its_own_process_with_the_bindings_its_block_captured(start_shell) -> None:
    shell = start_shell().proxy()
    r = shell.run("let x = 41; let h = spawn { echo from-worker; add $x 1 }; await $h").get()
    assert r.error is None and r.value == "42"
    assert r.stdout == "from-worker\n"
    host = shell.host_pid().get()
    r = shell.run("let h2 = spawn { /bin/sh -c 'echo $PPID' }; await $h2").get()
    assert int(r.value) != host  # the program's parent is the worker process, not the host


def test_await_re_raises_the_workers_error_catchably(start_shell) -> None:
    shell = start_shell().proxy()
    r = shell.run("let h = spawn { div 1 0 }; try { await $h } catch e { get $e message }").get()
    assert r.error is None and "division" in r.value


def test_a_claimed_worker_is_gone_and_a_second_await_names_why(start_shell) -> None:
    shell = start_shell().proxy()
    shell.run("let h = spawn { 1 }; await $h").get()
    r = shell.run("await $h").get()
    assert r.error is not None and "already claimed" in r.error


def test_settled_tells_a_running_worker_from_a_finished_one_without_claiming_its_value(
    start_shell,
) -> None:
    shell = start_shell().proxy()
    r = shell.run("let h = spawn { sleep 10 }; let q = spawn { add 40 2 }; settled $h").get()
    assert r.error is None and r.value == "false"
    shell.run("let rec until = { |w| if (settled $w) { 1 } else { sleep 0.01; until $w } }").get()
    assert shell.run("until $q; settled $q").get().value == "true"
    assert shell.run("await $q").get().value == "42", "settled claimed nothing"
    r = shell.run("settled $q").get()
    assert r.error is not None and "already claimed" in r.error
    assert shell.run("cancel $h; until $h; settled $h").get().value == "true"


def test_a_settled_worker_is_reaped_after_exactly_256_calls_unclaimed_not_255(
    start_shell, tmp_path: Path, notices
) -> None:
    shell = start_shell(notice_sink=notices).proxy()
    shell.run("let h = spawn { 7 }").get()  # epoch 1
    wait_for(lambda: shell.probe().get().settled_workers == 1)
    shell.run("1").get()  # epoch 2: the sweep first observes it settled and stamps it
    for _ in range(255):  # epochs 3..257: 255 calls after the stamp
        shell.run("1").get()
    assert shell.probe().get().settled_workers == 1
    assert _reaps(tmp_path) == []
    r = shell.run("1").get()  # epoch 258: the 256th call after the stamp
    assert [n.notice for n in r.notices] == ["Reap"]
    (rec,) = _reaps(tmp_path)
    assert rec["agent"] == "trunk" and rec["reason"] == "retention" and rec["worker"] == "w1-1"
    assert shell.probe().get().settled_workers == 0
    assert "Reap" in notices.kinds()
    # the decay ladder's other layer: the name holding the settled handle fell on its own clock
    prunes = [r for r in read_jsonl(tmp_path / "record.jsonl").records if r["kind"] == "Prune"]
    assert [(p["names"], p["epoch"]) for p in prunes] == [(["h"], 257)]


def test_a_running_worker_past_its_idle_bound_is_reaped_and_killed(
    start_shell, tmp_path: Path
) -> None:
    shell = start_shell(worker_idle_calls=3, notice_sink=lambda n: None).proxy()
    shell.run("let h = spawn { /bin/sleep 10 }").get()
    me = psutil.Process()
    program = wait_for(lambda: next((p for p in me.children(True) if p.name() == "sleep"), None))
    shell.run("1").get()
    shell.run("1").get()
    assert _reaps(tmp_path) == []
    shell.run("1").get()  # epoch 4: untouched for 3 calls
    (rec,) = _reaps(tmp_path)
    assert rec["reason"] == "idle"
    wait_for(lambda: ended(program))


def test_clear_cancels_every_worker_before_the_fresh_shell(start_shell) -> None:
    shell = start_shell().proxy()
    shell.run("let a = 1; let h = spawn { /bin/sleep 10 }").get()
    me = psutil.Process()
    program = wait_for(lambda: next((p for p in me.children(True) if p.name() == "sleep"), None))
    shell.clear().get()
    assert ended(program)
    assert shell.run("echo $a").get().error == "1:6 undefined variable a"
    assert shell.probe().get().running_workers == 0


def test_stopping_the_shell_cancels_its_workers_and_reaps_every_process(start_shell) -> None:
    ref = start_shell()
    shell = ref.proxy()
    shell.run("let h = spawn { sleep 10 }; let g = spawn { /bin/sleep 10 }").get()
    assert shell.probe().get().running_workers == 2
    ref.stop(block=True, timeout=10)
    # the autouse leak check fails this test if any host, worker or program survived


def test_a_cancel_reaches_a_worker_encoding_its_large_result_and_the_worker_keeps_its_output(
    tmp_path: Path,
) -> None:
    """The worker's result is 2**20 shared variants, under the size limit, so it is encoded in
    full, each variant lowered in Python: many seconds (15 s on the loaded 2-core box). The
    worker encodes it inside its run's cancel scope, so the cancel stops it at its next walk
    check and the worker itself reports the cancel, with its output; encoded after the run,
    the cancel went unheard until the hard kill at CANCEL_GRACE, and the output died with the
    process."""
    marker = tmp_path / "returning"
    block = Session().run(
        "{ echo before; let v = variant ok 1; "
        "let x = fold { |a, x| [$a, $a] } [$v] (range 20); "
        f'write-text "{marker}" go; $x }}'
    )
    assert block.error is None
    link, ref = start_worker(
        "w1-1", encode_value(block.value), DynamicContext().to_dict(), faults=False
    )
    try:
        wait_for(marker.exists, HANG_GUARD, "the worker to reach its result")
        link.cancel("esc")
        assert link.wait(HANG_GUARD)
    finally:
        ref.stop()
    out = link.outcome
    assert out is not None and out.error is not None and out.error[3] == "cancelled", out
    assert out.stdout == "before\n", out  # only a worker that stopped itself reports it
