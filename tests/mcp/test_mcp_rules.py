"""The pure rules of MCP (``runtime/mcp/``): server tables and the flag, results as ral values,
grants narrowing, the prompt's size cap, and recorded replies."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exarch_actors.runtime.mcp.config import (
    McpConfigInvalid,
    McpServer,
    merged,
    server_from_flag,
    servers_from_run,
)
from exarch_actors.runtime.mcp.config import server_from_table as table
from exarch_actors.runtime.mcp.replies import (
    CALL,
    LIST,
    McpReply,
    McpReplyMissing,
    McpRequest,
    ReplyBook,
    arguments_key,
)
from exarch_actors.runtime.mcp.values import (
    McpArgumentInvalid,
    McpToolFailed,
    ToolLine,
    arguments,
    call_value,
    prompt_section,
)
from exarch_actors.runtime.providers.scenario import parse_scenario
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.ral.values import UNIT, Variant


def test_a_stdio_table_fills_python_and_here_and_keeps_its_fields() -> None:
    s = table(
        "fs",
        {"command": "{python}", "args": ["{here}/s.py", "-v"], "env": {"A": "1"}},
        "f.toml",
        "/srv/x",
    )
    assert (s.transport, s.command, s.args, s.env) == (
        "stdio",
        sys.executable,
        ("/srv/x/s.py", "-v"),
        (("A", "1"),),
    )


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({}, "exactly one of command (stdio) or url (HTTP)"),
        ({"command": "x", "url": "http://h"}, "exactly one of command"),
        ({"comand": "x"}, "unknown key comand"),
        ({"url": "ftp://h"}, "http:// or https://"),
        ({"command": "x", "headers": {}}, "headers belongs to an HTTP server"),
        ({"command": "x", "args": "a b"}, "args must be a list of strings"),
    ],
)
def test_a_table_that_cannot_describe_one_server_is_refused_saying_why(
    doc: dict[str, object], says: str
) -> None:
    with pytest.raises(McpConfigInvalid, match=r"f\.toml: mcp\.fs: ") as e:
        table("fs", doc, "f.toml")
    assert says in str(e.value)


def test_the_flag_names_a_command_split_as_a_shell_would_or_a_url() -> None:
    assert server_from_flag("fs=npx -y 'my server' /tmp").args == ("-y", "my server", "/tmp")
    assert server_from_flag("web=https://h/mcp").url == "https://h/mcp"
    with pytest.raises(McpConfigInvalid, match="NAME=COMMAND"):
        server_from_flag("fs")
    with pytest.raises(McpConfigInvalid, match="letters, digits"):
        server_from_flag("a b=x")


def test_a_later_source_replaces_a_server_whole_by_name() -> None:
    a, b, c = McpServer("x", command="a"), McpServer("y", command="b"), McpServer("x", url="u")
    assert merged([a, b], [c]) == (c, b)


def test_header_values_never_show_in_a_repr_or_a_dict() -> None:
    s = McpServer("web", url="https://h", headers=(("Authorization", "Bearer sk-1"),))
    assert "sk-1" not in repr(s) and "sk-1" not in str(s.to_dict())


def test_structured_content_wins_and_text_items_are_strings() -> None:
    assert call_value({"structuredContent": {"a": None, "b": [1, 2.5]}, "content": []}) == {
        "a": UNIT,
        "b": [1, 2.5],
    }
    assert call_value({"content": [{"type": "text", "text": "hi"}]}) == "hi"
    assert call_value({"content": []}) is UNIT
    two = call_value(
        {
            "content": [
                {"type": "text", "text": "x"},
                {"type": "image", "mimeType": "image/png", "data": "aGVsbG8="},
            ]
        }
    )
    assert two == ["x", {"type": "image", "mimeType": "image/png", "bytes": 5}]


def test_an_error_result_raises_with_the_servers_text() -> None:
    with pytest.raises(McpToolFailed, match=r"^no such file$"):
        call_value({"isError": True, "content": [{"type": "text", "text": "no such file"}]})


def test_arguments_must_be_a_map_of_json_values() -> None:
    assert arguments({"a": [1, UNIT], "b": True}) == {"a": [1, None], "b": True}
    assert arguments(UNIT) == {}
    with pytest.raises(McpArgumentInvalid, match="must be a map"):
        arguments([1])
    with pytest.raises(McpArgumentInvalid, match=r"arguments\.v: a variant has no JSON form"):
        arguments({"v": Variant("ok", 1)})
    with pytest.raises(McpArgumentInvalid, match="a bytes has no JSON form"):
        arguments({"f": b"raw"})


names = st.none() | st.frozensets(st.sampled_from(["a", "b", "c", "d"]))


@given(names, names)
def test_the_meet_of_grants_never_allows_a_server_either_side_refuses(
    x: frozenset[str] | None, y: frozenset[str] | None
) -> None:
    met = Grants(mcp=x).meet(Grants(mcp=y))
    for server in "abcd":
        if met.mcp_server(server):
            assert Grants(mcp=x).mcp_server(server) and Grants(mcp=y).mcp_server(server)
    assert Grants.from_dict(met.to_dict()) == met


def test_the_prompt_section_stays_within_its_cap_and_says_what_it_cut() -> None:
    tools = tuple(ToolLine(f"tool{i}", f"does thing {i}\nmore", {}) for i in range(200))
    text = prompt_section([("fs", "files", tools), ("web", "", None)], cap=600)
    assert text is not None and len(text) <= 600 + 40
    assert "- fs: files" in text and "  - tool0: does thing 0" in text
    assert "more" not in text.splitlines()[2]
    assert text.endswith("(more: `mcp-tools SERVER`)")
    assert prompt_section([]) is None


def test_a_reply_is_served_once_to_the_same_call_whatever_its_key_order() -> None:
    reply = McpReply(CALL, "add", arguments_key({"a": 1, "b": 2}), {"content": []})
    book = ReplyBook({"t": [reply]})
    request = McpRequest("trunk", "1", "t", CALL, "add", {"b": 2, "a": 1})
    assert book.take(request) == reply
    with pytest.raises(McpReplyMissing, match="no reply left for add"):
        book.take(request)


def test_recorded_replies_read_back_from_a_scenario_and_a_torn_last_one_is_dropped() -> None:
    from exarch_actors.runtime.mcp.replies import mcp_result_block
    from exarch_actors.runtime.replay.recording import toml_string

    one = McpReply(LIST, None, "{}", {"tools": [{"name": "x", "description": 'a "q"\n'}]})
    two = McpReply(CALL, "x", arguments_key({"p": "ü"}), error="the server ended")
    text = (
        "[recording]\nprovider = \"scripted\"\n"
        + mcp_result_block("t", one, "mcp t, reply 1", toml_string)
        + mcp_result_block("t", two, "mcp t, reply 2", toml_string)
    )
    scenario = parse_scenario(text)
    assert scenario.mcp_replies["t"] == (one, two)
    assert scenario.mcp[0].transport == "recorded"
    torn = parse_scenario(text[: text.rindex("stop =")])
    assert torn.mcp_replies["t"] == (one,)
    assert any("torn final reply block dropped" in w for w in torn.warnings)


def test_run_json_keeps_no_env_or_header_value_and_resume_reads_env_again() -> None:
    stdio = McpServer("fs", command="srv", args=("-v",), env=(("TOKEN", "s3cret"),))
    web = McpServer("web", url="https://h/mcp", headers=(("Authorization", "Bearer s3cret"),))
    kept = [stdio.to_dict(), web.to_dict(), McpServer("rec").to_dict()]
    assert "s3cret" not in str(kept)
    back = servers_from_run(kept, {"TOKEN": "now"})
    assert back[0] == McpServer("fs", command="srv", args=("-v",), env=(("TOKEN", "now"),))
    assert back[1] == McpServer("web", url="https://h/mcp")
    assert back[2].transport == "recorded"
