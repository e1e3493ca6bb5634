"""A child's result that reached an agent process's inbox but not yet its event log survives the
process's SIGKILL: the restart delivers it again (issue 34, item 1).

The interleaving is forced, not timed: the parent is held in a ral call that waits for a gate
file the test creates, so the child's result is queued in the parent's inbox (read from its
process) for as long as the test needs, and the SIGKILL lands while it is there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exarch_actors.actors.agent_process import MESSAGES_CHECKED_AT, ProcessAgent
from exarch_actors.actors.fleet import Fleet, FleetConfig
from exarch_actors.runtime.drills.fault_switch import FAULTS_ENV, PAUSE_ENV
from exarch_actors.runtime.drills.invariant_check import check_session
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.providers.scripted import ScenarioPlayback
from exarch_actors.runtime.state.durable import read_json_document, read_jsonl
from exarch_actors.runtime.state.session_dir import SessionDir
from exarch_actors.runtime.state.session_records import logged_results
from tests.support.waiting import held_at, wait_for, waits_for


def _scenario(gate: Path) -> str:
    # a's first call spawns b, then waits for the gate; a restart plays on after the call it
    # interrupted (a scripted provider's cursor moves past the rounds a's log shows), to the
    # next copy of it (``repeat``): the spawn refused (b's name is used) and caught, then the
    # gate waited for again
    hold = held_at(gate)
    return f"""
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["agent a 'go'"]

[[agents.trunk]]
text = "waiting for a"
stop = "end_turn"
repeat = 30

[[agents.a]]
ral = ["try {{ agent b 'go' }} catch e {{ echo refused }}; {hold}"]
repeat = 5

[[agents.a]]
text = "waiting for b"
stop = "end_turn"
repeat = 30

[[agents.b]]
ral = ["reply 'b says hello'"]
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    toml = _scenario(tmp_path / "gate")
    playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    fleet.start_trunk(playback.scenario.prompt, interactive=True)
    yield fleet
    fleet.close()


def _results_in_log(fleet: Fleet, name: str) -> set[str]:
    events = fleet.session.events(name)
    return logged_results(read_jsonl(events).records) if events.exists() else set()


def test_a_result_queued_in_an_agent_process_killed_before_it_logged_it_reaches_the_restart(
    fleet: Fleet, tmp_path: Path
) -> None:
    a = wait_for(lambda: fleet.hosted.get("a"), 60, "a's process")
    assert isinstance(a, ProcessAgent)
    b_node = lambda: fleet.journal.state.nodes.get("b")  # noqa: E731
    wait_for(lambda: b_node() is not None and not b_node().open, 60, "b settled")  # type: ignore[union-attr]
    # b's result sits in a's inbox, in a's process: a is held in its call by the gate
    wait_for(lambda: a.probe().get("inbox", {}).get("agent_result") == 1, 30, "b's result queued")
    assert "b" not in _results_in_log(fleet, "a")
    os.kill(a.pids[0], signal.SIGKILL)
    wait_for(lambda: a.restarts == 1, 60, "a restarted")
    (tmp_path / "gate").touch()
    wait_for(lambda: "b" in _results_in_log(fleet, "a"), 30, "b's result in a's event log")
    fleet.cancel_all("done")
    wait_for(lambda: fleet.wait_empty(0), 60, "the fleet empty")
    fy = fleet.close()
    assert fy.never_settled == 0
    fleet.write_result("cancelled", None)
    report = check_session(fleet.session)
    rejections = [r for r in report.to_json()["invariants"] if r["name"] == "rejections"]
    assert rejections and rejections[0]["status"] == "held", rejections


