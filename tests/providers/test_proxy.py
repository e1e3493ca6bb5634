"""Proxies: which variable applies and when NO_PROXY sends a host direct (curl's and requests'
rules), and real requests through a loopback forward proxy — a CONNECT tunnel to a loopback TLS
server (certificate from the committed test CA), an absolute-URI request to a plain-HTTP one,
credentials, a refusing proxy, and a bypass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exarch_actors.runtime.cancel import CancelScope
from exarch_actors.runtime.messages import UserMessage
from exarch_actors.runtime.providers import make_provider
from exarch_actors.runtime.providers.base import RequestRejected
from exarch_actors.runtime.providers.openai import OpenAIProvider
from exarch_actors.runtime.providers.proxy import Proxy, ProxyUnsupported, bypasses, proxy_for
from tests.agent.conftest import exarch
from tests.support.connect_proxy import ConnectProxy
from tests.support.protocol_servers import (
    TEST_CA,
    Exchange,
    ProtocolServer,
    openai_chunks,
    tls_server_context,
)

# --- the rule ---------------------------------------------------------------------------------


def test_the_endpoint_scheme_picks_the_variable_lowercase_first_then_all_proxy() -> None:
    env = {"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2", "ALL_PROXY": "h:3"}
    assert proxy_for("https", "api.openai.com", 443, env) == Proxy("lower", 2, None, "https_proxy")
    assert proxy_for("http", "example.com", 80, env) == Proxy("h", 3, None, "ALL_PROXY")
    assert proxy_for("http", "example.com", 80, {"HTTPS_PROXY": "http://p:1"}) is None
    assert proxy_for("https", "x", 443, {"HTTPS_PROXY": "  "}) is None
    assert proxy_for("https", "x", 443, {"HTTPS_PROXY": "p.corp"}) == Proxy(
        "p.corp", 1080, None, "HTTPS_PROXY"
    )


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("*", "api.openai.com", 443, True),
        ("openai.com", "api.openai.com", 443, True),
        ("openai.com", "openai.com", 443, True),
        (".openai.com", "openai.com", 443, True),
        (".openai.com", "api.openai.com", 443, True),
        ("openai.com", "badopenai.com", 443, False),
        ("OpenAI.COM", "api.openai.com", 443, True),
        ("example.com, openai.com", "api.openai.com", 443, True),
        ("example.com openai.com", "api.openai.com", 443, True),
        ("api.openai.com:8443", "api.openai.com", 443, False),
        ("api.openai.com:443", "api.openai.com", 443, True),
        ("127.0.0.1", "127.0.0.1", 8080, True),
        ("10.0.0.0/8", "10.1.2.3", 80, True),
        ("10.0.0.0/8", "11.1.2.3", 80, False),
        ("::1", "::1", 80, True),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 80, False),
        ("fd00::/8", "fd12::1", 80, True),
        ("localhost", "127.0.0.1", 80, False),
        ("", "api.openai.com", 443, False),
    ],
)
def test_no_proxy_sends_matching_hosts_direct(
    no_proxy: str, host: str, port: int, direct: bool
) -> None:
    assert bypasses(no_proxy, host, port) is direct
    env = {"https_proxy": "http://p:1", "NO_PROXY": no_proxy}
    assert (proxy_for("https", host, port, env) is None) is direct


def test_credentials_in_the_proxy_url_become_a_basic_proxy_authorization() -> None:
    proxy = proxy_for("https", "h", 443, {"HTTPS_PROXY": "http://al%40ice:s%3Acret@p:3128"})
    assert proxy is not None and (proxy.host, proxy.port) == ("p", 3128)
    assert proxy.headers == {"Proxy-Authorization": "Basic YWxAaWNlOnM6Y3JldA=="}  # al@ice:s:cret


@pytest.mark.parametrize("url", ["https://p:443", "socks5://p:1080", "http://:80"])
def test_a_proxy_this_transport_cannot_use_is_refused_when_the_provider_is_made(url: str) -> None:
    with pytest.raises(ProxyUnsupported, match="HTTPS_PROXY"):
        make_provider("openai", model="m", api_key="k", proxy_env={"HTTPS_PROXY": url})


# --- through a real proxy ---------------------------------------------------------------------


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    p = ConnectProxy().start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def tls_server() -> Iterator[ProtocolServer]:
    s = ProtocolServer(tls=tls_server_context()).start()
    try:
        yield s
    finally:
        s.stop()


def provider(url: str, env: dict[str, str], **kw: object) -> OpenAIProvider:
    p = make_provider(
        "openai",
        model="m",
        base_url=url + "/v1",
        api_key="k",
        proxy_env=env,
        **kw,  # type: ignore[arg-type]
    )
    assert isinstance(p, OpenAIProvider)
    return p


def test_an_https_request_travels_through_a_connect_tunnel_with_tls_end_to_end(
    proxy: ConnectProxy, tls_server: ProtocolServer
) -> None:
    tls_server.script(Exchange(chunks=openai_chunks("through the tunnel")))
    p = provider(tls_server.url, {"HTTPS_PROXY": proxy.url}, ca_file=str(TEST_CA))
    msg = p.complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.text == "through the tunnel"
    port = tls_server.url.rsplit(":", 1)[1]
    assert [(h.method, h.target) for h in proxy.heads] == [("CONNECT", f"localhost:{port}")]
    assert tls_server.requests[0].path == "/v1/chat/completions"
    assert tls_server.requests[0].headers["authorization"] == "Bearer k"  # only inside TLS


def test_the_tunnelled_server_certificate_is_still_verified(
    proxy: ConnectProxy, tls_server: ProtocolServer
) -> None:
    p = provider(tls_server.url, {"HTTPS_PROXY": proxy.url}, max_retries=0)  # no test CA
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        p.complete([UserMessage("hi")], cancel=CancelScope())
    assert [h.method for h in proxy.heads] == ["CONNECT"]
    assert tls_server.requests == []


def test_a_plain_http_request_goes_to_the_proxy_with_its_absolute_uri(
    proxy: ConnectProxy, server: ProtocolServer
) -> None:
    server.script(Exchange(chunks=openai_chunks("relayed")))
    env = {"http_proxy": proxy.url.replace("http://", "http://u:pw@")}
    msg = provider(server.url, env).complete([UserMessage("hi")], cancel=CancelScope())
    assert msg.text == "relayed"
    (head,) = proxy.heads
    assert (head.method, head.target) == ("POST", f"{server.url}/v1/chat/completions")
    assert head.headers["proxy-authorization"] == "Basic dTpwdw=="
    assert "proxy-authorization" not in server.requests[0].headers  # the proxy's, not the origin's


def test_a_proxy_demanding_credentials_fails_the_request_at_once_and_says_so(
    tls_server: ProtocolServer,
) -> None:
    strict = ConnectProxy(require_auth="Basic dTpwdw==").start()
    try:
        p = provider(tls_server.url, {"HTTPS_PROXY": strict.url}, ca_file=str(TEST_CA))
        with pytest.raises(RequestRejected, match="407") as caught:
            p.complete([UserMessage("hi")], cancel=CancelScope())
        assert "wants credentials" in str(caught.value)
        assert len(strict.heads) == 1  # a 407 is not retried
        authed = provider(
            tls_server.url,
            {"HTTPS_PROXY": strict.url.replace("http://", "http://u:pw@")},
            ca_file=str(TEST_CA),
        )
        tls_server.script(Exchange(chunks=openai_chunks("ok")))
        assert authed.complete([UserMessage("hi")], cancel=CancelScope()).text == "ok"
    finally:
        strict.stop()


def test_a_host_in_no_proxy_is_reached_directly(
    proxy: ConnectProxy, tls_server: ProtocolServer
) -> None:
    tls_server.script(Exchange(chunks=openai_chunks("direct")))
    env = {"HTTPS_PROXY": proxy.url, "NO_PROXY": "example.com,localhost"}
    msg = provider(tls_server.url, env, ca_file=str(TEST_CA)).complete(
        [UserMessage("hi")], cancel=CancelScope()
    )
    assert msg.text == "direct"
    assert proxy.heads == []


def test_the_run_command_reaches_an_https_endpoint_through_https_proxy(
    proxy: ConnectProxy, tls_server: ProtocolServer, tmp_path: Path
) -> None:
    # SSL_CERT_FILE is OpenSSL's own variable: how a private CA (a corporate proxy's) is trusted
    call = '{"script": "reply 42"}'
    for _ in range(2):  # the headless trunk's first reply is turned back once to verify
        tls_server.script(Exchange(chunks=openai_chunks("", [("c1", "ral", call)])))
    p = exarch(
        [
            "run",
            "--provider=openai",
            f"--base-url={tls_server.url}/v1",
            "--model=m",
            "--api-key=k",
            f"--session-dir={tmp_path / 'session'}",
            "Reply with 42.",
        ],
        cwd=tmp_path,
        env={
            "HTTPS_PROXY": proxy.url,
            "NO_PROXY": "",
            "no_proxy": "",
            "SSL_CERT_FILE": str(TEST_CA),
        },
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42"
    assert [h.method for h in proxy.heads] == ["CONNECT", "CONNECT"]
    assert len(tls_server.requests) == 2


LABEL = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
"""A DNS label starting with a letter (all-digit names would be IP addresses)."""


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(LABEL, min_size=1, max_size=4),
    st.lists(LABEL, min_size=1, max_size=3),
    st.lists(LABEL, max_size=3),
    st.booleans(),
)
def test_a_no_proxy_name_matches_exactly_its_domain_and_subdomains(
    domain: list[str], sub: list[str], others: list[str], dotted: bool
) -> None:
    name = ".".join(domain)
    entry = ("." if dotted else "") + name
    listed = ",".join([*others, entry.upper()])
    assert bypasses(listed, name, 443)
    assert bypasses(listed, ".".join([*sub, name]), 443)
    glued = sub[-1] + name  # "x" + "example.com": another domain, not a subdomain
    by_others = any(glued == o or glued.endswith("." + o) for o in others)
    assert bypasses(listed, glued, 443) is by_others
