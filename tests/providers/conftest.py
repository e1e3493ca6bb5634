"""Fixtures for provider tests: a real streaming HTTP server per test, stopped and joined after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.protocol_servers import ProtocolServer


@pytest.fixture
def server() -> Iterator[ProtocolServer]:
    s = ProtocolServer().start()
    try:
        yield s
    finally:
        s.stop()
