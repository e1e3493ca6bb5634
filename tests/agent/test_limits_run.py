"""The per-shell limit flags through the real ``exarch-actors run``: what the model sees, what
``run.json`` keeps for ``resume``, and that ``check`` finds every committed binding."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.agent.conftest import Run, exarch

LIMITED = """
[fleet]
prompt = "hit every limit"

[[agents.trunk]]
ral = [
  "let small = 'fits'",
  "let big = join (map { |i| 'xxxxxxxxxx' } (range 200))",
  "let w = spawn { sleep 30 }",
  "let v = spawn { 1 }",
  "let b = $add",
]

[[agents.trunk]]
ral = ["cancel $w; reply $small"]
"""


def test_run_refuses_a_big_binding_and_a_second_worker_under_its_flags_and_check_holds(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(LIMITED, "--max-binding-bytes", "1KiB", "--max-workers", "1")
    assert run.code == 0, run.stderr
    assert run.stdout.strip() == "fits"
    seen = {r["script"]: r for r in run.kinds("transcript.jsonl", "Io")}
    big = seen["let big = join (map { |i| 'xxxxxxxxxx' } (range 200))"]
    assert big["error"] and "let big: refused" in big["value"]
    second = seen["let v = spawn { 1 }"]
    assert second["error"] and "already runs 1 workers" in second["value"]
    assert seen["let w = spawn { sleep 30 }"]["error"] is None
    spec = json.loads((run.session / "run.json").read_text())
    assert spec["shellLimits"] == {
        "shellMemory": 2 << 30,
        "maxWorkers": 1,
        "maxBindingBytes": 1024,
        "sandbox": "full-access",  # a scripted run's default: the user's own scenario
        "maxProcesses": 512,
    }
    committed = {n for r in run.commits() for n in r["defined"]}
    assert "big" not in committed and "small" in committed
    check = exarch(["check", "--json", str(run.session)], cwd=run.session.parent)
    report = json.loads(check.stdout)
    by_name = {i["name"]: i for i in report["invariants"]}
    assert by_name["committed"]["status"] == "held", by_name["committed"]
    assert check.returncode == 0, check.stdout


def test_a_size_flag_that_is_not_a_size_is_refused_with_exit_2(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(LIMITED, "--max-binding-bytes", "lots")
    assert run.code == 2
    assert "not a size: 'lots'" in run.stderr
