"""The fault switch (runtime/drills/fault_switch.py): on only inside its scope or with
EXARCH_FAULTS=1
at start, and a drill turns it on for its own rounds without leaving anything set behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exarch_actors.cli.drill import DrillConfig, run_drill
from exarch_actors.runtime.drills.fault_switch import FAULTS_ENV, faults_enabled, injecting_faults
from exarch_actors.runtime.ral.session import Session
from exarch_actors.runtime.state.durable import read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir


def _binds_fault() -> bool:
    s = Session()
    try:
        return s.is_sigma("fault")
    finally:
        s.close()


def test_a_shell_built_inside_the_scope_binds_fault_and_one_built_after_it_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    assert not faults_enabled() and not _binds_fault()
    with injecting_faults():
        with injecting_faults():
            assert _binds_fault()
        assert faults_enabled()  # the inner scope's end leaves the outer one on
    assert not faults_enabled() and not _binds_fault()


def test_the_scope_ends_even_when_its_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    with pytest.raises(RuntimeError), injecting_faults():
        raise RuntimeError("boom")
    assert not faults_enabled()


@pytest.mark.slow
def test_a_drill_injects_its_faults_into_its_rounds_and_leaves_the_environment_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    cfg = DrillConfig(3, 6.0, ("panic",), 1.5, agents=2, calls=8, call_ms=30, root=tmp_path)
    result = run_drill(cfg)
    report = json.loads((tmp_path / "drill-report.json").read_text())
    assert result.ok, json.dumps(report["rounds"], indent=1)[:4000]
    rollbacks = [
        r
        for rnd in report["rounds"]
        for r in read_jsonl(SessionDir(Path(rnd["dir"])).record).records
        if r.get("kind") == "Rollback"
    ]
    assert rollbacks, "no shell of the drill's rounds bound `fault`: no panic rolled back"
    assert FAULTS_ENV not in os.environ
    assert not faults_enabled()
