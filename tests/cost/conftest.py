"""Money: the price rules in isolation, and real runs (``run_scenario`` runs the real command in
a subprocess; ``protocol_server`` is a real streaming HTTP server on 127.0.0.1)."""

from __future__ import annotations

from tests.agent.conftest import protocol_server, run_scenario

__all__ = ["protocol_server", "run_scenario"]
