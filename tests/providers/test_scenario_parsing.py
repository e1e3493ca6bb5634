"""Scenario files: docs/scenarios.md's format, and malformed files rejected with their position."""

from __future__ import annotations

from pathlib import Path

import pytest

from exarch_actors.runtime.errors import ScenarioError
from exarch_actors.runtime.messages import StopReason
from exarch_actors.runtime.providers.scenario import load_scenario, parse_scenario

SCENARIO_MD_EXAMPLE = """\
[fleet]
prompt = "Count the files and report."   # the trunk's first user message
window_tokens = 8000                     # optional: the model window
system = "optional system prompt override"

[[agents.trunk]]                 # one assistant message of the agent named "trunk"
text = "Let me look."            # optional assistant text
ral = ["let n = len (lines (explore-dir .))", "echo $n"]
stop = "tool_use"

[[agents.trunk]]
ral = ["agent counter 'count again'"]   # spawns a returning child named "counter"

[[agents.trunk]]
text = "Done: 3 files."          # no ral: the turn ends

[[agents.counter]]
ral = ["reply 3"]
repeat = 1
"""


def test_the_scenario_md_example_parses_into_its_fleet_and_agents() -> None:
    s = parse_scenario(SCENARIO_MD_EXAMPLE, source="example.toml")
    assert s.prompt == "Count the files and report."
    assert s.window_tokens == 8000
    assert s.system == "optional system prompt override"
    trunk = s.script_for("trunk")
    assert [m.text for m in trunk] == ["Let me look.", "", "Done: 3 files."]
    assert trunk[0].ral == ("let n = len (lines (explore-dir .))", "echo $n")
    assert s.script_for("counter")[0].ral == ("reply 3",)
    assert s.warnings == ()


def test_stop_defaults_to_tool_use_with_ral_and_end_turn_without() -> None:
    s = parse_scenario(SCENARIO_MD_EXAMPLE)
    assert [m.stop for m in s.script_for("trunk")] == [
        StopReason.TOOL_USE,
        StopReason.TOOL_USE,
        StopReason.END_TURN,
    ]


def test_every_optional_message_field_is_read() -> None:
    s = parse_scenario(
        """
[[agents.a]]
text = "t"
usage_tokens = 7000
fn_arguments = "{not json"
delay_ms = 250
error = "rate_limit"
stop = "max_tokens"
repeat = 2
"""
    )
    (m,) = s.entries_for("a")
    assert (m.usage_tokens, m.fn_arguments, m.delay_ms, m.error, m.stop, m.repeat) == (
        7000,
        "{not json",
        250,
        "rate_limit",
        StopReason.MAX_TOKENS,
        2,
    )
    assert len(s.script_for("a")) == 2


def test_a_toml_syntax_error_names_the_file_line_and_column() -> None:
    with pytest.raises(ScenarioError, match=r"^bad\.toml:3:8: invalid TOML"):
        parse_scenario('[[agents.trunk]]\ntext = "ok"\nstop = \n', source="bad.toml")


def test_a_bad_stop_names_the_key_path_the_line_and_the_allowed_values() -> None:
    text = '[[agents.trunk]]\ntext = "a"\n\n[[agents.trunk]]\nral = ["x"]\nstop = "stopp"\n'
    with pytest.raises(ScenarioError) as e:
        parse_scenario(text, source="s.toml")
    assert str(e.value) == (
        "s.toml:6: agents.trunk[1].stop: expected one of tool_use, end_turn, max_tokens, "
        'got "stopp"'
    )


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("repeat = -1", "agents.trunk[0].repeat: expected a non-negative integer"),
        ('repeat = "2"', "agents.trunk[0].repeat: expected a non-negative integer"),
        ('error = "boom"', "agents.trunk[0].error: expected one of rate_limit, transport"),
        ("delay_ms = 1.5", "agents.trunk[0].delay_ms: expected a non-negative integer"),
        ("usage_tokens = true", "agents.trunk[0].usage_tokens: expected a non-negative integer"),
        ('ral = ["ok", 3]', "agents.trunk[0].ral[1]: expected a string"),
        ("text = 3", "agents.trunk[0].text: expected a string, got int 3"),
    ],
)
def test_each_schema_error_names_its_key_path_and_line(body: str, path: str) -> None:
    with pytest.raises(ScenarioError, match=rf"^f\.toml:3: {__import__('re').escape(path)}"):
        parse_scenario(f"# comment\n[[agents.trunk]]\n{body}\n", source="f.toml")


def test_a_pattern_entry_error_names_the_quoted_pattern() -> None:
    with pytest.raises(ScenarioError, match=r'^p\.toml:3: agents\."worker-\*"\[0\]\.stop'):
        parse_scenario('\n[[agents."worker-*"]]\nstop = 1\n', source="p.toml")


def test_fleet_errors_name_the_fleet_key() -> None:
    with pytest.raises(ScenarioError, match=r"^f\.toml:3: fleet\.window_tokens: expected a pos"):
        parse_scenario('[fleet]\nprompt = "p"\nwindow_tokens = 0\n', source="f.toml")
    with pytest.raises(ScenarioError, match=r"fleet\.prompt: expected a string"):
        parse_scenario("[fleet]\nprompt = 1\n")


