"""What ``run`` prints, and when: the session first, the trunk's ral errors as they happen, a
live line per agent on a terminal only, the reply (or the last text) at the end, ``--quiet`` and
``--json`` for scripts, and the scenario's unknown-key warnings."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.conftest import Run, scenario_run
from tests.support.terminal import ROOT, Terminal
from tests.support.waiting import wait_for

NO_REPLY = """
    [fleet]
    prompt = "x"

    [[agents.trunk]]
    text = "Trying."
    ral = ["let y = nosuchcommand 1"]

    [[agents.trunk]]
    text = "I could not do it."
"""

REPLIES = """
    [fleet]
    prompt = "x"

    [[agents.trunk]]
    ral = ["reply 7"]

    [[agents.trunk]]
    ral = ["reply 7"]
"""


@pytest.fixture(scope="module")
def no_reply(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One finished plain run of NO_REPLY, shared by the tests that only read its outputs."""
    return scenario_run(tmp_path_factory.mktemp("no-reply"), NO_REPLY)


class Running:
    """``exarch-actors run SCENARIO`` in a subprocess whose stderr is read line by line while it
    runs (a pipe: not a terminal)."""

    def __init__(self, tmp_path: Path, toml: str) -> None:
        scenario = tmp_path / "scenario.toml"
        scenario.write_text(textwrap.dedent(toml))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from exarch_actors.cli.main import main; main()",
                "run",
                str(scenario),
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []

    def line_with(self, text: str, timeout: float = 30.0) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if text in line:
                    return line
            left = deadline - time.monotonic()
            assert left > 0, f"no stderr line with {text!r} yet: {self.lines}"
            ready, _, _ = select.select([self.proc.stderr], [], [], min(left, 0.1))
            if ready:
                line = self.proc.stderr.readline()
                assert line, f"stderr closed before {text!r}: {self.lines}"
                self.lines.append(line)

    def interrupt(self) -> tuple[int, str, str]:
        """Ctrl-C; the exit code and the rest of stdout and stderr."""
        self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, "".join(self.lines) + err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def test_the_session_path_is_the_first_line_printed_while_the_trunk_is_still_working(
    tmp_path: Path,
) -> None:
    run = Running(tmp_path, '[fleet]\nprompt = "x"\n[[agents.trunk]]\nral = ["sleep 30"]\n')
    try:
        first = run.line_with("session: ")
        assert run.lines == [first], "nothing comes before the session line"
        assert run.proc.poll() is None, "printed while the trunk still works"
        session = tmp_path / first.removeprefix("session: ").strip()
        assert (session / "run.json").is_file()
        code, _out, err = run.interrupt()
    finally:
        run.kill()
    assert code == 130
    assert "outcome: cancelled" in err
    assert "\x1b[" not in err and "turn 1" not in err, "off a terminal: no live display"


@pytest.mark.slow
def test_a_trunk_ral_error_is_printed_as_it_happens_and_the_run_still_quiesces_with_exit_0(
    tmp_path: Path, no_reply: Run
) -> None:
    running = Running(
        tmp_path,
        """
        [fleet]
        prompt = "x"
        [[agents.trunk]]
        ral = ["let y = nosuchcommand 1"]
        [[agents.trunk]]
        ral = ["sleep 30"]
        """,
    )
    try:
        line = running.line_with("ral error (trunk)")
        assert running.proc.poll() is None, "shown while the run goes on"
        running.interrupt()
    finally:
        running.kill()
    assert line.strip() == (
        "ral error (trunk): 1:9 unknown command nosuchcommand (not a binding, builtin or program)"
    )
    finished = no_reply
    assert finished.code == 0 and finished.result["outcome"] == "quiesced"
    err = finished.stderr
    assert err.index("ral error (trunk): 1:9 unknown command") < err.index("outcome: quiesced")


def test_a_trunk_that_ends_with_text_but_never_replies_prints_that_text_with_a_note(
    no_reply: Run,
) -> None:
    run = no_reply
    assert run.code == 0
    assert run.result["reply"] is None
    assert run.stdout == "I could not do it.\n"
    assert "note: the trunk ended without calling `reply`; its last text was:" in run.stderr


