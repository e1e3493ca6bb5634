"""The transcript vocabulary and the admission invariant (X2/X7, docs/architecture.md)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.messages import (
    EMPTY_REPLY_STUB,
    AssistantMessage,
    StopReason,
    SystemPrompt,
    ToolCall,
    ToolResult,
    TranscriptItem,
    Usage,
    UserMessage,
    admission_repairs,
    admit_assistant,
    admit_with_report,
    message_from_dict,
)
from exarch_actors.runtime.providers import anthropic, openai

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_tool_call_arguments_that_decode_to_a_non_object_are_repaired_to_an_empty_object(
    value: Any,
) -> None:
    msg = AssistantMessage("", (ToolCall("c1", "ral", json.dumps(value)),), StopReason.TOOL_USE)
    admitted = admit_assistant(msg)
    assert admitted.tool_calls[0].arguments == {}
    assert any(r.startswith("X2") for r in admission_repairs(msg))


@given(st.text())
def test_tool_call_arguments_that_are_not_json_at_all_are_repaired_to_an_empty_object(
    raw: str,
) -> None:
    try:
        ok = isinstance(json.loads(raw), dict)
    except ValueError:
        ok = False
    admitted = admit_assistant(AssistantMessage("", (ToolCall("c1", "ral", raw),)))
    assert isinstance(admitted.tool_calls[0].arguments, dict)
    if not ok:
        assert admitted.tool_calls[0].arguments == {}


def test_tool_call_arguments_given_as_object_text_are_decoded_not_discarded() -> None:
    msg = AssistantMessage("", (ToolCall("c1", "ral", '{"script": "echo 1"}'),))
    assert admit_assistant(msg).tool_calls[0].arguments == {"script": "echo 1"}
    assert admission_repairs(msg) == ()


def test_an_assistant_message_with_no_text_and_no_tool_call_is_committed_with_the_stub() -> None:
    for text in ("", "   \n\t"):
        msg = AssistantMessage(text, (), StopReason.END_TURN)
        assert admit_assistant(msg).text == EMPTY_REPLY_STUB
        assert any(r.startswith("X7") for r in admission_repairs(msg))


def test_an_assistant_message_with_a_tool_call_keeps_its_empty_text() -> None:
    msg = AssistantMessage("", (ToolCall("c1", "ral", {"script": "echo"}),), StopReason.TOOL_USE)
    assert admit_assistant(msg).text == ""
    assert admission_repairs(msg) == ()


def test_admission_keeps_stop_reason_and_usage_so_the_driver_still_sees_truncation() -> None:
    msg = AssistantMessage("", (), StopReason.MAX_TOKENS, Usage(100, 7))
    admitted = admit_assistant(msg)
    assert admitted.stop_reason is StopReason.MAX_TOKENS
    assert admitted.usage == Usage(100, 7)


def test_empty_bad_or_duplicate_tool_call_ids_are_replaced_by_unique_well_formed_ones() -> None:
    calls = (
        ToolCall("", "ral", {}),
        ToolCall("same", "ral", {}),
        ToolCall("same", "ral", {}),
        ToolCall("has space/slash", "ral", {}),
    )
    admitted = admit_assistant(AssistantMessage("", calls))
    ids = [c.id for c in admitted.tool_calls]
    assert len(set(ids)) == 4
    assert ids[1] == "same"
    assert all(c.replace("_", "").replace("-", "").isalnum() for c in ids)
    assert admit_assistant(AssistantMessage("", calls)) == admitted  # deterministic


tool_calls = st.builds(
    ToolCall,
    st.text(max_size=6),
    st.just("ral"),
    st.text(max_size=12) | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)
assistant_messages = st.builds(
    AssistantMessage,
    st.text(max_size=10),
    st.lists(tool_calls, max_size=3).map(tuple),
    st.sampled_from(list(StopReason)),
    st.none() | st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**6)),
)


@given(assistant_messages)
def test_admission_is_idempotent_and_its_result_needs_no_repair(msg: AssistantMessage) -> None:
    once = admit_assistant(msg)
    assert admit_assistant(once) == once
    assert admission_repairs(once) == ()


@given(assistant_messages)
def test_every_admitted_message_renders_to_a_request_a_strict_backend_accepts(
    msg: AssistantMessage,
) -> None:
    admitted = admit_assistant(msg)
    results = [ToolResult(c.id, "ok") for c in admitted.tool_calls]
    transcript: list[TranscriptItem] = [UserMessage("go"), admitted, *results]
    for turn in anthropic.render_anthropic_messages(transcript):
        for block in turn["content"]:
            if block["type"] == "text":
                assert block["text"].strip()
            if block["type"] == "tool_use":
                assert isinstance(block["input"], dict)
    for m in openai.render_openai_messages(transcript, None):
        for call in m.get("tool_calls", ()):
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
        if m["role"] == "assistant":
            assert m.get("tool_calls") or (m["content"] or "").strip()


@given(
    st.one_of(
        assistant_messages,
        st.builds(UserMessage, st.text()),
        st.builds(ToolResult, st.text(), st.text(), st.booleans()),
        st.builds(SystemPrompt, st.text()),
    )
)
def test_every_transcript_value_survives_a_json_round_trip_for_the_event_log(item: Any) -> None:
    assert message_from_dict(json.loads(json.dumps(item.to_dict()))) == item


def test_stop_reason_accepts_its_wire_string() -> None:
    msg = AssistantMessage("x", (), "max_tokens")  # type: ignore[arg-type]
    assert msg.stop_reason is StopReason.MAX_TOKENS
    assert msg.stop_reason == "max_tokens"


def test_a_ral_calls_script_is_read_only_from_object_arguments_holding_a_string() -> None:
    assert ToolCall("c", "ral", {"script": "echo 1"}).script == "echo 1"
    assert ToolCall("c", "ral", {"script": 3}).script is None
    assert ToolCall("c", "ral", '{"script": "echo 1"}').script is None  # admit first


_surrogates = st.integers(0xD800, 0xDFFF).map(chr)


@given(
    before=st.text(max_size=10),
    after=st.text(max_size=10),
    surrogate=_surrogates,
    key=st.text(max_size=5),
)
def test_a_lone_surrogate_in_a_call_is_committed_as_u_fffd_and_reported_by_call_id(
    before: str, after: str, surrogate: str, key: str
) -> None:
    raw = AssistantMessage(
        text="see " + surrogate,
        tool_calls=(
            ToolCall("c1", "ral", {"script": "echo ok"}),
            ToolCall("c2", "ral", {"script": before + surrogate + after, key: [surrogate]}),
        ),
        stop_reason=StopReason.TOOL_USE,
    )
    msg, report = admit_with_report(raw)
    assert report == {"c2": f"U+{ord(surrogate):04X}"}, "only the call that held one"
    json.dumps(msg.to_dict(), ensure_ascii=False).encode("utf-8")  # every byte can be written
    assert msg.tool_calls[1].script == before + "\ufffd" + after
    assert msg.tool_calls[0] == raw.tool_calls[0]
    assert msg.text == "see \ufffd"
    assert admit_with_report(msg) == (msg, {}), "idempotent"
    assert any("lone surrogate" in r for r in admission_repairs(raw))


def test_arguments_whose_json_text_escapes_a_lone_surrogate_are_reported_too() -> None:
    raw = AssistantMessage(
        tool_calls=(ToolCall("c1", "ral", '{"script": "echo \\ud800"}'),),
        stop_reason=StopReason.TOOL_USE,
    )
    msg, report = admit_with_report(raw)
    assert report == {"c1": "U+D800"}
    assert msg.tool_calls[0].script == "echo \ufffd"


@given(st.text())
def test_valid_text_is_committed_unchanged_and_reports_nothing(text: str) -> None:
    raw = AssistantMessage(
        text=text or "x",
        tool_calls=(ToolCall("c1", "ral", {"script": text}),),
        stop_reason=StopReason.TOOL_USE,
    )
    msg, report = admit_with_report(raw)
    assert report == {} and msg.tool_calls[0].script == text and msg.text == (text or "x")


@given(assistant_messages)
def test_an_admitted_message_is_admitted_again_as_the_very_same_object(
    msg: AssistantMessage,
) -> None:
    # a reply that needs no repair (every reply of a well-behaved model) is not copied: the
    # per-call path admitted each one by rebuilding every call and its arguments
    once, _ = admit_with_report(msg)
    again, unencodable = admit_with_report(once)
    assert again is once and unencodable == {}


@given(assistant_messages)
def test_an_admitted_messages_calls_keep_their_arguments_as_a_copy_would_hold_them(
    msg: AssistantMessage,
) -> None:
    admitted, _ = admit_with_report(msg)
    for before, after in zip(msg.tool_calls, admitted.tool_calls, strict=True):
        if isinstance(before.arguments, dict) and admission_repairs(msg) == ():
            assert after.arguments == before.arguments
        assert isinstance(after.arguments, dict)
