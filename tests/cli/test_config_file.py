"""Config files: the user's (``$XDG_CONFIG_HOME/exarch-actors/config.toml``) under the
project's (``.exarch/config.toml``) under the flags, and ``run --show-config`` saying where each
value came from."""

from __future__ import annotations

import json
from pathlib import Path

from tests.agent.conftest import exarch
from tests.support.terminal import ROOT

QUICK = '[fleet]\nprompt = "x"\n' + '[[agents.trunk]]\nral = ["reply 1"]\n' * 2


def _configured(tmp_path: Path) -> dict[str, str]:
    user = tmp_path / "xdg" / "exarch-actors"
    user.mkdir(parents=True)
    (user / "config.toml").write_text(
        'provider = "openai"\nmodel = "m-user"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'max_workers = 8\ndurability = "machine"\n'
    )
    (tmp_path / ".exarch").mkdir()
    (tmp_path / ".exarch" / "config.toml").write_text('max_workers = 16\nagents = "thread"\n')
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}


def test_show_config_says_the_project_overrides_the_user_and_a_flag_overrides_both(
    tmp_path: Path,
) -> None:
    env = _configured(tmp_path)
    p = exarch(["run", "--show-config", "--durability", "process"], cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    user = tmp_path / "xdg" / "exarch-actors" / "config.toml"
    lines = p.stdout.splitlines()
    assert f"model = m-user  (config {user})" in lines
    assert "max_workers = 16  (config .exarch/config.toml)" in lines, "the project wins"
    assert "agents = thread  (config .exarch/config.toml)" in lines
    assert "durability = process  (flag --durability)" in lines, "a flag wins over both"
    assert "max_binding_bytes = 268435456  (default)" in lines
    assert any(line.startswith("provider = openai for a PROMPT") for line in lines)


def test_a_scenario_run_takes_the_configured_defaults_but_stays_scripted(tmp_path: Path) -> None:
    env = _configured(tmp_path)
    (tmp_path / "quick.toml").write_text(QUICK)
    p = exarch(["run", "quick.toml", "--session-dir", "s"], cwd=tmp_path, env=env)
    assert (p.returncode, p.stdout.strip()) == (0, "1"), p.stderr
    spec = json.loads((tmp_path / "s" / "run.json").read_text())
    assert spec["provider"] == "scripted", "the configured provider is for prompts"
    assert (spec["durability"], spec["agents"]) == ("machine", "thread")
    assert spec["shellLimits"]["maxWorkers"] == 16


def test_a_prompt_goes_to_the_configured_provider_model_and_endpoint(tmp_path: Path) -> None:
    env = _configured(tmp_path)
    p = exarch(
        ["run", "hello there", "--session-dir", "s", "--retries", "0"], cwd=tmp_path, env=env
    )
    assert p.returncode == 1, p.stderr  # nothing listens on port 9: the run fails, saying why
    spec = json.loads((tmp_path / "s" / "run.json").read_text())
    assert (spec["provider"], spec["model"]) == ("openai", "m-user")
    assert spec["baseUrl"] == "http://127.0.0.1:9/v1"


def test_a_config_value_of_the_wrong_kind_is_exit_2_naming_the_file_and_key(
    tmp_path: Path,
) -> None:
    (tmp_path / ".exarch").mkdir()
    (tmp_path / ".exarch" / "config.toml").write_text('durability = "forever"\n')
    p = exarch(["run", "--show-config"], cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert p.returncode == 2
    assert "config .exarch/config.toml: durability:" in p.stderr and "Traceback" not in p.stderr


def test_run_help_names_both_config_files() -> None:
    out = " ".join(exarch(["run", "-h"], cwd=ROOT).stdout.split())
    assert "~/.config/exarch-actors/config.toml and .exarch/config.toml" in out
    assert "--show-config" in out
