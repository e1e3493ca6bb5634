"""Both network providers end to end against a real streaming HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from exarch_actors.runtime.cancel import Cancelled, CancelScope
from exarch_actors.runtime.messages import (
    StopReason,
    ToolCall,
    TranscriptItem,
    Usage,
    UserMessage,
    admit_assistant,
)
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.base import (
    MalformedReply,
    ProviderTimeout,
    RateLimited,
    RequestRejected,
    StreamEvent,
    StreamReset,
    TextDelta,
    ToolCallDelta,
    TransportError,
    truncation_of,
)
from exarch_actors.runtime.providers.http import HttpStreamingProvider
from tests.support.protocol_servers import (
    Exchange,
    ProtocolServer,
    anthropic_chunks,
    openai_chunks,
    sse,
)
from tests.support.waiting import HANG_GUARD

SCRIPT_ARGS = '{"script": "echo hi"}'


@dataclass(frozen=True)
class Proto:
    name: str
    path: str
    chunks: Callable[..., list[bytes]]
    url_suffix: str

    def provider(self, server: ProtocolServer, **opts: Any) -> HttpStreamingProvider:
        options: dict[str, Any] = {
            "max_retries": 3,
            "backoff_base": 0.005,
            "backoff_max": 0.02,
            "read_timeout": 2.0,
            "connect_timeout": 2.0,
        }
        options.update(opts)
        p = make_provider(
            self.name,
            model="test-model",
            base_url=server.url + self.url_suffix,
            api_key="k",
            **options,
        )
        assert isinstance(p, HttpStreamingProvider)
        return p

    def reply(
        self, text: str = "", calls: Sequence[tuple[str, str, str]] = (), **kw: Any
    ) -> list[bytes]:
        return self.chunks(text, calls, **kw)


OPENAI = Proto("openai", "/v1/chat/completions", openai_chunks, "/v1")
ANTHROPIC = Proto("anthropic", "/v1/messages", anthropic_chunks, "")


@pytest.fixture(params=[OPENAI, ANTHROPIC], ids=lambda p: p.name)
def proto(request: pytest.FixtureRequest) -> Proto:
    return request.param


def test_a_streamed_reply_assembles_text_tool_call_stop_reason_and_usage(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(chunks=proto.reply("Let me check.", [("call_A", "ral", SCRIPT_ARGS)])))
    events: list[StreamEvent] = []
    msg = proto.provider(server).complete(
        [UserMessage("hi")], system="be brief", cancel=CancelScope(), on_event=events.append
    )
    assert msg.text == "Let me check."
    assert msg.tool_calls == (ToolCall("call_A", "ral", {"script": "echo hi"}),)
    assert msg.stop_reason is StopReason.TOOL_USE
    assert msg.usage == Usage(12, 5)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me check."
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 2  # arguments arrived in pieces
    assert "".join(d.arguments for d in deltas) == SCRIPT_ARGS
    (req,) = server.requests
    assert req.path == proto.path
    assert req.body["stream"] is True
    assert req.body["model"] == "test-model"
    assert req.body["tools"]


def test_a_text_only_reply_ends_the_turn(server: ProtocolServer, proto: Proto) -> None:
    server.script(Exchange(chunks=proto.reply("All done.")))
    msg = proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert (msg.text, msg.tool_calls, msg.stop_reason) == ("All done.", (), StopReason.END_TURN)


def test_two_tool_calls_in_one_reply_keep_their_order(server: ProtocolServer, proto: Proto) -> None:
    calls = [("c1", "ral", '{"script": "a"}'), ("c2", "ral", '{"script": "b"}')]
    server.script(Exchange(chunks=proto.reply("", calls)))
    msg = proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert [(c.id, c.arguments) for c in msg.tool_calls] == [
        ("c1", {"script": "a"}),
        ("c2", {"script": "b"}),
    ]


def test_malformed_json_tool_arguments_arrive_raw_and_admission_repairs_them(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(chunks=proto.reply("", [("c1", "ral", '{"script": "ec')])))
    msg = proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.tool_calls[0].arguments == '{"script": "ec'
    assert admit_assistant(msg).tool_calls[0].arguments == {}


def test_a_max_tokens_stop_is_returned_for_the_driver_to_turn_into_truncated(
    server: ProtocolServer, proto: Proto
) -> None:
    stop: dict[str, Any] = (
        {"finish": "length"} if proto is OPENAI else {"stop_reason": "max_tokens"}
    )
    server.script(Exchange(chunks=proto.reply("half a tho", **stop)))
    msg = proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.stop_reason is StopReason.MAX_TOKENS
    err = truncation_of(msg)
    assert err is not None and err.partial.text == "half a tho"


def test_a_rate_limit_is_retried_after_the_retry_after_header(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(
        Exchange(status=429, headers={"retry-after": "0.3"}, body=b'{"error": "slow down"}'),
        Exchange(chunks=proto.reply("ok")),
    )
    events: list[StreamEvent] = []
    t0 = time.monotonic()
    msg = proto.provider(server).complete(
        [UserMessage("hi")], cancel=CancelScope(), on_event=events.append
    )
    assert msg.text == "ok"
    assert time.monotonic() - t0 >= 0.3
    assert len(server.requests) == 2
    resets = [e for e in events if isinstance(e, StreamReset)]
    assert len(resets) == 1 and "429" in resets[0].reason


def test_a_server_error_is_retried_with_backoff(server: ProtocolServer, proto: Proto) -> None:
    server.script(Exchange(status=500, body=b"oops"), Exchange(chunks=proto.reply("ok")))
    msg = proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.text == "ok"
    assert len(server.requests) == 2


def test_a_rate_limit_on_every_attempt_raises_rate_limited_after_the_retries(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(*[Exchange(status=429, headers={"retry-after": "0"}, body=b"{}")] * 3)
    with pytest.raises(RateLimited) as e:
        proto.provider(server, max_retries=2).complete([UserMessage("hi")], cancel=CancelScope())
    assert e.value.attempts == 3
    assert e.value.retry_after == 0
    assert len(server.requests) == 3


def test_a_stream_cut_mid_message_is_retried_from_scratch(
    server: ProtocolServer, proto: Proto
) -> None:
    chunks = proto.reply("a long answer here", [("c1", "ral", SCRIPT_ARGS)])
    server.script(Exchange(chunks=chunks, cut_after=4), Exchange(chunks=chunks))
    events: list[StreamEvent] = []
    msg = proto.provider(server).complete(
        [UserMessage("hi")], cancel=CancelScope(), on_event=events.append
    )
    assert msg.text == "a long answer here"
    reset_at = next(i for i, e in enumerate(events) if isinstance(e, StreamReset))
    after = "".join(e.text for e in events[reset_at:] if isinstance(e, TextDelta))
    assert after == "a long answer here"


def test_a_stream_cut_on_every_attempt_raises_transport_error(
    server: ProtocolServer, proto: Proto
) -> None:
    chunks = proto.reply("a long answer here")
    server.script(*[Exchange(chunks=chunks, cut_after=3)] * 2)
    with pytest.raises(TransportError) as e:
        proto.provider(server, max_retries=1).complete([UserMessage("hi")], cancel=CancelScope())
    assert e.value.attempts == 2


def test_a_stream_that_ends_without_its_terminal_event_is_a_cut(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(chunks=proto.reply("abc")[:3]))
    with pytest.raises(TransportError, match="stream cut"):
        proto.provider(server, max_retries=0).complete([UserMessage("hi")], cancel=CancelScope())


def test_a_server_that_never_answers_raises_provider_timeout_after_the_read_timeout(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(hang=True))
    t0 = time.monotonic()
    with pytest.raises(ProviderTimeout):
        proto.provider(server, max_retries=0, read_timeout=0.2).complete(
            [UserMessage("hi")], cancel=CancelScope()
        )
    assert 0.2 <= time.monotonic() - t0 < HANG_GUARD  # 0.2 s, not the 120 s default


def test_a_stream_that_never_ends_is_cancelled_and_its_connection_closed(
    server: ProtocolServer, proto: Proto
) -> None:
    tick = (
        sse({"choices": [{"index": 0, "delta": {"content": "."}}]})
        if proto is OPENAI
        else sse({"type": "ping"}, "ping")
    )
    server.script(Exchange(chunks=proto.reply("x")[:2], forever=tick))
    scope = CancelScope()
    first_event = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            proto.provider(server).complete(
                [UserMessage("hi")], cancel=scope, on_event=lambda e: first_event.set()
            )
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    if proto is ANTHROPIC:  # pings carry no delta: wait for the request instead
        assert server.wait_for_requests(1)
    else:
        assert first_event.wait(5)
    scope.cancel("user interrupt")
    t.join(HANG_GUARD)  # the stream never ends: only the cancel can end the call
    assert not t.is_alive() and isinstance(outcome[0], Cancelled)
    assert server.client_gone.wait(HANG_GUARD)  # the connection was really closed


def test_a_cancel_while_waiting_for_a_hung_server_ends_the_wait_before_its_read_timeout(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(hang=True))
    scope = CancelScope()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            proto.provider(server, read_timeout=30).complete([UserMessage("hi")], cancel=scope)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert server.wait_for_requests(1)
    scope.cancel()
    t.join(HANG_GUARD)  # well inside the 30 s read timeout
    assert not t.is_alive() and isinstance(outcome[0], Cancelled)


def test_a_cancel_during_the_retry_backoff_ends_it_before_the_retry_after(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(status=503, headers={"retry-after": "30"}, body=b""))
    scope = CancelScope()
    reset_seen = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            proto.provider(server).complete(
                [UserMessage("hi")], cancel=scope, on_event=lambda e: reset_seen.set()
            )
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert reset_seen.wait(5)
    scope.cancel()
    t.join(HANG_GUARD)  # well inside the 30 s retry-after
    assert not t.is_alive() and isinstance(outcome[0], Cancelled)


def test_a_client_error_is_rejected_at_once_without_retry(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(status=401, body=b'{"error": {"message": "bad key"}}'))
    with pytest.raises(RequestRejected, match=r"HTTP 401.*bad key") as e:
        proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert e.value.status == 401
    assert len(server.requests) == 1


def test_a_non_json_event_is_a_malformed_reply_not_retried(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(Exchange(chunks=[b"data: {this is not json\n\n"]))
    with pytest.raises(MalformedReply, match="not JSON"):
        proto.provider(server).complete([UserMessage("hi")], cancel=CancelScope())
    assert len(server.requests) == 1


def test_a_refused_connection_is_a_transport_error_after_the_retries(proto: Proto) -> None:
    dead = ProtocolServer()
    url = dead.url
    dead._httpd.server_close()  # the port is closed: connects are refused
    p = make_provider(
        proto.name, model="m", base_url=url + proto.url_suffix, max_retries=1, backoff_base=0.001
    )
    with pytest.raises(TransportError, match="transport failure") as e:
        p.complete([UserMessage("hi")], cancel=CancelScope())
    assert e.value.attempts == 2


def test_an_already_cancelled_scope_sends_no_request(server: ProtocolServer, proto: Proto) -> None:
    scope = CancelScope()
    scope.cancel()
    with pytest.raises(Cancelled):
        proto.provider(server).complete([UserMessage("hi")], cancel=scope)
    assert server.requests == []


def test_summarize_declares_the_tools_but_forbids_calling_them(
    server: ProtocolServer, proto: Proto
) -> None:
    from exarch_actors.runtime.messages import AssistantMessage, ToolResult

    server.script(Exchange(chunks=proto.reply("the summary")))
    transcript: list[TranscriptItem] = [
        UserMessage("count"),
        AssistantMessage("", (ToolCall("c1", "ral", {"script": "x"}),), StopReason.TOOL_USE),
        ToolResult("c1", "3"),
    ]
    assert proto.provider(server).summarize(transcript, CancelScope()) == "the summary"
    body = server.requests[0].body
    assert body["tools"]
    assert body["tool_choice"] in ("none", {"type": "none"})


def test_many_sequential_round_trips_leave_no_cancel_scope_children_behind(
    server: ProtocolServer, proto: Proto
) -> None:
    server.script(*[Exchange(chunks=proto.reply("ok"))] * 20)
    scope = CancelScope()
    p = proto.provider(server)
    for _ in range(20):
        p.complete([UserMessage("hi")], cancel=scope)
    scope.child()  # adoption prunes finished children
    assert len(scope._children) == 1
