"""Binding leases through the real shell: a pruned name's closure works, sinks, large bindings."""

from __future__ import annotations

from pathlib import Path

from exarch_actors.runtime.state.durable import read_jsonl


def _prunes(tmp_path: Path) -> list[dict]:
    return [r for r in read_jsonl(tmp_path / "record.jsonl").records if r["kind"] == "Prune"]


def test_the_capture_scenario_big_is_pruned_after_256_idle_calls_and_f_keeps_working(
    start_shell, tmp_path: Path, notices
) -> None:
    shell = start_shell(notice_sink=notices).proxy()
    big = "x" * (1_100_000)
    r = shell.run(f"let big = '{big}'").get()  # epoch 1
    assert [n.notice for n in r.notices] == ["LargeBinding"]
    assert r.notices[0].data["name"] == "big" and r.notices[0].data["size"] > 1_048_576
    shell.run("let f = { len $big }").get()  # epoch 2: the last text that names big
    for _ in range(255):  # epochs 3..257
        assert shell.run("f").get().value == "1100000"
    assert _prunes(tmp_path) == []
    r = shell.run("f").get()  # epoch 258: 256 calls after big's last use
    assert r.value == "1100000"
    assert [n.notice for n in r.notices] == ["Prune"]
    (rec,) = _prunes(tmp_path)
    assert rec == {**rec, "agent": "trunk", "names": ["big"], "epoch": 258}
    assert shell.run("f").get().value == "1100000"
    assert shell.run("echo $big").get().error == "1:6 undefined variable big"
    assert "Prune" in notices.kinds()


def test_a_pruned_name_is_not_resurrected_by_a_rollback(start_shell) -> None:
    shell = start_shell(idle_calls=2, notice_sink=lambda n: None).proxy()
    shell.run("let scratch = 1").get()
    shell.run("2").get()
    shell.run("3").get()  # pruned at this boundary, checkpoint follows
    assert shell.run("fault panic").get().rolled_back
    assert shell.run("echo $scratch").get().error == "1:6 undefined variable scratch"


def test_prune_waits_while_no_surface_sink_is_installed(start_shell, tmp_path: Path) -> None:
    shell = start_shell(idle_calls=2).proxy()
    shell.run("let scratch = 1").get()
    for _ in range(5):
        shell.run("2").get()
    assert _prunes(tmp_path) == []
    assert shell.run("echo $scratch").get().stdout == "1\n"


def test_a_name_that_reaches_a_running_worker_is_pinned_not_pruned(start_shell) -> None:
    shell = start_shell(idle_calls=2, notice_sink=lambda n: None).proxy()
    shell.run("let hs = [(spawn { sleep 10 })]").get()
    for _ in range(3):
        shell.run("1").get()
    probe = shell.probe().get()
    assert probe.pinned_bindings == 1
    assert shell.run("len $hs").get().value == "1"


def test_failed_runs_age_scratch_but_renew_nothing(start_shell, tmp_path: Path) -> None:
    shell = start_shell(idle_calls=3, notice_sink=lambda n: None).proxy()
    shell.run("let s = 1").get()
    assert shell.run("echo $s $nope").get().compiled is False  # refused: names s, renews nothing
    shell.run("2").get()
    shell.run("3").get()
    assert _prunes(tmp_path)[0]["names"] == ["s"]


def test_probe_reads_figures_and_renews_nothing(start_shell) -> None:
    shell = start_shell(idle_calls=5, notice_sink=lambda n: None).proxy()
    shell.run("let a = 1; let b = 'xyz'").get()
    shell.run("1").get()
    first = shell.probe().get()
    assert (first.live_bindings, first.baseline_bindings) == (2, 0)
    assert first.nearest_binding_expiry_calls == 4
    assert first.bytes_held > 0
    for _ in range(3):
        assert shell.probe().get() == first


def test_a_name_the_panicking_call_referenced_is_not_pruned_by_its_rollback(start_shell) -> None:
    shell = start_shell(idle_calls=3, notice_sink=lambda n: None).proxy()
    shell.run("let keep = 41").get()  # epoch 1
    shell.run("2").get()
    shell.run("3").get()
    # epoch 4 would prune `keep` (idle 3 calls) had the panicking call not renewed it
    assert shell.run("echo $keep; fault panic").get().rolled_back
    assert shell.run("add $keep 1").get().value == "42"


def test_a_name_the_crashed_call_referenced_survives_its_rollback_too(start_shell) -> None:
    shell = start_shell(idle_calls=3, notice_sink=lambda n: None).proxy()
    shell.run("let keep = 41").get()
    shell.run("2").get()
    shell.run("3").get()
    # SIGKILL mid-call: the harvest was sent before anything ran, so it outlives the host
    assert shell.run("echo $keep; fault crash").get().rolled_back
    assert shell.run("add $keep 1").get().value == "42"


def test_a_rollback_still_ages_a_name_the_panicking_call_did_not_reference(start_shell) -> None:
    shell = start_shell(idle_calls=3, notice_sink=lambda n: None).proxy()
    shell.run("let idle = 1").get()
    shell.run("2").get()
    shell.run("3").get()
    assert shell.run("fault panic").get().rolled_back
    assert shell.run("echo $idle").get().error == "1:6 undefined variable idle"


def test_a_name_only_a_use_file_referenced_survives_the_rollback_of_the_panicking_call(
    start_shell, tmp_path: Path
) -> None:
    lib = tmp_path / "lib.ral"
    lib.write_text("echo $keep\n")
    shell = start_shell(idle_calls=3, notice_sink=lambda n: None).proxy()
    shell.run("let keep = 41").get()
    shell.run("2").get()
    shell.run("3").get()
    # the script never names `keep`: the host reports the use file's harvest before running it
    assert shell.run(f"use '{lib}'; fault crash").get().rolled_back
    assert shell.run("add $keep 1").get().value == "42"