def test_a_result_its_agent_process_never_logged_is_recorded_undelivered_when_the_agent_goes_down(
    fleet: Fleet,
) -> None:
    a = wait_for(lambda: fleet.hosted.get("a"), 60, "a's process")
    assert isinstance(a, ProcessAgent)
    wait_for(lambda: a.probe().get("inbox", {}).get("agent_result") == 1, 60, "b's result queued")
    for kill in range(4):  # the gate stays shut: every incarnation is held in its first call
        wait_for(lambda k=kill: len(a.pids) == k + 1, 60, f"start {kill + 1}")  # type: ignore[misc]
        os.kill(a.pids[-1], signal.SIGKILL)
    assert a.wait(60)
    assert a.outcome is not None and a.outcome.value == "failed"
    assert "b" not in _results_in_log(fleet, "a")
    fleet.cancel_all("done")
    wait_for(lambda: fleet.wait_empty(0), 60, "the fleet empty")
    fleet.close()
    fleet.write_result("cancelled", None)
    rejected = [
        r
        for r in read_jsonl(fleet.session.transcript).records
        if r["kind"] == "InboxRejected" and r["agent"] == "a"
    ]
    assert [r["message"]["child"] for r in rejected] == ["b"]
    report = check_session(fleet.session)
    rejections = [r for r in report.to_json()["invariants"] if r["name"] == "rejections"]
    assert rejections and rejections[0]["status"] == "held", rejections


def _message_scenario(held: Path, gate: Path) -> str:
    # a's first call says it is held (``held``) and waits for the gate; the trunk sends its
    # message only once a is held, so the message waits in a's inbox, in a's process, for as
    # long as the test needs. Each restart plays on to the next copy of that call (``repeat``:
    # a restarted agent plays on after its interrupted round), which finds the gate open once
    # the test opened it, or holds again.
    hold = held_at(gate, held)
    wait_held = waits_for(held)
    return f"""
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["agent a 'go'"]

[[agents.trunk]]
ral = ["{wait_held}; message a 'hello from the trunk'"]

[[agents.trunk]]
text = "waiting for a"
stop = "end_turn"
repeat = 30

[[agents.a]]
ral = ["{hold}"]
repeat = 5

[[agents.a]]
text = "waiting"
stop = "end_turn"
repeat = 30
"""


def _messages_in_log(fleet: Fleet, name: str) -> list[str]:
    events = fleet.session.events(name)
    records = read_jsonl(events).records if events.exists() else []
    return [r["text"] for r in records if r.get("source") == "agent_message"]


def test_a_message_queued_in_an_agent_process_killed_before_it_logged_it_reaches_the_restart(
    tmp_path: Path,
) -> None:
    """The ``message`` verb's item, like a child's result: taken by a's process (its push
    answered ``queued``), not yet logged when the process is SIGKILLed. The restart starts from
    the log with an empty inbox, so unless the control side still holds the message and
    delivers it again, it is lost: neither in a's log nor recorded undelivered."""
    toml = _message_scenario(tmp_path / "held", tmp_path / "gate")
    playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        a = wait_for(lambda: fleet.hosted.get("a"), 60, "a's process")
        assert isinstance(a, ProcessAgent)
        wait_for(
            lambda: a.probe().get("inbox", {}).get("agent_message") == 1, 60, "the message queued"
        )
        assert _messages_in_log(fleet, "a") == []
        os.kill(a.pids[0], signal.SIGKILL)
        wait_for(lambda: a.restarts == 1, 60, "a restarted")
        (tmp_path / "gate").touch()
        wait_for(lambda: bool(_messages_in_log(fleet, "a")), 30, "the message in a's event log")
        assert _messages_in_log(fleet, "a") == ["[message from agent trunk]\nhello from the trunk"]
        fleet.cancel_all("done")
        wait_for(lambda: fleet.wait_empty(0), 60, "the fleet empty")
    finally:
        fleet.close()


