"""The Python API (``exarch_actors``, docs/api.md) on real fleets: the scripted provider, real
shell processes, real session directories."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import exarch_actors
from exarch_actors import Progress, RunRefused
from exarch_actors.runtime.events import Born, Died, Io

ROOT = Path(__file__).resolve().parents[2]
FANOUT = ROOT / "examples" / "fanout.toml"

SLOW_TRUNK = """
[fleet]
prompt = "wait"

[[agents.trunk]]
delay_ms = 600000
text = "never reached"
"""


def test_run_plays_the_fanout_scenario_and_returns_outcome_reply_yield_and_session(
    tmp_path: Path,
) -> None:
    result = exarch_actors.run(FANOUT, agents="thread", session_dir=tmp_path / "s")
    assert (result.outcome, result.reply, result.exit_code) == ("replied", "499500", 0)
    assert result.session == (tmp_path / "s").resolve()
    assert (result.session / "result.json").is_file()
    assert (result.fleet_yield.spawned, result.fleet_yield.done) == (2, 2)


def test_a_packaged_example_is_found_by_its_bare_name(tmp_path: Path) -> None:
    result = exarch_actors.run("fanout", agents="thread", session_dir=tmp_path / "s")
    assert result.reply == "499500"


def test_events_name_each_agent_born_its_ral_calls_progress_and_its_end(tmp_path: Path) -> None:
    handle = exarch_actors.start(FANOUT, agents="thread", session_dir=tmp_path / "s")
    events = list(handle.events())
    assert handle.wait().reply == "499500"
    born = [e.agent for e in events if isinstance(e, Born)]
    died = {e.agent: e.outcome for e in events if isinstance(e, Died)}
    assert sorted(born) == ["hi", "lo", "trunk"]
    assert died == {"hi": "replied", "lo": "replied", "trunk": "replied"}
    assert events.index(next(e for e in events if isinstance(e, Born))) < events.index(
        next(e for e in events if isinstance(e, Died))
    )
    assert any(isinstance(e, Io) and e.agent == "lo" for e in events)
    last = {e.agent: e for e in events if isinstance(e, Progress)}
    assert (last["trunk"].turns, last["trunk"].ral_calls) == (3, 5)  # prompt + 2 results


def test_async_events_leave_the_loop_free_for_other_tasks_while_the_run_goes_on(
    tmp_path: Path,
) -> None:
    handle = exarch_actors.start(FANOUT, agents="thread", session_dir=tmp_path / "s")
    ticks_while_running = 0

    async def ticker() -> None:
        nonlocal ticks_while_running
        while not handle.done:
            ticks_while_running += 1
            await asyncio.sleep(0.01)

    async def main() -> list[str]:
        tick = asyncio.create_task(ticker())
        kinds = [e.kind async for e in handle.aevents()]
        await tick
        result = await handle.await_result()
        assert result.reply == "499500"
        return kinds

    kinds = asyncio.run(main())
    assert kinds.count("Born") == 3 and kinds.count("Died") == 3
    assert ticks_while_running > 0


def test_cancel_from_another_thread_ends_the_run_cancelled_and_settles_the_tree(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "slow.toml"
    scenario.write_text(SLOW_TRUNK)
    handle = exarch_actors.start(scenario, agents="thread", session_dir=tmp_path / "s")
    for event in handle.events():
        if isinstance(event, Born):
            break
    canceller = threading.Thread(target=handle.cancel)
    canceller.start()
    canceller.join()
    result = handle.wait(timeout=50)
    assert result.outcome == "cancelled"
    assert result.exit_code == 130
    assert exarch_actors.check(result.session).ok


def test_a_missing_scenario_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(RunRefused, match=r"no such file: .*nope\.toml"):
        exarch_actors.run(tmp_path / "nope.toml", session_dir=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_check_resume_and_replay_take_the_session_a_run_left(tmp_path: Path) -> None:
    result = exarch_actors.run(
        FANOUT, agents="thread", session_dir=tmp_path / "s", record=tmp_path / "rec.toml"
    )
    assert exarch_actors.check(result.session).ok
    with pytest.raises(RunRefused):
        exarch_actors.resume(result.session)  # it finished: nothing to resume
    again, report = exarch_actors.replay_recording(result.session, session_out=tmp_path / "r")
    assert again.reply == "499500"
    assert not report.diverged
    with pytest.raises(RunRefused, match=r"not a session|no run"):
        exarch_actors.check(tmp_path)


def test_every_public_name_has_a_docstring_and_a_section_in_docs_api() -> None:
    api_doc = (ROOT / "docs" / "api.md").read_text()
    for name in exarch_actors.__all__:
        value = getattr(exarch_actors, name)
        assert inspect.getdoc(value), f"exarch_actors.{name} has no docstring"
        assert f"`{name}" in api_doc, f"docs/api.md does not document {name}"
        if inspect.isclass(value):
            for member, attr in vars(value).items():
                if not member.startswith("_") and callable(attr):
                    assert inspect.getdoc(attr), f"exarch_actors.{name}.{member}: no docstring"
                    assert f"{member}" in api_doc, f"docs/api.md: {name}.{member} missing"


@pytest.mark.slow
def test_the_embedding_example_prints_the_fanout_sum(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "499500"
    assert "born: lo" in done.stderr and "died: trunk" in done.stderr
