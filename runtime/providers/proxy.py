"""Which proxy a provider's request goes through: ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
``ALL_PROXY`` / ``NO_PROXY``, read as curl and Python's requests read them.

- **Which variable.** An ``https://`` endpoint uses ``https_proxy``, an ``http://`` one
  ``http_proxy``; either falls back to ``all_proxy``. The lowercase spelling wins over the
  uppercase one when both are set (curl's and urllib's order). An empty value means none.
- **NO_PROXY** (either case) is a list separated by commas or spaces. ``*`` bypasses the proxy
  for every host. A name matches the host itself and every subdomain (``example.com`` and
  ``.example.com`` both match ``example.com`` and ``api.example.com``, never
  ``badexample.com``); ``name:port`` matches only that port; an IP address matches itself, a
  CIDR block (``10.0.0.0/8``, ``::1/128``) every address in it; ``[::1]`` is ``::1``. Matching
  is case-insensitive.
- **The proxy URL** is ``http://[user:password@]host[:port]`` (port 1080 by default, as curl);
  a bare ``host:port`` is read as ``http://``. Credentials (percent-decoded) go in a
  ``Proxy-Authorization: Basic`` header. A proxy spoken to over TLS (``https://``) or SOCKS
  is refused at once with :class:`ProxyUnsupported`, naming the variable: failing every request
  later would hide why.

How the transport uses it (``runtime/providers/http.py``): an ``https`` endpoint is reached
through a ``CONNECT host:port`` tunnel, inside which TLS runs end to end with the real server
(the proxy sees no plaintext); an ``http`` endpoint gets the request with its absolute URI sent
to the proxy. Pure: reads only the mapping it is given.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from exarch_actors.runtime.errors import ExarchError

DEFAULT_PROXY_PORT = 1080
"""curl's default proxy port when the URL names none."""


class ProxyUnsupported(ExarchError):
    """A proxy variable this transport cannot use (a TLS or SOCKS proxy, or not a URL)."""


@dataclass(frozen=True)
class Proxy:
    """A plain-HTTP proxy: where to connect, and the header that authenticates to it."""

    host: str
    port: int
    authorization: str | None = None
    """The ``Proxy-Authorization`` value, when the URL carried credentials."""
    source: str = ""
    """The variable it came from (for error messages)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}


def _get(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for key in (name.lower(), name.upper()):
        value = env.get(key)
        if value is not None and value.strip():
            return key, value.strip()
    return None


def proxy_for(scheme: str, host: str, port: int, env: Mapping[str, str]) -> Proxy | None:
    """The proxy for a request to ``scheme://host:port``, or ``None`` to connect directly."""
    found = _get(env, f"{scheme}_proxy") or _get(env, "all_proxy")
    if found is None:
        return None
    bypass = _get(env, "no_proxy")
    if bypass is not None and bypasses(bypass[1], host, port):
        return None
    return parse_proxy(found[1], found[0])


def parse_proxy(url: str, source: str = "proxy") -> Proxy:
    """A proxy URL as :class:`Proxy` (see the module docstring); refuses what cannot work."""
    text = url if "://" in url else f"http://{url}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ProxyUnsupported(f"{source}={url!r}: not a proxy URL ({e})") from None
    if parts.scheme != "http":
        raise ProxyUnsupported(
            f"{source}={url!r}: only http:// proxies are supported (the tunnel to an https "
            f"endpoint is still TLS end to end), not {parts.scheme}://"
        )
    if not parts.hostname:
        raise ProxyUnsupported(f"{source}={url!r}: no proxy host")
    auth = None
    if parts.username is not None:
        user = unquote(parts.username)
        password = unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        auth = f"Basic {token}"
    return Proxy(parts.hostname, port or DEFAULT_PROXY_PORT, auth, source)


def bypasses(no_proxy: str, host: str, port: int) -> bool:
    """Whether ``NO_PROXY``'s value sends ``host:port`` direct (see the module docstring)."""
    host = host.strip("[]").lower().rstrip(".")
    address = _ip(host)
    for raw in no_proxy.replace(",", " ").split():
        entry = raw.strip().lower()
        if entry == "*":
            return True
        name, entry_port = _split_port(entry)
        if entry_port is not None and entry_port != port:
            continue
        name = name.strip("[]").rstrip(".")
        if address is not None:
            if _in_network(address, name):
                return True
            continue
        name = name.lstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    """``host:port``, ``[v6]:port``, ``v6`` (several colons: no port), ``cidr``."""
    if entry.startswith("["):
        close = entry.find("]")
        rest = entry[close + 1 :]
        port = rest[1:] if rest.startswith(":") else ""
        return entry[1:close], int(port) if port.isdigit() else None
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        return name, int(port) if port.isdigit() else None
    return entry, None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _in_network(address: ipaddress.IPv4Address | ipaddress.IPv6Address, entry: str) -> bool:
    try:
        network = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return address.version == network.version and address in network