def test_a_single_table_instead_of_an_array_of_tables_is_explained() -> None:
    with pytest.raises(ScenarioError, match=r"^s\.toml:1: agents\.trunk: expected an array"):
        parse_scenario('[agents.trunk]\ntext = "x"\n', source="s.toml")


def test_unknown_keys_are_kept_as_positioned_warnings_not_errors() -> None:
    s = parse_scenario(
        '[fleet]\nprompt = "p"\nmodel = "x"\n\n[[agents.trunk]]\ntxet = "typo"\n',
        source="w.toml",
    )
    assert s.warnings == (
        "w.toml:3: fleet.model: unknown key (ignored)",
        "w.toml:6: agents.trunk[0].txet: unknown key (ignored)",
    )


def test_inline_array_form_parses_and_errors_still_carry_the_key_path() -> None:
    s = parse_scenario('[agents]\ntrunk = [{text = "a"}, {ral = ["b"]}]\n')
    assert [m.text for m in s.script_for("trunk")] == ["a", ""]
    with pytest.raises(ScenarioError, match=r"agents\.trunk\[1\]\.stop"):
        parse_scenario('[agents]\ntrunk = [{text = "a"}, {stop = "x"}]\n')


def test_an_exact_name_wins_over_a_pattern_and_patterns_match_by_prefix() -> None:
    s = parse_scenario(
        '[[agents."worker-*"]]\ntext = "pattern"\n[[agents.worker-7]]\ntext = "exact"\n'
    )
    assert s.script_for("worker-7")[0].text == "exact"
    assert s.script_for("worker-1")[0].text == "pattern"
    assert s.script_for("workers") == ()


def test_an_unreadable_or_non_utf8_file_is_a_scenario_error_naming_the_file(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ScenarioError, match=rf"^{missing}: cannot read scenario"):
        load_scenario(missing)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[fleet]\nprompt = "caf\xe9"\n')
    with pytest.raises(ScenarioError, match=rf"^{bad}: scenario is not UTF-8"):
        load_scenario(bad)


def test_load_scenario_reports_positions_against_the_real_path(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[[agents.trunk]]\nerror = "nope"\n')
    with pytest.raises(ScenarioError, match=rf"^{f}:2: agents\.trunk\[0\]\.error"):
        load_scenario(f)


GRANTS = """\
[fleet]
prompt = "p"

[grants."*"]
roots = ["."]

[grants.trunk]
exec = ["printf", "ls"]
root = ["typo"]

[grants."worker-*"]
exec = []
"""


def test_grants_tables_are_read_per_name_or_pattern_with_names_kept_as_written() -> None:
    s = parse_scenario(GRANTS, source="g.toml")
    assert [(t.pattern, t.exec, t.roots) for t in s.grants] == [
        ("*", None, (".",)),
        ("trunk", ("printf", "ls"), None),
        ("worker-*", (), None),
    ]
    assert s.warnings == ("g.toml:9: grants.trunk.root: unknown key (ignored)",)


def test_grants_tables_resolve_programs_and_roots_once_against_the_given_cwd(
    tmp_path: Path,
) -> None:
    tables = dict(parse_scenario(GRANTS).resolve_grants(cwd=str(tmp_path)))
    assert tables["*"].roots == (str(tmp_path.resolve()),)
    trunk_exec = tables["trunk"].exec
    assert trunk_exec is not None and {g.name for g in trunk_exec} == {"printf", "ls"}
    assert all(g.path.startswith("/") for g in trunk_exec)
    assert tables["worker-*"].exec == frozenset()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('exec = "printf"', "g.toml:2: grants.trunk.exec: expected a list of non-empty strings"),
        ("roots = [1]", "g.toml:2: grants.trunk.roots: expected a list of non-empty strings"),
        ('exec = [""]', "g.toml:2: grants.trunk.exec: expected a list of non-empty strings"),
    ],
)
def test_a_malformed_grants_table_names_its_key_path_and_line(body: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=f"^{__import__('re').escape(message)}"):
        parse_scenario(f"[grants.trunk]\n{body}\n", source="g.toml")


def test_grants_that_are_not_tables_are_refused_with_their_key_path() -> None:
    with pytest.raises(ScenarioError, match=r"^g\.toml: grants\.trunk: expected a table"):
        parse_scenario("[grants]\ntrunk = 3\n", source="g.toml")
    with pytest.raises(ScenarioError, match=r"^g\.toml: grants: expected a table of names"):
        parse_scenario("grants = 3\n", source="g.toml")


def test_a_grants_table_naming_a_missing_program_is_refused_at_its_line(tmp_path: Path) -> None:
    s = parse_scenario(
        '\n[grants.kid]\nroots = ["."]\nexec = ["no-such-prog-x9"]\n', source="g.toml"
    )
    with pytest.raises(
        ScenarioError,
        match=r"^g\.toml:4: grants\.kid\.exec: cannot grant exec no-such-prog-x9: not found",
    ):
        s.resolve_grants(cwd=str(tmp_path))
