"""``-h`` everywhere, exit codes in every command's help, the shared provider options."""

from __future__ import annotations

import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from exarch_actors.cli.main import main
from tests.support.terminal import ROOT

EXIT_CODES = {
    "ral": {0, 1, 2},
    "run": {0, 1, 2, 130, 143},
    "fleet": {0, 1, 2, 130, 143},
    "resume": {0, 1, 2, 130, 143},
    "replay": {0, 1, 2, 130, 143},
    "chat": {0, 2},
    "drill": {0, 1, 2, 130, 143},
    "check": {0, 1, 2},
    "sessions": {0, 2},
    "trace": {0, 2},
    "report": {0, 2},
}
PROVIDER_FLAGS = ("--model", "--base-url", "--api-key", "--timeout", "--retries")


def _commands() -> list[str]:
    assert isinstance(main, click.Group)
    return main.list_commands(click.Context(main))


def _help(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "-h"], prog_name="exarch-actors")
    assert result.exit_code == 0, result.output
    return result.output


def test_dash_h_shows_the_help_of_the_group_and_of_every_command() -> None:
    assert "Usage: exarch-actors [OPTIONS] [COMMAND]" in _help()
    for name in _commands():
        out = _help(name)
        assert out.startswith(f"Usage: exarch-actors {name}"), out
        assert "-h, --help" in out


def test_every_command_lists_its_exit_codes_in_its_help() -> None:
    assert set(_commands()) == set(EXIT_CODES), "a new command documents its exit codes here too"
    for name, codes in EXIT_CODES.items():
        out = _help(name)
        assert "Exit codes:" in out, f"{name} -h says nothing of its exit codes"
        section = out.split("Exit codes:", 1)[1].split("Options:", 1)[0]
        listed = {int(m) for m in re.findall(r"^\s+(\d+)\s{2,}\S", section, re.MULTILINE)}
        assert listed == codes, f"{name}: {sorted(listed)}"


def test_every_command_that_writes_a_session_offers_the_durability_knob_and_its_promises() -> None:
    for name in ("run", "fleet", "chat", "resume", "drill"):
        out = " ".join(_help(name).split())
        assert "--durability [process|machine]" in out, name
        assert "survives a SIGKILL of any process, not a power loss" in out, name
        assert "survives a kernel crash or power loss too" in out, name


def test_the_top_level_help_says_a_bare_command_opens_the_chat_demo() -> None:
    out = " ".join(_help().split())
    assert "With no command, `exarch-actors` opens the chat UI on a packaged scripted demo" in out
    assert "exarch-actors run examples/fanout.toml" in out


def test_drill_help_documents_its_optional_scenario_argument() -> None:
    out = _help("drill")
    assert out.startswith("Usage: exarch-actors drill [OPTIONS] [SCENARIO]")
    assert "Each round plays SCENARIO if given" in " ".join(out.split())


@pytest.mark.parametrize("name", ["run", "fleet", "chat", "resume"])
def test_every_running_command_takes_the_shared_provider_options(name: str) -> None:
    out = _help(name)
    for flag in PROVIDER_FLAGS:
        assert flag in out, f"{name} lacks {flag}"
    assert ("--provider" in out) is (name != "resume"), "resume keeps the run's provider"
    assert "OPENAI_API_KEY" in out and "EXARCH_API_KEY" not in out


def test_chat_refuses_network_flags_on_a_scripted_conversation_before_the_screen_opens() -> None:
    example = str(ROOT / "examples" / "chat.toml")
    result = CliRunner().invoke(main, ["chat", example, "--timeout", "5"])
    assert result.exit_code == 2
    assert "--timeout applies to the network providers only" in result.output


INVOKED_ALONE_FIRST = """
import click
from click.testing import CliRunner
from exarch_actors.cli.main import main

for name in main.list_commands(click.Context(main)):
    cmd = main.get_command(click.Context(main), name)
    alone = CliRunner().invoke(cmd, ["-h"])
    grouped = CliRunner().invoke(main, [name, "-h"])
    print(name, alone.exit_code, grouped.exit_code)
"""


def test_every_command_takes_dash_h_on_its_own_and_still_under_the_group_afterwards() -> None:
    """A command invoked on its own first (as tests of one command do) keeps ``-h`` under the
    group: click builds a command's help option once, from the first context that asks. In a
    fresh process, so no earlier ``-h`` has built it already."""
    p = subprocess.run(
        [sys.executable, "-c", INVOKED_ALONE_FIRST],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    codes = {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines()}
    assert codes == {name: ["0", "0"] for name in EXIT_CODES}, codes
