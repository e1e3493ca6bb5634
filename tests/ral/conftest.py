"""Fixtures for the ral tests: a fresh session per test, closed (workers cancelled) afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exarch_actors.runtime.ral.session import Session


@pytest.fixture
def session() -> Iterator[Session]:
    s = Session(faults=False)
    yield s
    s.close()
