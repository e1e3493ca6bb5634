"""What a new user met in the first hour, each reproduced as they saw it: a mistyped scenario
path, the bare command on a pipe, money and model names on a scripted run."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from exarch_actors.cli.fleet import yield_table
from exarch_actors.runtime.messages import Usage
from exarch_actors.runtime.providers.prices import FREE_DATE, PriceTable
from exarch_actors.runtime.settlement.cost import SpendMeter
from tests.agent.conftest import exarch
from tests.support.terminal import ROOT


def test_a_mistyped_scenario_path_is_an_error_naming_the_missing_file_not_a_prompt(
    tmp_path: Path,
) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "fanout.toml").write_text('[fleet]\nprompt = "x"\n')
    # an OpenAI key in the environment: the mistyped path must never reach the hosted API
    p = exarch(["run", "examples/fanout"], cwd=tmp_path, env={"OPENAI_API_KEY": "sk-test"})
    assert p.returncode == 2, p.stderr
    assert "no such file: examples/fanout" in p.stderr
    assert "did you mean examples/fanout.toml?" in p.stderr
    assert "--model" not in p.stderr, "never taken for a prompt"
    assert not (tmp_path / ".exarch").exists(), "refused before a session was made"


def test_a_missing_toml_and_a_slash_word_are_paths_but_a_sentence_with_a_slash_is_a_prompt(
    tmp_path: Path,
) -> None:
    from exarch_actors.cli.runner import looks_like_a_path

    assert looks_like_a_path("examples/fanout")
    assert looks_like_a_path("fanout.toml")
    assert not looks_like_a_path("what is 1/2 of 10")
    assert not looks_like_a_path("hello")
    p = exarch(["run", "nosuch.toml"], cwd=tmp_path)
    assert (p.returncode, "no such file: nosuch.toml" in p.stderr) == (2, True)


def test_run_help_documents_that_a_path_like_argument_is_never_a_prompt() -> None:
    p = exarch(["run", "-h"], cwd=ROOT)
    assert "a '/' or a .toml ending and no spaces is a path" in " ".join(p.stdout.split())


def test_the_bare_command_without_a_terminal_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-c", "from exarch_actors.cli.main import main; main()"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    assert "First steps:" in p.stdout
    assert "\x1b" not in p.stdout + p.stderr, "no escape codes in the pipe"
    assert "no terminal" in p.stderr
    assert not (tmp_path / ".exarch").exists(), "no chat session was started"


def test_a_free_table_charges_a_known_zero_but_a_network_model_without_a_price_stays_unknown() -> (
    None
):
    usage = Usage(input_tokens=1000, output_tokens=1000)
    network = SpendMeter()
    assert network.charge("no-such-model", usage, PriceTable()) is None
    assert network.read().cost is None, "an unpriced model is unknown, never $0"
    scripted = SpendMeter()
    free = PriceTable().free_of_charge()
    assert scripted.charge("fanout", usage, free) == 0
    assert scripted.charge("fanout", None, free) == 0, "no usage reported: still free"
    assert scripted.read().cost == 0


def _rendered_at_80(fy: dict[str, object]) -> list[str]:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(yield_table(fy))
    return console.export_text().splitlines()


def test_the_fleet_yield_table_fits_80_columns_with_every_label_whole() -> None:
    fy: dict[str, object] = {
        "spawned": 123456,
        "done": 120000,
        "down": 3000,
        "cancelled": 456,
        "neverSettled": 0,
        "releaseUnconfirmed": 0,
        "cost": {"usd": None, "knownUsd": "12345.123456", "pricesDate": "2025-11"},
    }
    lines = _rendered_at_80(fy)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    for label in ("spawned", "never settled", "release unconfirmed", "cost"):
        assert label in text
    assert "…" not in text, "nothing cut"
    assert "$? (known $12345.123456) · prices of 2025-11" in text


def test_a_scripted_fleet_yield_says_its_zero_cost_is_free() -> None:
    cost = {"usd": "0.000000", "knownUsd": "0.000000", "pricesDate": FREE_DATE}
    text = "\n".join(_rendered_at_80({"spawned": 2, "done": 2, "cost": cost}))
    assert "$0 (scripted: no charge)" in text
    assert "$?" not in text


def test_the_readme_first_screen_fits_60_lines_with_install_first_run_tests_and_next_steps() -> (
    None
):
    readme = (ROOT / "README.md").read_text()
    first = readme.split("\n## ", 2)
    screen = "\n## ".join(first[:2])  # the title and "First five minutes"
    assert len(screen.splitlines()) <= 60
    ci = (ROOT / ".ci" / "run").read_text()
    install = "pip install -e '.[test,ray]'"
    assert install in screen and install in ci, "the README's install line is the one CI runs"
    assert "```sh\npytest\n```" in screen, "the test command is exactly `pytest`"
    assert "$ exarch-actors run examples/fanout.toml\n" in screen, "what the first run prints"
    assert "Where to go next" in screen
    assert "nice" not in screen, "scheduling mechanics live in docs/architecture.md"