def test_a_message_its_agent_process_never_logged_is_recorded_undelivered_when_it_goes_down(
    tmp_path: Path,
) -> None:
    """The gate stays shut: every incarnation of a is held in its first call and killed there,
    until supervision gives up. The message none of them logged is recorded undelivered
    (``InboxRejected``, ``recipient ended``, the message itself in the record), once."""
    toml = _message_scenario(tmp_path / "held", tmp_path / "gate")
    playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        a = wait_for(lambda: fleet.hosted.get("a"), 60, "a's process")
        assert isinstance(a, ProcessAgent)
        wait_for(
            lambda: a.probe().get("inbox", {}).get("agent_message") == 1, 60, "the message queued"
        )
        for kill in range(4):
            wait_for(lambda k=kill: len(a.pids) == k + 1, 60, f"start {kill + 1}")  # type: ignore[misc]
            os.kill(a.pids[-1], signal.SIGKILL)
        assert a.wait(60)
        assert a.outcome is not None and a.outcome.value == "failed"
        assert _messages_in_log(fleet, "a") == []
        fleet.cancel_all("done")
        wait_for(lambda: fleet.wait_empty(0), 60, "the fleet empty")
    finally:
        fleet.close()
    rejected = [
        r
        for r in read_jsonl(fleet.session.transcript).records
        if r["kind"] == "InboxRejected" and r["agent"] == "a"
    ]
    assert [(r["reason"], r["message"]["text"]) for r in rejected] == [
        ("recipient ended", "hello from the trunk")
    ]


CHATTY = """
[fleet]
prompt = "go"

[[agents.trunk]]
ral = ["agent a 'go'"]

[[agents.trunk]]
ral = ["BATCHES"]

[[agents.trunk]]
text = "waiting"
stop = "end_turn"
repeat = 30

[[agents.a]]
ral = ["agent b 'hold a open'"]

[[agents.a]]
text = "ok"
stop = "end_turn"
repeat = 400

[[agents.b]]
ral = ["sh -c 'sleep 60'"]
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_messages_an_agent_process_logged_are_no_longer_held_by_its_supervisor(
    tmp_path: Path,
) -> None:
    """A long chat does not make the supervisor hold every message ever sent: once it holds
    ``MESSAGES_CHECKED_AT`` it reads the log and lets go of those logged. 120 messages in three
    batches (a drains each; b keeps a parked, not ended) leave fewer than that held."""
    batches = [f'sleep 1; map {{ |x| message a "{p}$x" }} (range 40)' for p in "mno"]
    toml = CHATTY.replace('["BATCHES"]', "['" + "; ".join(batches) + "']")
    playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        a = wait_for(lambda: fleet.hosted.get("a"), 60, "a's process")
        assert isinstance(a, ProcessAgent)
        wait_for(lambda: len(_messages_in_log(fleet, "a")) == 120, 60, "every message logged")
        assert a.messages_held < MESSAGES_CHECKED_AT
        fleet.cancel_all("done")
        wait_for(lambda: fleet.wait_empty(0), 60, "the fleet empty")
    finally:
        fleet.close()


REPLYING_KID = """
[fleet]
prompt = "delegate"

[[agents.trunk]]
ral = ["agent kid 'answer'"]

[[agents.trunk]]
ral = ["let ends = agent-wait; reply $ends[kid][reply]"]

[[agents.kid]]
ral = ["reply 'forty-two'"]

