"""The system prompt (runtime.prompt + runtime/prompts/): a package file, verbs iff advertised."""

from __future__ import annotations

from importlib import resources
from itertools import combinations

import pytest

from exarch_actors.runtime.fleet.digest import banner
from exarch_actors.runtime.prompt import (
    AGENT_VERBS,
    VerbMismatch,
    advertised_verbs,
    build_system_prompt,
)


def verb_lines(prompt: str) -> set[str]:
    return {v for v in AGENT_VERBS if f"- `{v} " in prompt}


def test_the_prompt_is_a_file_in_the_package() -> None:
    files = resources.files("exarch_actors.runtime.prompts")
    assert files.joinpath("system.md").is_file() and files.joinpath("verbs.md").is_file()


def test_a_returning_agent_sees_reply_and_a_conversing_agent_does_not() -> None:
    ret = build_system_prompt(advertised_verbs(returns=True), "kid", True, 2)
    conv = build_system_prompt(advertised_verbs(returns=False), "trunk", False, 3)
    assert ret is not None and conv is not None
    assert "reply" in verb_lines(ret)
    assert "reply" not in verb_lines(conv) and "`reply" not in conv


@pytest.mark.parametrize("returns", [True, False])
def test_each_verb_appears_iff_advertised(returns: bool) -> None:
    optional = [v for v in AGENT_VERBS if v != "reply"]
    for k in range(len(optional) + 1):
        for subset in combinations(optional, k):
            verbs = frozenset(subset) | ({"reply"} if returns else set())
            prompt = build_system_prompt(verbs, "a", returns, 1)
            assert prompt is not None
            assert verb_lines(prompt) == verbs


def test_an_agent_with_no_fuel_still_sees_agent() -> None:
    prompt = build_system_prompt(advertised_verbs(returns=True), "leaf", True, 0)
    assert prompt is not None and "- `agent NAME PROMPT`" in prompt
    assert "spawn fuel is 0" in prompt


def test_schedule_verbs_follow_allow_schedule() -> None:
    verbs = advertised_verbs(returns=True, allow_schedule=False)
    prompt = build_system_prompt(verbs, "a", True, 1)
    assert prompt is not None and not {"schedule", "unschedule"} & verb_lines(prompt)


def test_chat_mode_has_no_prompt() -> None:
    assert (
        build_system_prompt(advertised_verbs(returns=False), "trunk", False, 3, chat=True) is None
    )


def test_reply_and_returns_must_agree() -> None:
    with pytest.raises(VerbMismatch):
        build_system_prompt(frozenset({"reply"}), "a", False, 1)
    with pytest.raises(VerbMismatch):
        build_system_prompt(frozenset({"agent"}), "a", True, 1)
    with pytest.raises(VerbMismatch):
        build_system_prompt(frozenset({"reply", "teleport"}), "a", True, 1)


def test_the_prompt_teaches_the_core_of_ral_and_the_digest_banner() -> None:
    prompt = build_system_prompt(advertised_verbs(returns=True), "trunk", True, 3)
    assert prompt is not None
    for needle in (
        "let rec",
        "try {",
        "catch e",
        "use PATH",
        "spawn {",
        "await $h",
        "[a: 1",
        "variant ok 3",
        "view-text PATH",
        "$xs[0]",
        "undefined",
    ):
        assert needle in prompt, needle
    shown = banner("stdout", 1, 2).split("bytes elided")[1].split("(")[0].strip()
    assert shown in prompt  # the prompt quotes the banner the digest really emits
    assert "{{" not in prompt and "trunk" in prompt
    assert len(prompt.encode()) < 8 * 1024  # compact: well under the cost of one tool result


def test_the_prompt_teaches_memory_spawns_and_that_worker_results_come_back() -> None:
    from exarch_actors.runtime.shell.surfacing import surface_text

    prompt = build_system_prompt(advertised_verbs(returns=True), "trunk", True, 3)
    assert prompt is not None
    assert "agent NAME PROMPT [memory: true]" in prompt
    assert "copy of this conversation" in prompt
    assert "[worker ID finished: ...]" in prompt
    told = surface_text("w3-1", value="42", error=None)
    assert told.startswith("[worker w3-1 finished: "), "the prompt names the header it will see"