@pytest.mark.slow
def test_quiet_prints_the_reply_alone_and_nothing_on_stderr(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(REPLIES, "--quiet")
    assert run.code == 0
    assert (run.stdout, run.stderr) == ("7\n", "")


@pytest.mark.slow
def test_json_prints_exactly_one_object_with_the_last_text_and_the_error_field(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(NO_REPLY, "--json")
    assert run.code == 0
    (line,) = run.stdout.splitlines()
    record = json.loads(line)
    assert record["outcome"] == "quiesced" and record["reply"] is None
    assert record["lastText"] == "I could not do it."
    assert record["error"] is None
    assert record["session"] == str(run.session)
    assert record["fleetYield"]["neverSettled"] == 0
    assert "outcome:" not in run.stderr and "session:" not in run.stderr


@pytest.mark.slow
def test_on_a_terminal_run_draws_a_live_line_per_agent_with_turn_calls_tokens_and_last_call(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        textwrap.dedent(
            """
            [fleet]
            prompt = "go"
            [[agents.trunk]]
            ral = ["agent kid 'work'", "sleep 1"]
            usage_tokens = 100
            [[agents.trunk]]
            text = "waiting"
            stop = "end_turn"
            [[agents.trunk]]
            ral = ["reply done"]
            [[agents.trunk]]
            ral = ["reply done"]
            [[agents.kid]]
            ral = ["sleep 1"]
            [[agents.kid]]
            ral = ["reply 5"]
            """
        )
    )
    term = Terminal(["run", str(scenario)], cwd=tmp_path)
    try:
        code = term.wait()
    finally:
        term.close()
    assert code == 0, term.plain
    screen = term.plain
    assert screen.startswith("session: .exarch/sessions/")
    # The last frame, drawn once both agents have ended (then cleared: the status is transient).
    # a scripted run bills no one: its cost is a known zero, usage reported or not (a network
    # model with no price stays `$?`: tests/cli/test_first_hour.py)
    assert "trunk replied · turn 2 · 4 calls · 100 tok · $0.000000 · last: reply done" in screen
    assert "kid replied · turn 1 · 2 calls · tok ? · $0.000000 · last: reply 5" in screen
    assert "\x1b[" in term.seen, "drawn with terminal control sequences"
    assert screen.rstrip().endswith("outcome: replied\r\nchildren: 1 replied\r\ndone")


@pytest.mark.slow
def test_unknown_scenario_keys_are_printed_as_warnings_with_their_file_position(
    tmp_path: Path, run_scenario: Callable[..., Run]
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "x"
        promt = "typo"
        [[agents.trunk]]
        ral = ["reply 7"]
        stopp = "end_turn"
        [[agents.trunk]]
        ral = ["reply 7"]
        """
    )
    assert run.code == 0
    path = tmp_path / "scenario.toml"
    warnings = [ln for ln in run.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings == [
        f"warning: {path}:4: fleet.promt: unknown key (ignored)",
        f"warning: {path}:7: agents.trunk[0].stopp: unknown key (ignored)",
    ]


@pytest.mark.slow
def test_after_ctrl_c_of_run_on_the_chat_example_stdout_carries_nothing_but_a_reply(
    tmp_path: Path,
) -> None:
    # examples/chat.toml is written for the chat UI: its trunk says "Press Esc to interrupt me"
    # and sleeps; `run` on it, then Ctrl-C, once printed that text on stdout as the reply
    example = (ROOT / "examples" / "chat.toml").read_text()
    run = Running(tmp_path, example)
    try:
        run.line_with("session: ")

        def sleeping() -> bool:
            logs = list((tmp_path / ".exarch" / "sessions").glob("*/agents/trunk/events.jsonl"))
            return bool(logs) and "Press Esc" in logs[0].read_text()

        wait_for(sleeping, 30, "the trunk to start its slow call")
        code, out, err = run.interrupt()
    finally:
        run.kill()
    assert code == 130, err
    assert "outcome: cancelled" in err
    assert out == "", "no reply: nothing on stdout"
    assert "cancelled before a reply" in err and "Press Esc to interrupt me" in err
