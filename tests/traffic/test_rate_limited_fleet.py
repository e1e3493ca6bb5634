"""A fleet against a rate-limited model server on 127.0.0.1, end to end through ``exarch-actors
run``: the traffic governor keeps every child alive at the server's limit, in both dialects,
limited by requests and separately by tokens, with limits learned or set.

The server (``tests/support/fleet_model.py``) allows 20 requests a second with a burst of 10
and answers 429 with the vendors' headers; the trunk forks children that each make 5 ral calls
and reply, and replies with the sum of their replies. Wall-clock ratios are a benchmark's
(``benchmarks/traffic_governor.py``), never asserted here: this box may be loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import exarch
from tests.support.fleet_model import FleetModel, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _run(
    model: FleetModel, tmp_path: Path, *flags: str, agents: str = "thread"
) -> tuple[Any, dict[str, Any]]:
    with serving(model) as url:
        p = exarch(
            [
                "run",
                "--provider",
                model.dialect,
                "--base-url",
                url,
                "--model",
                "m",
                "--api-key",
                "k",
                "--agents",
                agents,
                "--session-dir",
                str(tmp_path / "session"),
                "--json",
                *flags,
                "fan out",
            ],
            cwd=tmp_path,
            timeout=220,
        )
    out = json.loads(p.stdout) if p.stdout.strip() else {}
    return p, out


def _all_replied(p: Any, out: dict[str, Any], children: int) -> None:
    assert p.returncode == 0, p.stderr[-3000:]
    assert out["outcome"] == "replied" and out["reply"] == str(sum(range(children)))
    assert out["fleetYield"]["byReason"] == {"replied": children}


@pytest.mark.parametrize(("dialect", "agents"), [("openai", "process"), ("anthropic", "thread")])
def test_forty_children_at_twenty_requests_a_second_all_reply_with_at_most_a_tenth_refused(
    dialect: str, agents: str, tmp_path: Path
) -> None:
    model = FleetModel(dialect=dialect, rate=20, burst=10, children=40, calls=5)
    p, out = _run(model, tmp_path, agents=agents)
    _all_replied(p, out, 40)
    assert model.refused_share <= 0.10, (model.ok, model.refused)
    traffic = out["fleetYield"]["traffic"]
    (lane,) = traffic["lanes"].values()
    assert lane["limits"]["requests"] == {"per_minute": 1200.0, "source": "learned"}
    assert traffic["requests"] == model.total  # every request the server saw went through it


def test_with_rpm_set_no_request_is_refused(tmp_path: Path) -> None:
    model = FleetModel(dialect="openai", rate=20, burst=10, children=40, calls=5)
    p, out = _run(model, tmp_path, "--rpm", "1200")
    _all_replied(p, out, 40)
    assert model.refused == 0, model.ok
    (lane,) = out["fleetYield"]["traffic"]["lanes"].values()
    assert lane["limits"]["requests"]["source"] == "set"


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_server_limited_by_input_tokens_is_paced_by_tokens_and_every_child_replies(
    dialect: str, tmp_path: Path
) -> None:
    # requests are plentiful (200/s); input tokens bind: ~40,000 a second, one second's burst
    model = FleetModel(
        dialect=dialect,
        rate=200,
        burst=100,
        token_rate=40_000,
        token_burst=40_000,
        children=20,
        calls=5,
    )
    p, out = _run(model, tmp_path)
    _all_replied(p, out, 20)
    assert model.refused_share <= 0.10, (model.ok, model.refused)
    (lane,) = out["fleetYield"]["traffic"]["lanes"].values()
    learned = "tokens" if dialect == "openai" else "input"
    assert lane["limits"][learned] == {"per_minute": 2_400_000.0, "source": "learned"}


def test_a_server_that_sends_no_limit_headers_is_backed_off_and_every_child_replies(
    tmp_path: Path,
) -> None:
    model = FleetModel(dialect="openai", rate=20, burst=10, children=20, calls=5, headers=False)
    p, out = _run(model, tmp_path)
    _all_replied(p, out, 20)
    (lane,) = out["fleetYield"]["traffic"]["lanes"].values()
    assert lane["throttled"] == model.refused > 0  # it met 429s, waited, and nobody failed
    # backed off: each agent retrying on its own met 290 refusals in 505 requests (57%)
    assert model.refused_share <= 0.30, (model.ok, model.refused)


def test_a_wait_past_rate_wait_fails_the_run_and_says_so(tmp_path: Path) -> None:
    # one request a minute: the first goes, every other waits past a ceiling of 1 s
    model = FleetModel(dialect="openai", rate=1 / 60, burst=1, children=3, calls=5)
    p, out = _run(model, tmp_path, "--rate-wait", "1")
    assert p.returncode == 1, p.stderr[-2000:]
    assert out["outcome"] == "failed"
    assert "--rate-wait 1" in (out["error"] or ""), out["error"]
    assert out["fleetYield"]["traffic"]["expired"] >= 1


def test_a_recorded_run_that_waited_for_the_rate_limit_replays_without_divergence(
    tmp_path: Path,
) -> None:
    # one agent, a server that allows a request every 2 s and says nothing but 429:
    # the run meets a refusal, waits, and replies; its recording plays back offline
    model = FleetModel(dialect="openai", rate=0.5, burst=1, children=0, calls=3, headers=False)
    p, out = _run(model, tmp_path, "--record", str(tmp_path / "rec.toml"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert model.refused >= 1 and out["fleetYield"]["traffic"]["throttled"] == model.refused
    replay = exarch(["replay", str(tmp_path / "session")], cwd=tmp_path, timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "no divergence" in replay.stdout + replay.stderr


def test_ctrl_c_while_agents_wait_for_the_rate_limit_cancels_the_run_at_once(
    tmp_path: Path,
) -> None:
    """One request a minute: the trunk's first goes, then it and its children wait in the
    governor; SIGINT withdraws every waiter and the run ends cancelled (exit 130), settled."""
    import os
    import signal
    import subprocess
    import sys

    from tests.agent.conftest import ROOT, read_records
    from tests.support.waiting import wait_for

    model = FleetModel(dialect="openai", rate=1 / 60, burst=2, children=3, calls=5)
    session = tmp_path / "session"
    with serving(model) as url:
        cmd = [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", "run"]
        cmd += ["--provider", "openai", "--base-url", url, "--model", "m", "--api-key", "k"]
        cmd += ["--agents", "process", "--session-dir", str(session), "fan out"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
        try:
            # the spawn went; the limit learned from it (one a minute) holds everyone else
            def born() -> int:
                path = session / "transcript.jsonl"
                records = read_records(path) if path.exists() else []
                return sum(r["kind"] == "Born" for r in records)

            wait_for(lambda: born() >= 4, 60, "the three children born")
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 130
    result = json.loads((session / "result.json").read_text())
    assert result["outcome"] == "cancelled"
    journal = read_records(session / "spawn-journal.jsonl")
    settled = {r["id"] for r in journal if r["kind"] in ("settled", "cancelled")}
    assert settled == {"c0", "c1", "c2"}, journal
    assert model.refused == 0 and model.ok == 1  # nothing went past the learned limit
