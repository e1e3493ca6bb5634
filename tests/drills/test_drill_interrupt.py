"""Ctrl-C (a real SIGINT) or SIGTERM to a real ``exarch-actors drill`` process settles the round
it is in, writes the report of the rounds run marked interrupted, exits 128 + the signal, and
leaves no process behind."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from exarch_actors.cli.drill_rounds import child_env, exarch
from exarch_actors.runtime.state.durable import read_jsonl
from tests.support.waiting import wait_for


def _ok_calls(session: Path) -> int:
    recs = read_jsonl(session / "transcript.jsonl").records
    return sum(1 for r in recs if r.get("kind") == "Io" and r.get("error") is None)


def _running(procs: list[psutil.Process]) -> list[int]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running: same process
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("sig", "faults"),
    [
        (signal.SIGINT, "panic"),
        (signal.SIGTERM, "panic"),
        (signal.SIGINT, "control-kill"),
    ],
    ids=["sigint-in-process-round", "sigterm-in-process-round", "sigint-control-kill-round"],
)
def test_a_signal_mid_round_settles_the_round_writes_an_interrupted_report_and_exits_128_plus_it(
    tmp_path: Path, sig: signal.Signals, faults: str
) -> None:
    root = tmp_path / "drill"
    args = ["drill", "--seed", "7", "--rate", "5", "--faults", faults, "--duration", "60"]
    args += ["--agents", "2", "--calls", "40", "--call-ms", "100", "--session-dir", str(root)]
    proc = subprocess.Popen(
        exarch(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env()
    )
    try:
        # the first round is under way: a fleet (here or in the control-kill child) has run calls
        wait_for(lambda: _ok_calls(root / "round-000") >= 2, 90, "the first round's calls")
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err.decode()[-3000:]
    assert b"Aborted" not in err

    report = json.loads((root / "drill-report.json").read_text())
    assert report["interrupted"] == sig.name and report["exitCode"] == 128 + sig
    assert report["invariants"]["violated"] == 0, json.dumps(report["rounds"], indent=1)[:4000]
    last = report["rounds"][-1]
    assert last["interrupted"] is True and last["dir"].endswith("round-000")
    if faults == "control-kill":
        assert last["mode"] == "killed+resumed"
    result = json.loads((root / "round-000" / "result.json").read_text())
    assert result["outcome"] == "cancelled"

    assert family, "the drill had started its fleet's processes"
    wait_for(lambda: not _running(family), 10, "every process of the drill to end")
