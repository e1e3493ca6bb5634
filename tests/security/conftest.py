"""Fixtures from ``tests/agent/conftest.py``: ``protocol_server`` is a real streaming HTTP
server on 127.0.0.1."""

from __future__ import annotations

from tests.agent.conftest import protocol_server

__all__ = ["protocol_server"]
