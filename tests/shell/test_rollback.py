"""Panic rollback: a dead or panicking host is replaced from the durable snapshot."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from exarch_actors.runtime.state.durable import read_jsonl
from tests.support.waiting import ended, wait_for


def _records(tmp_path: Path, kind: str) -> list[dict]:
    return [r for r in read_jsonl(tmp_path / "record.jsonl").records if r["kind"] == kind]


def test_fault_crash_rolls_back_and_keeps_every_completed_calls_bindings(
    start_shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXARCH_FAULTS", "1")
    shell = start_shell(faults=None).proxy()
    assert shell.run("let a = 41").get().error is None
    pid_before = shell.host_pid().get()
    r = shell.run("let b = 2; cd /; setenv K v; fault crash").get()
    assert r.rolled_back and r.error_kind == "panic"
    assert "signal 9" in r.error
    assert shell.host_pid().get() != pid_before
    assert shell.run("add $a 1").get().value == "42"
    refused = shell.run("echo $b").get()
    assert refused.error == "1:6 undefined variable b"
    assert shell.run("pwd").get().value == os.getcwd()
    assert shell.run("env K").get().value != "v"
    (rec,) = _records(tmp_path, "Rollback")
    assert rec["agent"] == "trunk" and rec["epoch"] == 2 and "signal 9" in rec["reason"]


def test_an_external_sigkill_of_the_host_mid_program_rolls_back_and_kills_the_program(
    start_shell, tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    shell.run("let kept = 1").get()
    host = psutil.Process(shell.host_pid().get())
    future = shell.run("let lost = 2; /bin/sleep 10")
    sleeper = wait_for(lambda: next(iter(host.children()), None))
    os.kill(host.pid, signal.SIGKILL)
    r = future.get(timeout=10)
    assert r.rolled_back
    assert shell.run("echo $kept").get().stdout == "1\n"
    assert shell.run("echo $lost").get().error == "1:6 undefined variable lost"
    wait_for(lambda: ended(sleeper))
    assert len(_records(tmp_path, "Rollback")) == 1


def test_fault_panic_is_an_internal_error_and_rolls_back(start_shell, tmp_path: Path) -> None:
    shell = start_shell().proxy()
    shell.run("let a = 1").get()
    r = shell.run("let a = 2; fault panic").get()
    assert r.rolled_back and "InternalPanic" in r.error
    assert shell.run("echo $a").get().stdout == "1\n"
    (rec,) = _records(tmp_path, "Rollback")
    assert "internal error" in rec["reason"]


def test_a_ral_error_is_a_clean_boundary_and_keeps_its_earlier_bindings(start_shell) -> None:
    shell = start_shell().proxy()
    r = shell.run("let a = 1; div 1 0").get()
    assert r.error_kind == "runtime" and not r.rolled_back
    shell.run("fault panic").get()
    assert shell.run("echo $a").get().stdout == "1\n"
