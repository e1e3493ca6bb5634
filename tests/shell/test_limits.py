"""Per-shell limits on real host and worker processes: memory (RLIMIT_DATA), live workers, and
the largest binding a snapshot holds; and no binding is ever committed that a rollback loses."""

from __future__ import annotations

from typing import Any

import psutil
import pytest

from exarch_actors.runtime.shell.limits import DEFAULT_MAX_WORKERS, MiB, ShellLimits
from tests.support.waiting import wait_for

SMALL_MEMORY = 192 * MiB
"""Far above a fresh host's 23 MiB of data, far below ``range 10000000`` (~360 MB)."""


# -- binding size and encodability -------------------------------------------------------------


def test_a_binding_over_the_byte_limit_is_refused_at_let_by_name_and_nothing_is_bound(
    start_shell,
) -> None:
    shell = start_shell(limits=ShellLimits(max_binding_bytes=1024)).proxy()
    assert shell.run("let small = join (map { |i| 'x' } (range 100))").get().error is None
    r = shell.run("let big = join (map { |i| 'xxxxxxxxxx' } (range 200))").get()
    assert r.error_kind == "runtime" and not r.rolled_back
    assert "let big: refused" in (r.error or "") and "1 KiB binding limit" in (r.error or "")
    assert r.defined == ()
    assert shell.run("echo $big").get().error == "1:6 undefined variable big"
    assert shell.run("len $small").get().value == "100"
    durable = shell.durable_snapshot().get()
    assert "small" in durable.bindings and "big" not in durable.bindings


def test_a_string_longer_than_the_limit_is_refused_before_it_is_encoded(start_shell) -> None:
    shell = start_shell(limits=ShellLimits(max_binding_bytes=10)).proxy()
    r = shell.run("let s = 'abcdefghijklmnop'").get()
    assert r.error == (
        "1:1 let s: refused, the value holds 16 bytes, over the 10 bytes binding limit "
        "(--max-binding-bytes); bind a file path rather than the content"
    )


@pytest.mark.parametrize(
    "script",
    ["let b = $add", "let d = fold { |acc, x| [$acc] } [] (range 2000)"],
    ids=["a-builtin", "a-deep-list"],
)
def test_a_let_is_either_refused_or_survives_a_rollback_never_silently_lost(
    start_shell, script: str
) -> None:
    """Whatever the codec can encode, nothing is lost: after a ``fault crash`` rollback the
    binding is either still there, or its ``let`` was refused with a ral error naming it."""
    shell = start_shell().proxy()
    name = script.split()[1]
    r = shell.run(script).get()
    crash = shell.run("fault crash").get()
    assert crash.rolled_back
    after = shell.run(f"type ${name}").get()
    if r.error is None:
        assert name in r.defined
        assert after.error is None, f"{name} was committed and then lost: {after.error}"
    else:
        assert r.error_kind == "runtime" and f"let {name}: refused" in r.error
        assert name not in r.defined
        assert after.error == f"1:6 undefined variable {name}"


def test_a_refused_let_leaves_the_earlier_lets_of_the_same_call_committed(start_shell) -> None:
    shell = start_shell(limits=ShellLimits(max_binding_bytes=64)).proxy()
    r = shell.run("let a = 1; let big = join (map { |i| 'xxxx' } (range 100)); let c = 3").get()
    assert "let big: refused" in (r.error or "")
    assert r.defined == ("a",)
    assert shell.run("fault crash").get().rolled_back
    assert shell.run("echo $a").get().stdout == "1\n"
    for name in ("big", "c"):
        assert "undefined variable" in (shell.run(f"echo ${name}").get().error or "")


# -- memory ------------------------------------------------------------------------------------


def _data_limit(pid: int) -> int:
    soft, _hard = psutil.Process(pid).rlimit(psutil.RLIMIT_DATA)
    return int(soft)


