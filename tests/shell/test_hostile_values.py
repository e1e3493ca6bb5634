"""Hostile values in a real shell host: a ral error or a result, never a panic and rollback.

Each of these crashed or panicked the host process before (a RecursionError while rendering,
a SIGSEGV while decoding the snapshot at rollback, a CodecError escaping ``spawn``, a
``ValueError: embedded null byte`` from ``subprocess``), or silently lost a binding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.ral_programs import rendering_after_marker
from tests.support.waiting import HANG_GUARD, wait_for

DEEP = "fold { |acc, x| [$acc] } [] (range 19999)"  # 20000 levels


def test_a_value_20000_levels_deep_is_the_result_of_the_call(start_shell: Callable) -> None:
    shell: Any = start_shell().proxy()
    r = shell.run(DEEP).get()
    assert r.error is None and not r.rolled_back
    assert r.value == "[" * 20000 + "]" * 20000


def test_a_binding_of_300_nested_variants_is_restored_after_a_rollback(
    start_shell: Callable,
) -> None:
    shell: Any = start_shell().proxy()
    assert (
        shell.run("let v = fold { |acc, x| variant a $acc } unit (range 300)").get().error is None
    )
    assert shell.run("fault panic").get().rolled_back
    r = shell.run("str $v").get()
    assert r.error is None and r.value == "a(" * 300 + "unit" + ")" * 300


def test_a_builtin_bound_to_a_name_survives_a_rollback(start_shell: Callable) -> None:
    shell: Any = start_shell().proxy()
    assert shell.run("let plus = $add").get().error is None
    assert shell.run("fault panic").get().rolled_back
    r = shell.run("plus 1 2").get()
    assert r.error is None and r.value == "3"


def test_spawning_a_closure_that_holds_a_too_deep_value_is_a_ral_error(
    start_shell: Callable,
) -> None:
    shell: Any = start_shell().proxy()
    # A session `let` of such a value is itself refused (it could not be kept): build it in a
    # block, where the binding is local and only the spawn has to encode it.
    r = shell.run(
        "try { let d = fold { |acc, x| [$acc] } [] (range 2000); spawn { $d } } "
        "catch e { $e[message] }"
    ).get()
    assert r.error is None and not r.rolled_back
    assert r.value == "spawn: value nested too deeply (over 1024 levels)"


def test_a_nul_in_a_program_argument_is_a_ral_error_in_the_shell(start_shell: Callable) -> None:
    shell: Any = start_shell().proxy()
    r = shell.run('printf "%s" "a\0b"').get()
    assert r.error_kind == "runtime" and not r.rolled_back
    assert r.error == "1:1 printf: argument 2 contains a NUL character, which the OS cannot pass"


DOUBLED_60 = "fold { |a, x| [$a, $a] } [1] (range 60)"  # 61 lists, over 2**60 items written out


def test_binding_a_value_that_doubled_itself_60_times_is_refused_as_too_large(
    start_shell: Callable,
) -> None:
    shell: Any = start_shell().proxy()
    r = shell.run(f"let x = {DOUBLED_60}").get()
    assert r.error_kind == "runtime" and not r.rolled_back
    assert "let x: refused" in r.error and "value too large" in r.error
    assert shell.run("let y = 2; $y").get().value == "2"
    assert shell.run("$x").get().error_kind == "elaboration"  # nothing was bound


def test_spawning_a_closure_that_holds_a_value_too_large_written_out_is_a_ral_error(
    start_shell: Callable,
) -> None:
    shell: Any = start_shell().proxy()
    r = shell.run(
        f"try {{ let d = {DOUBLED_60}; spawn {{ len $d }} }} catch e {{ $e[message] }}"
    ).get()
    assert r.error is None and not r.rolled_back
    assert r.value.startswith("spawn: value too large: over")


def test_a_result_that_doubled_itself_60_times_is_shown_as_a_placeholder(
    start_shell: Callable,
) -> None:
    shell: Any = start_shell().proxy()
    r = shell.run(DOUBLED_60).get()
    assert r.error is None and not r.rolled_back
    assert r.value.startswith("<value of over ")


def test_a_cancel_reaches_a_shell_rendering_a_large_shared_value_without_a_rollback(
    start_shell: Callable, tmp_path: Path
) -> None:
    """Rendering 2**23 shared leaves takes seconds; without a cancellation check in the walk the
    host would not answer within the cancel grace and would be killed and rolled back."""
    shell: Any = start_shell().proxy()
    root = shell.eval_root.get()
    assert shell.run("let kept = 1").get().error is None
    marker = tmp_path / "rendering"
    future = shell.run(rendering_after_marker(marker))
    wait_for(marker.exists, HANG_GUARD, "the rendering to start")
    root.interrupt("esc")
    r = future.get(timeout=HANG_GUARD)
    assert r.error_kind == "cancelled" and not r.rolled_back
    assert shell.run("$kept").get().value == "1"


def test_a_cancel_reaches_the_rendering_of_a_calls_result_without_a_rollback(
    start_shell: Callable, tmp_path: Path
) -> None:
    """The call's *result* is 2**25 shared leaves, under the size limit, so it is rendered in
    full: many seconds. The host renders it inside the run's cancel scope; rendered after the
    run, the cancel would go unheard and the host be killed at the grace and rolled back."""
    shell: Any = start_shell().proxy()
    root = shell.eval_root.get()
    assert shell.run("let kept = 1").get().error is None
    marker = tmp_path / "returning"
    future = shell.run(
        f"try {{ let x = fold {{ |a, x| [$a, $a] }} [1] (range 25); "
        f'write-text "{marker}" go; $x }} catch e {{ fail $e[message] }}'
    )
    wait_for(marker.exists, HANG_GUARD, "the run to reach its result")
    root.interrupt("esc")
    r = future.get(timeout=HANG_GUARD)
    assert r.error_kind == "cancelled" and not r.rolled_back
    assert shell.run("$kept").get().value == "1"
