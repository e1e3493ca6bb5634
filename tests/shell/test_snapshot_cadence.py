"""The snapshot files (base + binding log) follow every committed change, and skip calls that
change nothing a resume needs (only the ledger's clock moved) for at most SNAPSHOT_FILE_EVERY
calls."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exarch_actors.actors.shell_snapshot import SNAPSHOT_FILE_EVERY
from exarch_actors.runtime.state.binding_log import log_path
from exarch_actors.runtime.state.snapshot import MobileSnapshot


def _stamp(path: Path) -> tuple[int, int, int]:
    """The base's identity and the log's length: what a checkpoint changes on disk."""
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, os.stat(log_path(path)).st_size)


def test_a_call_that_binds_appends_to_the_files_and_a_pure_read_does_not(
    start_shell: Callable[..., Any], tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    path = tmp_path / "agents" / "trunk" / "snapshot.msgpack"
    shell.run("let x = 1").get()
    after_bind = _stamp(path)
    shell.run("add 1 2").get()
    assert _stamp(path) == after_bind, "a call that changed nothing left the file alone"
    shell.run("let y = 2").get()
    assert _stamp(path) != after_bind
    assert set(MobileSnapshot.load(path).names()) >= {"x", "y"}


def test_a_cd_reaches_the_files(start_shell: Callable[..., Any], tmp_path: Path) -> None:
    shell = start_shell().proxy()
    path = tmp_path / "agents" / "trunk" / "snapshot.msgpack"
    shell.run("add 1 1").get()
    before = _stamp(path)
    shell.run(f"cd {tmp_path}").get()
    assert _stamp(path) != before
    assert MobileSnapshot.load(path).context["cwd"] == str(tmp_path)


def test_the_file_catches_up_with_the_epoch_within_the_cadence(
    start_shell: Callable[..., Any], tmp_path: Path
) -> None:
    shell = start_shell().proxy()
    path = tmp_path / "agents" / "trunk" / "snapshot.msgpack"
    for _ in range(SNAPSHOT_FILE_EVERY + 1):
        shell.run("add 1 1").get()
    epoch = shell.durable_snapshot().get().epoch
    assert epoch - MobileSnapshot.load(path).epoch < SNAPSHOT_FILE_EVERY


def test_a_refused_snapshot_write_keeps_the_call_reports_it_and_retries_next_checkpoint(
    start_shell: Callable[..., Any], tmp_path: Path, notices: Any
) -> None:
    shell = start_shell(notice_sink=notices).proxy()
    path = tmp_path / "agents" / "trunk" / "snapshot.msgpack"
    shell.run("let before = 1").get()
    path.unlink()
    path.mkdir()  # the rename of a new base onto the snapshot path now fails
    # a binding over the log's 1 MiB bound: its frame is appended, then the log is compacted
    result = shell.run("let during = seq 1 200000").get()
    assert result.error is None and "during" in result.defined
    assert "SnapshotWriteFailed" in notices.kinds()
    assert not list(path.parent.glob(".snapshot.msgpack*.tmp")), "no temp file left behind"
    assert shell.run("add 1 1").get().error is None
    path.rmdir()
    shell.run("add 2 2").get()  # the next checkpoint retries the compaction: it is still due
    assert {"before", "during"} <= set(MobileSnapshot.load(path).names())
