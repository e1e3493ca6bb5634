"""A pytest plugin for pykka's own test suite: :class:`actors.mailbox.QuotaActor` as a runtime.

pykka's ``tests/conftest.py`` parametrises a session fixture ``runtime`` over its ``RUNTIMES``
(only ``threading`` in 4.5.0); every actor class in its suite is built as
``class Impl(SomeActor, runtime.actor_class)``. This plugin adds a ``quota`` runtime beside the
ones pykka ships, so each runtime-parametrised test runs once per runtime and pykka's contract
is checked against our mailbox with pykka's own assertions.

How: a ``pytest.mark.parametrize("runtime", ..., indirect=True)`` mark is added before pytest
applies fixture params (this hook runs ``tryfirst``); pytest gives a test's own parametrize mark
precedence over the fixture's params, and pykka's ``runtime`` fixture returns
``request.param`` either way. Loaded with ``-p quota_runtime`` by ``run_pykka_suite.py``, with
this directory alone on ``PYTHONPATH`` (pykka's suite is the ``tests`` package there).
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any

import pytest
from pykka import ThreadingFuture

from exarch_actors.actors.mailbox import QuotaActor

QUOTA_ID = "quota"


def _runtimes() -> list[Any]:
    conftest = importlib.import_module("tests.conftest")  # pykka's, already loaded by pytest
    runtime_type = importlib.import_module("tests.types").Runtime
    quota = runtime_type(
        name=QUOTA_ID,
        actor_class=QuotaActor,
        event_class=threading.Event,
        future_class=ThreadingFuture,
        sleep_func=time.sleep,
    )
    return [*conftest.RUNTIMES.values(), pytest.param(quota, id=QUOTA_ID)]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "runtime" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        if "runtime" in str(mark.args[0]):
            return  # a test that picks its own runtimes keeps them
    metafunc.definition.add_marker(
        pytest.mark.parametrize("runtime", _runtimes(), indirect=True, scope="session")
    )


def pytest_report_header() -> str:
    return f"runtimes: pykka's own plus {QUOTA_ID} (actors.mailbox.QuotaActor)"
