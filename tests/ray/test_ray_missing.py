"""``--backend ray`` where Ray cannot be imported: exit 2 with the install line, nothing made.

Runs everywhere (no ``ray`` marker): a ``ray`` module that raises ``ImportError`` comes first
on ``PYTHONPATH``, as if the extra were not installed."""

from __future__ import annotations

import socket
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


def test_backend_ray_with_record_is_refused_with_exit_2_before_anything_starts(
    tmp_path: Path,
) -> None:
    session = tmp_path / "session"
    for command in ("run", "fleet"):
        p = exarch(
            [command, str(ROOT / "examples" / "fanout.toml"), "--backend", "ray",
             "--record", str(tmp_path / "rec.toml"), "--session-dir", str(session)],
            cwd=tmp_path,
        )  # fmt: skip
        assert p.returncode == 2, p.stderr
        assert "--record" in p.stderr and "--backend ray" in p.stderr
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