def test_the_host_its_workers_and_their_programs_all_run_under_the_memory_limit(
    start_shell,
) -> None:
    shell = start_shell(limits=ShellLimits(memory_bytes=SMALL_MEMORY)).proxy()
    host = psutil.Process(shell.host_pid().get())
    assert _data_limit(host.pid) == SMALL_MEMORY
    shell.run("let w = spawn { /bin/sleep 30 }").get()
    sleeper = wait_for(lambda: _named(psutil.Process().children(recursive=True), "sleep"))
    worker = sleeper.parent()
    assert worker is not None and worker.pid != host.pid
    assert _data_limit(worker.pid) == SMALL_MEMORY
    assert _data_limit(sleeper.pid) == SMALL_MEMORY
    shell.run("cancel $w").get()


def _named(procs: list[psutil.Process], name: str) -> psutil.Process | None:
    for p in procs:
        try:
            if p.name() == name:
                return p
        except psutil.Error:
            continue
    return None


def test_a_native_past_the_memory_limit_is_a_catchable_out_of_memory_error_and_the_host_lives(
    start_shell,
) -> None:
    shell = start_shell(limits=ShellLimits(memory_bytes=SMALL_MEMORY)).proxy()
    shell.run("let kept = 41").get()
    pid = shell.host_pid().get()
    r = shell.run("let n = len (range 10000000)").get()
    assert r.error_kind == "runtime" and not r.rolled_back
    assert "out of memory: range" in (r.error or "")
    caught = shell.run("try { range 10000000 } catch e { get $e message }").get()
    assert caught.error is None and caught.value.startswith("out of memory: range")
    assert shell.host_pid().get() == pid
    assert shell.run("add $kept 1").get().value == "42"


def test_a_worker_past_the_memory_limit_fails_with_out_of_memory_and_await_says_so(
    start_shell,
) -> None:
    shell = start_shell(limits=ShellLimits(memory_bytes=SMALL_MEMORY)).proxy()
    r = shell.run(
        "let h = spawn { len (range 10000000) }; try { await $h } catch e { get $e message }"
    ).get()
    assert r.error is None and "out of memory: range" in r.value


def test_running_out_of_memory_outside_a_native_rolls_the_call_back_and_says_so(
    start_shell,
) -> None:
    shell = start_shell(limits=ShellLimits(memory_bytes=SMALL_MEMORY)).proxy()
    shell.run("let kept = 41").get()
    # 8 MiB, then string interpolation (the evaluator, not a native) builds 16 copies at once
    shell.run("let s = 'x'").get()
    for _ in range(23):
        assert shell.run("let s = concat $s $s").get().error is None
    r = shell.run('let t = "$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s$s"').get()
    assert r.rolled_back and "out of memory" in (r.error or "")
    assert shell.run("add $kept 1").get().value == "42"


# -- live workers ------------------------------------------------------------------------------


def test_the_default_worker_limit_is_64() -> None:
    assert ShellLimits().max_workers == DEFAULT_MAX_WORKERS == 64


def test_a_spawn_past_the_live_worker_limit_is_a_ral_error_until_one_settles(
    start_shell,
) -> None:
    shell = start_shell(limits=ShellLimits(max_workers=2)).proxy()
    assert shell.run("let a = spawn { sleep 30 }; let b = spawn { sleep 30 }").get().error is None
    r = shell.run("let c = spawn { sleep 30 }").get()
    assert r.error_kind == "runtime"
    assert "spawn: refused, this shell already runs 2 workers" in (r.error or "")
    caught = shell.run("try { spawn { 1 } } catch e { 'caught' }").get()
    assert caught.value == "caught"
    shell.run("cancel $a").get()
    wait_for(lambda: shell.probe().get().running_workers == 1, what="worker a settled")
    assert shell.run("let c = spawn { sleep 30 }").get().error is None
    probe: Any = shell.probe().get()
    assert probe.running_workers == 2
