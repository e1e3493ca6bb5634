"""pykka's contract: pykka's own test suite passes with QuotaActor as one of its runtimes.

Needs the pinned pykka sdist (downloaded once into a user cache, see ``run_pykka_suite.py``).
Offline on a developer's machine the test is skipped and says why; in CI (``CI=true``) a
failed download fails it, so the contract is always checked where changes land.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

from tests.pykka_contract.quota_runtime import QUOTA_ID
from tests.pykka_contract.run_pykka_suite import (
    PYKKA_VERSION,
    SdistUnavailable,
    fetch_sdist,
    run_suite,
    unpack,
)

RUNTIME_TESTS = 127
"""pykka 4.5.0's tests parametrised by ``runtime`` (counted with ``--collect-only``): each
must run, and pass, once for ``quota``."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"true", "1"}


@pytest.mark.timeout(600)
def test_pykka_4_5_0s_own_suite_passes_with_quota_actor_as_a_runtime(tmp_path: Path) -> None:
    installed = importlib.metadata.version("pykka")
    assert installed == PYKKA_VERSION, (
        f"pykka {installed} is installed but the contract suite is {PYKKA_VERSION}'s: "
        "pip install -e '.[test]' installs the pinned one"
    )
    try:
        sdist = fetch_sdist()
    except SdistUnavailable as e:
        if _in_ci():
            pytest.fail(f"CI must run pykka's suite: {e}")
        pytest.skip(f"pykka {PYKKA_VERSION}'s suite needs its sdist, not cached here: {e}")
    run = run_suite(unpack(sdist, tmp_path))
    assert run.returncode == 0 and not run.not_passed, (
        f"pykka's suite did not pass: {run.not_passed}\n{run.tail()}"
    )
    assert run.passed.get(QUOTA_ID, 0) == RUNTIME_TESTS, (run.passed, run.tail())
    assert run.passed.get("threading", 0) == RUNTIME_TESTS, (run.passed, run.tail())