[[agents.kid]]
text = "a second model turn"
stop = "end_turn"
"""


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "T"


def _pids(transcript: Path, agent: str | None = "kid") -> list[int]:
    """An agent's process pids (every agent's: None), first start first (``Born``, then each
    ``Restarted``)."""
    pids: list[int] = []
    for r in read_jsonl(transcript).records if transcript.exists() else []:
        if agent is not None and r.get("agent") != agent:
            continue
        if r["kind"] == "Born" and r.get("pid"):
            pids.append(int(r["pid"]))
        elif r["kind"] == "Notice" and r.get("notice") == "Restarted":
            pids.append(int(r["data"]["pid"]))
    return pids


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_child_process_killed_after_its_reply_was_logged_restarts_into_that_reply(
    tmp_path: Path,
) -> None:
    """The child's process is SIGKILLed after its drive ended on its ``reply`` (the call's
    result and the reply's value in its log) and before its ``Ended`` report (the pause point
    ``drive-ended-before-report``). The restarted child ends ``replied`` with the logged reply
    at once: no second model turn (a scripted child's second round would be one; a real
    model's could be a different answer, or none)."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(REPLYING_KID)
    session = tmp_path / "session"
    env = {**os.environ, FAULTS_ENV: "1", PAUSE_ENV: "drive-ended-before-report"}
    argv = ["run", str(scenario), "--agents", "process", "--session-dir", str(session)]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    transcript = session / "transcript.jsonl"
    try:
        first = wait_for(lambda: _pids(transcript)[:1], 60, "the kid born")[0]
        wait_for(lambda: _stopped(first), 60, "the kid's drive ended, unreported")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: _pids(transcript)[1:2], 60, "the kid restarted")

        def carried_on() -> bool:
            """Every later end pauses at the same point (the restarted kid's, the trunk's):
            each is let go on."""
            for pid in _pids(transcript, None):
                if pid != first and _stopped(pid):
                    os.kill(pid, signal.SIGCONT)
            return proc.poll() is not None

        wait_for(carried_on, 120, "the run ended")
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    result = read_json_document(session / "result.json")[0]
    assert (result["outcome"], result["reply"]) == ("replied", "forty-two"), stderr
    kid = read_jsonl(session / "agents" / "kid" / "events.jsonl").records
    assert len([r for r in kid if r["kind"] == "assistant"]) == 1, "no second model turn"


def _cleared_scenario(held: Path, gate: Path) -> str:
    hold = held_at(gate, held)
    return f"""
[fleet]
prompt = "hello"

[[agents.trunk]]
text = "hi"
stop = "end_turn"

[[agents.trunk]]
text = "got the first"
stop = "end_turn"

[[agents.trunk]]
ral = ["{hold}"]

[[agents.trunk]]
text = "idle"
stop = "end_turn"
repeat = 30
"""


def test_a_message_logged_before_a_clear_is_not_given_again_to_the_restart(
    tmp_path: Path,
) -> None:
    """A message the agent logged, then a ``/clear`` (its log archived as ``events.1.jsonl``,
    a fresh ``events.jsonl`` begun), then a SIGKILL: the supervisor still held the first
    message (it lets go of logged ones only every 64), and it must find it in the archive --
    read only in the fresh log, it looked lost and was given again after the clear."""
    toml = _cleared_scenario(tmp_path / "held", tmp_path / "gate")
    playback = ScenarioPlayback(parse_scenario(toml, source=str(tmp_path / "s.toml")))
    fleet = Fleet(
        SessionDir.at(tmp_path / "session"), playback.provider, FleetConfig(agents="process")
    )
    try:
        fleet.start_trunk(playback.scenario.prompt, interactive=True)
        trunk = wait_for(lambda: fleet.hosted.get("trunk"), 60, "the trunk's process")
        assert isinstance(trunk, ProcessAgent)
        fleet.registry.message("tester", "trunk", "the first")
        wait_for(lambda: _messages_in_log(fleet, "trunk"), 60, "the first message logged")
        fleet.registry.steer("trunk", "/clear")
        archive = fleet.session.events("trunk").with_name("events.1.jsonl")
        wait_for(archive.exists, 60, "the log archived by the clear")
        fleet.registry.message("tester", "trunk", "the second")
        wait_for((tmp_path / "held").exists, 60, "the trunk held in its call")
        assert _messages_in_log(fleet, "trunk") == ["[message from agent tester]\nthe second"]
        os.kill(trunk.pids[0], signal.SIGKILL)
        wait_for(lambda: trunk.restarts == 1, 60, "the trunk restarted")
        (tmp_path / "gate").touch()

        def settled() -> bool:
            figures = trunk.probe()
            stats = figures.get("stats")
            return (
                stats is not None
                and stats.state == "idle"
                and not sum((figures.get("inbox") or {}).values())
            )

        wait_for(settled, 60, "the restarted trunk idle, its inbox empty")
        assert _messages_in_log(fleet, "trunk") == ["[message from agent tester]\nthe second"]
        fleet.cancel_all("done")
        wait_for(lambda: fleet.wait_empty(0), 60, "the fleet empty")
    finally:
        fleet.close()
