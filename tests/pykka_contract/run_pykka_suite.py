"""pykka's own test suite, run against :class:`actors.mailbox.QuotaActor` (pykka's contract).

``QuotaActor`` replaces pykka's inbox, so pykka's guarantees (a stop is served after the work
queued before it, asks queued behind a stop get ``ActorDeadError``, proxies, futures, the
registry) are only ours if pykka's own tests say so. pykka ships no tests in its wheel, and this
repository does not carry pykka's code: the pinned sdist (which has ``tests/`` and its
``conftest.py``) is downloaded with pip into a user cache, checked against its pinned sha256,
unpacked into a temporary directory and run there in a subprocess, with
``tests/pykka_contract/quota_runtime.py`` adding ``quota`` to pykka's runtimes.

``tests/pykka_contract/test_pykka_contract.py`` runs it inside the README's ``pytest``; by hand::

    python tests/pykka_contract/run_pykka_suite.py [extra pytest arguments]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

PYKKA_VERSION = "4.5.0"
"""The pykka release whose suite is run; pyproject.toml's ``test`` extra pins the same one."""

SDIST_SHA256 = "820fcc36046552b49d7eb61fe98088d1a29631cf3314e8ce4bc26aaead8dcd4f"
"""sha256 of ``pykka-4.5.0.tar.gz`` as published on PyPI."""

SDIST_NAME = f"pykka-{PYKKA_VERSION}.tar.gz"
PLUGIN_DIR = Path(__file__).resolve().parent
REPO_ROOT = PLUGIN_DIR.parent.parent


class SdistUnavailable(Exception):
    """The pinned sdist is neither cached nor downloadable (offline, or a pip failure)."""


@dataclass(frozen=True)
class SuiteRun:
    """One run of pykka's suite: the exit code, the output, and the per-runtime tallies."""

    returncode: int
    output: str
    passed: dict[str, int]
    not_passed: list[str]

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "exarch-actors" / "pykka-contract"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_sdist(cache: Path | None = None) -> Path:
    """The pinned sdist from the cache, downloaded with pip first if missing or corrupt."""
    cache = cache if cache is not None else cache_dir()
    cached = cache / SDIST_NAME
    if cached.is_file() and _sha256(cached) == SDIST_SHA256:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--no-binary", ":all:", "--retries", "1", "--timeout", "20",
            "--dest", tmp, f"pykka=={PYKKA_VERSION}",
        ]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired as e:
            raise SdistUnavailable(f"pip download of pykka {PYKKA_VERSION} timed out") from e
        got = Path(tmp) / SDIST_NAME
        if done.returncode != 0 or not got.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SdistUnavailable(f"pip download of pykka {PYKKA_VERSION} failed: {last}")
        digest = _sha256(got)
        if digest != SDIST_SHA256:
            raise SdistUnavailable(f"{SDIST_NAME} has sha256 {digest}, pinned {SDIST_SHA256}")
        os.replace(got, cached)  # atomic: a concurrent run sees the whole file or none
    return cached


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack ``sdist`` under ``dest``; return the source root (which holds ``tests/``)."""
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    root = dest / f"pykka-{PYKKA_VERSION}"
    if not (root / "tests" / "conftest.py").is_file():
        raise SdistUnavailable(f"{SDIST_NAME} has no tests/conftest.py")
    return root


def run_suite(root: Path, *args: str, timeout: float = 540.0) -> SuiteRun:
    """Run pykka's suite under ``root`` with the ``quota`` runtime added; tally per runtime."""
    junit = root / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR), str(REPO_ROOT)])
    cmd = [
        sys.executable, "-m", "pytest", "-p", "quota_runtime", "-p", "no:cacheprovider",
        "-q", "-rfEs", f"--rootdir={root}", f"--junitxml={junit}", "tests", *args,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    passed: dict[str, int] = {}
    not_passed: list[str] = []
    if junit.is_file():
        for case in ET.parse(junit).iter("testcase"):
            name = case.get("name", "")
            runtime = name[name.rfind("[") + 1 : -1] if name.endswith("]") else "-"
            if any(case.find(tag) is not None for tag in ("failure", "error", "skipped")):
                not_passed.append(f"{case.get('classname')}::{name}")
            else:
                passed[runtime] = passed.get(runtime, 0) + 1
    return SuiteRun(done.returncode, done.stdout + done.stderr, passed, not_passed)


def main(argv: list[str]) -> int:
    sdist = fetch_sdist()
    with tempfile.TemporaryDirectory(prefix="pykka-contract-") as tmp:
        run = run_suite(unpack(sdist, Path(tmp)), *argv)
    print(run.output)
    print(f"passed per runtime: {run.passed}; not passed: {len(run.not_passed)}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
