"""Every example in examples/ does what its header documents and leaves nothing behind: no file
in the temporary directory it would use (``TMPDIR``), nothing in the working directory but the
session directory.

An example documents itself in its header comment::

    #   exarch-actors run examples/fanout.toml
    #   prints: 499500
    #   fleet yield: spawned 3, done 2, down 1      (optional)
    #   too large for CI: ... examples/SMALL.toml   (optional: run through its small twin)

The headless examples are run with exactly that command (plus ``--json`` to read the outcome);
the chat example is driven through its first scripted exchange in the real chat UI.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agent.conftest import Run, exarch
from tests.support.terminal import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
COMMAND = re.compile(r"^#\s+exarch-actors (\w+) (examples/\S+\.toml)\s*$", re.MULTILINE)
PRINTS = re.compile(r"^#\s+prints: (.+)$", re.MULTILINE)
YIELD = re.compile(r"^#\s+fleet yield: (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Documented:
    command: str
    path: str
    prints: str | None
    fleet_yield: dict[str, int]


def documented(example: Path) -> Documented:
    text = example.read_text()
    (command,) = COMMAND.findall(text) or [None]
    assert command is not None, f"{example.name} documents no `exarch-actors CMD` line"
    prints = PRINTS.search(text)
    fy = YIELD.search(text)
    counts = {}
    if fy is not None:
        for part in fy.group(1).split(","):
            key, value = part.split()
            counts[key] = int(value)
    return Documented(command[0], command[1], prints.group(1) if prints else None, counts)


def _leftovers(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.iterdir())


def test_every_example_documents_its_command_and_what_it_prints() -> None:
    assert EXAMPLES, "examples/ is not empty"
    for example in EXAMPLES:
        doc = documented(example)
        assert doc.path == f"examples/{example.name}"
        assert doc.command in ("run", "fleet", "chat")
        if doc.command != "chat":
            assert doc.prints, f"{example.name} does not say what it prints"


LARGE = re.compile(r"^#\s+too large for CI: .*examples/(\S+\.toml)", re.MULTILINE)
"""An example that names its small twin (``examples/fanin.toml``: 1,000 agents) is run through
that twin."""

HEADLESS = [
    e
    for e in EXAMPLES
    if "exarch-actors chat" not in e.read_text() and not LARGE.search(e.read_text())
]


def test_a_large_example_has_a_small_twin_that_is_run() -> None:
    large = [e for e in EXAMPLES if LARGE.search(e.read_text())]
    for example in large:
        match = LARGE.search(example.read_text())
        assert match is not None
        twin = ROOT / "examples" / match.group(1)
        assert twin in HEADLESS, f"{example.name}'s twin {twin.name} is not run"
        assert documented(twin).command == documented(example).command


@pytest.mark.slow
@pytest.mark.parametrize("example", HEADLESS, ids=[e.stem for e in HEADLESS])
def test_a_headless_example_prints_what_it_documents_and_leaves_nothing_outside_its_session(
    example: Path, tmp_path: Path
) -> None:
    doc = documented(example)
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    p = exarch(
        [doc.command, str(ROOT / doc.path), "--json"],
        cwd=cwd,
        env={"TMPDIR": str(tmp)},
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout)
    assert record["reply"] == doc.prints
    for key, value in doc.fleet_yield.items():
        assert record["fleetYield"][key] == value, key
    assert _leftovers(tmp) == [], "nothing in the temporary directory"
    session = Path(record["session"])
    assert session.parent == cwd / ".exarch" / "sessions"
    assert _leftovers(cwd) == [".exarch"]
    assert _leftovers(cwd / ".exarch" / "sessions") == [session.name]


@pytest.mark.slow
def test_the_fanout_example_runs_from_a_directory_whose_files_shadow_standard_modules(
    tmp_path: Path,
) -> None:
    """The installed command, started where an ``inspect.py`` and a ``signal.py`` lie: its fork
    server and every process forked from it import the standard modules, not these (they
    imported ``inspect.py`` from the working directory, and the run ended in a traceback)."""
    command = Path(sys.executable).with_name("exarch-actors")
    assert command.exists(), "the README's set-up installs the command"
    for module in ("inspect", "signal"):
        (tmp_path / f"{module}.py").write_text("raise SystemExit('shadowed')\n")
    p = subprocess.run(
        [str(command), "run", str(ROOT / "examples" / "fanout.toml"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["reply"] == "499500"


def test_the_chat_example_answers_its_first_message_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exarch_actors.runtime.providers.scenario import load_scenario
    from tests.tui.conftest import chat

    example = ROOT / "examples" / "chat.toml"
    assert documented(example).command == "chat"
    answer = load_scenario(example).agents["trunk"][1].text
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the shells' environment is copied from this one

    async def scenario() -> None:
        async with chat(tmp_path, example.read_text()) as c:
            await c.say("hello")
            await c.until(lambda: answer in c.text(), what="the scripted answer")
            assert "entries here" in c.text()

    asyncio.run(scenario())
    assert _leftovers(tmp) == []
    assert _leftovers(tmp_path) == ["chat.toml", "session", "tmp"]


@pytest.mark.slow
def test_each_agent_finds_its_own_scratch_directory_in_exarch_scratch(
    run_scenario: Callable[..., Run],
) -> None:
    run = run_scenario(
        """
        [fleet]
        prompt = "x"
        [[agents.trunk]]
        ral = ["env EXARCH_SCRATCH", "agent kid 'look'"]
        [[agents.trunk]]
        text = "waiting"
        stop = "end_turn"
        [[agents.trunk]]
        ral = ["reply done"]
        [[agents.trunk]]
        ral = ["reply done"]
        [[agents.kid]]
        ral = ["env EXARCH_SCRATCH", "reply ok"]
        """
    )
    assert run.code == 0, run.stderr
    seen = {
        r["agent"]: r["value"].removeprefix("[value]\n")
        for r in run.kinds("transcript.jsonl", "Io")
        if r["script"] == "env EXARCH_SCRATCH"
    }
    scratch = (run.session / "scratch").resolve()
    assert seen == {"trunk": str(scratch / "trunk"), "kid": str(scratch / "kid")}
    assert _leftovers(scratch) == ["trunk"], "a child's scratch goes with its environment"


@pytest.mark.slow
def test_the_readme_first_run_prints_what_the_readme_shows(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## First five minutes", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```text\n\$ exarch-actors ([^\n]+)\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the README shows a first run and what it prints"
    args, shown = block.group(1).split(), block.group(2).splitlines()
    (tmp_path / "examples").mkdir()
    for arg in args:
        if arg.startswith("examples/"):
            (tmp_path / arg).write_bytes((ROOT / arg).read_bytes())
    p = exarch(args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    session = re.sub(r"(\.exarch/sessions/)\S+", r"\1<id>", p.stderr)
    assert session.splitlines() + p.stdout.splitlines() == shown
