"""``--backend ray`` where Ray cannot be imported: exit 2 with the install line, nothing made.

Runs everywhere (no ``ray`` marker): a ``ray`` module that raises ``ImportError`` comes first
on ``PYTHONPATH``, as if the extra were not installed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import exarch

ROOT = Path(__file__).resolve().parents[2]


def test_backend_ray_without_ray_installed_exits_2_with_the_install_line_and_no_session(
    tmp_path: Path,
) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "ray.py").write_text("raise ImportError('No module named ray')\n")
    session = tmp_path / "session"
    p = exarch(
        [
            "run",
            str(ROOT / "examples" / "fanout.toml"),
            "--backend",
            "ray",
            "--session-dir",
            str(session),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{shadow}:{ROOT}"},
    )
    assert p.returncode == 2, p.stderr
    assert "pip install -e '.[ray]'" in p.stderr
    assert not session.exists()


def test_ray_address_or_placement_without_backend_ray_exits_2_and_names_the_flag(
    tmp_path: Path,
) -> None:
    session = tmp_path / "session"
    for flag, value in (("--ray-address", "127.0.0.1:6379"), ("--placement", "pack")):
        p = exarch(
            ["run", str(ROOT / "examples" / "fanout.toml"), flag, value,
             "--session-dir", str(session)],
            cwd=tmp_path,
        )  # fmt: skip
        assert p.returncode == 2, p.stderr
        assert f"{flag} needs --backend ray" in p.stderr
        assert not session.exists()


def test_a_resource_request_without_backend_ray_or_with_a_bad_amount_exits_2_and_says_why(
    tmp_path: Path,
) -> None:
    session = tmp_path / "session"
    cases = (
        (["--num-cpus", "1"], "--num-cpus and --resource need --backend ray"),
        (["--resource", "gpu=1"], "--num-cpus and --resource need --backend ray"),
        (["--resource", "gpu"], "expected NAME=AMOUNT"),
        (["--resource", "gpu=-1"], "expected a finite amount >= 0"),
        (["--resource", "CPU=1"], "CPU is asked with num_cpus"),
    )
    for args, says in cases:
        p = exarch(
            ["run", str(ROOT / "examples" / "fanout.toml"), *args, "--session-dir", str(session)],
            cwd=tmp_path,
        )
        assert p.returncode == 2 and says in p.stderr, (args, p.stderr)
        assert not session.exists()


def test_backend_ray_with_an_address_nothing_answers_at_exits_2_at_once_and_says_so(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray.util")  # the real package, not a directory named ray
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        session = tmp_path / "session"
        p = exarch(
            ["run", str(ROOT / "examples" / "fanout.toml"), "--backend", "ray",
             "--ray-address", address, "--session-dir", str(session)],
            cwd=tmp_path,
        )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert f"no Ray cluster answers at {address}" in p.stderr
    assert "Traceback" not in p.stderr


HIDE_INSTALLED_RAY = '''
"""A pytest plugin (-p): ``ray`` is looked up only outside site-packages, as in a venv
without the extra, so a folder named ray on sys.path is what ``import ray`` finds."""
import sys
from importlib.machinery import PathFinder


class _OutsideSitePackages:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "ray" and not name.startswith("ray."):
            return None
        spec = PathFinder.find_spec(name, [p for p in sys.path if "-packages" not in p])
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec


sys.meta_path.insert(0, _OutsideSitePackages)
'''


def test_the_ray_suite_skips_with_the_reason_when_import_ray_finds_only_a_folder_named_ray(
    tmp_path: Path,
) -> None:
    """Reproduces a run as root without the ray extra: ``import ray`` found the suite's own
    folder (then ``tests/ray``, no ``__init__.py``) as a namespace package, so the cluster
    fixture went on to ``ray start`` and every test errored instead of skipping."""
    shadow = tmp_path / "shadow"
    (shadow / "ray").mkdir(parents=True)  # a folder without __init__.py, first on sys.path
    (shadow / "hide_installed_ray.py").write_text(HIDE_INSTALLED_RAY)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hide_installed_ray", "-q", "-rs",
         "-p", "no:cacheprovider", str(ROOT / "tests" / "ray_backend" / "test_ray_node_loss.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{shadow}:{ROOT}"},
    )  # fmt: skip
    assert "error" not in p.stdout.splitlines()[-1], p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ray is not installed (pip install -e '.[ray]'); 'import ray' found only" in p.stdout
    assert str(shadow / "ray") in p.stdout
