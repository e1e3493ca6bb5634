"""The disk warning latch (runtime.fleet.diskwarn), against real directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from exarch_actors.runtime.constants import DISK_WARN_CHECK_INTERVAL
from exarch_actors.runtime.fleet.diskwarn import DiskWarn, dir_size, disk_usage, outermost


def never_walk(path: Path) -> int:
    raise AssertionError(f"walked {path} with no ceiling configured")


def write(p: Path, n: int) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x" * n)


def test_with_no_ceiling_nothing_is_ever_walked(tmp_path: Path) -> None:
    dw = DiskWarn(None, [tmp_path], walker=never_walk)
    for epoch in range(0, 10_000, 7):
        assert dw.check(epoch) is None
    assert not dw.configured


def test_with_a_ceiling_it_measures_only_every_32_calls(tmp_path: Path) -> None:
    walked: list[int] = []

    def counting(p: Path) -> int:
        walked.append(1)
        return 0

    dw = DiskWarn(10, [tmp_path], walker=counting)
    for epoch in range(0, 100):
        dw.check(epoch)
    assert DISK_WARN_CHECK_INTERVAL == 32
    assert len(walked) == 3  # epochs 32, 64, 96


def test_a_turn_that_jumps_across_a_boundary_still_measures(tmp_path: Path) -> None:
    calls: list[Path] = []

    def walker(p: Path) -> int:
        calls.append(p)
        return 0

    dw = DiskWarn(10, [tmp_path], walker=walker)
    assert dw.check(5) is None and not calls
    dw.check(40)  # 35 calls in one turn: no epoch divisible by 32 was ever seen
    assert calls == [tmp_path]


def test_one_warning_per_excursion(tmp_path: Path) -> None:
    session, scratch = tmp_path / "session", tmp_path / "scratch"
    write(session / "agents" / "t" / "events.jsonl", 600)
    write(scratch / "big", 500)
    dw = DiskWarn(1000, [session, scratch])
    w = dw.check(32)
    assert w is not None and w.total_bytes == 1100 and w.ceiling_bytes == 1000
    assert "over the configured ceiling" in w.text and "nothing is rotated or deleted" in w.text
    assert dw.check(64) is None  # still over: latched, silent
    (scratch / "big").unlink()
    assert dw.check(96) is None and not dw.latched  # back under: unlatched
    write(scratch / "again", 900)
    assert dw.check(128) is not None  # a new excursion warns again


def test_dir_size_sums_regular_files_and_ignores_symlinks(tmp_path: Path) -> None:
    write(tmp_path / "a" / "b" / "c", 10)
    write(tmp_path / "d", 5)
    (tmp_path / "link").symlink_to(tmp_path / "d")
    assert dir_size(tmp_path) == 15
    assert dir_size(tmp_path / "missing") == 0
    assert dir_size(tmp_path / "d") == 5


def test_a_negative_ceiling_is_refused() -> None:
    with pytest.raises(ValueError):
        DiskWarn(-1, [])


def test_a_scratch_directory_inside_the_session_directory_is_counted_once(tmp_path: Path) -> None:
    session = tmp_path / "session"
    write(session / "transcript.jsonl", 300)
    write(session / "scratch" / "trunk" / "big", 700)
    dw = DiskWarn(1500, [session, session / "scratch" / "trunk"])
    assert dw.check(32) is None, "1000 bytes on disk: under a ceiling of 1500"
    assert dw.last_total == 1000 == dir_size(session)


def test_disk_usage_labels_sum_to_the_bytes_of_the_union(tmp_path: Path) -> None:
    session = tmp_path / "session"
    write(session / "transcript.jsonl", 300)
    write(session / "scratch" / "trunk" / "big", 700)
    write(session / "scratch" / "kid" / "other", 50)
    usage = disk_usage({"log dir": session, "scratch": session / "scratch" / "trunk"})
    assert usage == {"log dir": 350, "scratch": 700}
    assert sum(usage.values()) == dir_size(session)


def test_disk_usage_counts_a_repeated_root_once_and_separate_roots_each(tmp_path: Path) -> None:
    write(tmp_path / "a" / "f", 10)
    write(tmp_path / "b" / "g", 20)
    assert disk_usage({"one": tmp_path / "a", "two": tmp_path / "a"}) == {"one": 10, "two": 0}
    assert disk_usage({"a": tmp_path / "a", "b": tmp_path / "b"}) == {"a": 10, "b": 20}
    assert outermost([tmp_path / "a", tmp_path, tmp_path / "b", tmp_path]) == [tmp_path]
