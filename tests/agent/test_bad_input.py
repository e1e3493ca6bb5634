"""Bad input to ``exarch-actors run``: exit 2 with a message that says where and what."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.conftest import Run, exarch


@pytest.mark.slow
@pytest.mark.parametrize(
    ("toml", "where", "what"),
    [
        (
            '[fleet]\nprompt = "x"\n[[agents.trunk]]\nral = [1, 2]\n',
            ":4:",
            "agents.trunk[0].ral[0]",
        ),
        ('[fleet]\nprompt = "x"\n[[agents.trunk]\ntext = "y"\n', ":3:", "invalid TOML"),
        ('[fleet]\nprompt = "x"\n\n[[agents.t]]\nrepeat = -1\n', ":5:", "agents.t[0].repeat"),
        ('[fleet]\nprompt = "x"\n[[agents.t]]\nerror = "meteor"\n', ":4:", "agents.t[0].error"),
        ("[fleet]\nwindow_tokens = 0\n", ":2:", "fleet.window_tokens"),
    ],
)
def test_a_malformed_scenario_exits_2_with_the_file_position(
    run_scenario: Callable[..., Run], toml: str, where: str, what: str
) -> None:
    run = run_scenario(toml)
    assert run.code == 2
    assert f"scenario.toml{where}" in run.stderr and what in run.stderr
    assert not (run.session / "result.json").exists(), "nothing ran"


@pytest.mark.slow
def test_a_missing_scenario_file_exits_2(tmp_path: Path) -> None:
    p = exarch(["run", str(tmp_path / "nope.toml")], cwd=tmp_path)
    assert p.returncode == 2 and "nope.toml" in p.stderr


@pytest.mark.slow
def test_network_flags_on_the_scripted_provider_exit_2(run_scenario: Callable[..., Run]) -> None:
    run = run_scenario('[fleet]\nprompt = "x"\n', "--timeout", "1")
    assert run.code == 2 and "network providers only" in run.stderr


def test_a_scenario_without_a_prompt_exits_2(run_scenario: Callable[..., Run]) -> None:
    run = run_scenario("[[agents.trunk]]\ntext = 'hi'\n")
    assert run.code == 2 and "nothing to do" in run.stderr
