"""The host reaper: settled agents' processes are told to exit once no other end follows, and
every one handed over is collected (``actors/host_reaper.py``, :class:`HostReaper`).

The hosts here record what the reaper asks of them: the reaper's rule is when it asks, and
that it asks every one; the real processes' reaping is in ``test_process_lifecycle.py``."""

from __future__ import annotations

import threading
from typing import Any

from exarch_actors.actors.host_reaper import HostReaper
from tests.support.waiting import HANG_GUARD, wait_for


class RecordingHost:
    """Stands in for ``_Host``: the two calls the reaper makes, recorded."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self._log = name, log
        self.collected = threading.Event()

    def ask_to_exit(self, reason: str) -> None:
        self._log.append(f"exit {self.name}")

    def collect(self) -> None:
        self._log.append(f"collect {self.name}")
        self.collected.set()


def _hosts(n: int) -> tuple[list[Any], list[str]]:
    log: list[str] = []
    return [RecordingHost(f"h{i}", log) for i in range(n)], log


def test_settled_hosts_are_held_through_the_quiet_spell_and_close_tells_and_collects_every_one() -> (  # noqa: E501
    None
):
    hosts, log = _hosts(3)
    reaper = HostReaper(quiet=60.0, latest=120.0)
    for host in hosts:
        reaper.reap(host)
    assert reaper.held() == 3
    assert log == [], "no host told to exit while the quiet spell has not passed"
    reaper.close()
    # every one told first, so they exit in parallel; then each collected, in order
    assert log == ["exit h0", "exit h1", "exit h2", "collect h0", "collect h1", "collect h2"]
    assert reaper.held() == 0


def _reaped_alone(quiet: float, latest: float) -> list[str]:
    """One host handed to a reaper with these bounds, waited for until collected: the log."""
    hosts, log = _hosts(1)
    reaper = HostReaper(quiet=quiet, latest=latest)
    try:
        reaper.reap(hosts[0])
        wait_for(hosts[0].collected.is_set, 30, "h0 collected without the reaper closing")
        return list(log)
    finally:
        reaper.close()


def test_a_settled_host_is_told_to_exit_and_collected_once_no_other_end_follows() -> None:
    assert _reaped_alone(quiet=0.05, latest=120.0) == ["exit h0", "collect h0"]


def test_a_host_is_not_held_past_the_latest_bound_however_long_the_quiet_spell_would_be() -> None:
    assert _reaped_alone(quiet=600.0, latest=0.05) == ["exit h0", "collect h0"]


def test_a_host_handed_to_a_closed_reaper_is_told_and_collected_by_the_caller_at_once() -> None:
    hosts, log = _hosts(1)
    reaper = HostReaper(quiet=600.0, latest=600.0)
    reaper.close()
    reaper.reap(hosts[0])
    assert log == ["exit h0", "collect h0"]


class SlowHost(RecordingHost):
    """A host whose collection does not return until the test lets it (an exit that takes its
    time: in the idle class on a busy box)."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.collecting = threading.Event()
        self.release = threading.Event()

    def collect(self) -> None:
        self.collecting.set()
        self.release.wait(HANG_GUARD)
        super().collect()


class TellingHost(RecordingHost):
    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.told = threading.Event()

    def ask_to_exit(self, reason: str) -> None:
        super().ask_to_exit(reason)
        self.told.set()


def test_a_host_settled_while_an_earlier_one_is_still_being_collected_is_told_to_exit_meanwhile() -> (  # noqa: E501
    None
):
    log: list[str] = []
    slow, later = SlowHost("h0", log), TellingHost("h1", log)
    reaper = HostReaper(quiet=0.0, latest=0.0)
    try:
        reaper.reap(slow)
        assert slow.collecting.wait(HANG_GUARD), "h0 told and being collected"
        reaper.reap(later)
        assert later.told.wait(HANG_GUARD), "h1 told while h0's collection still waits"
        assert log == ["exit h0", "exit h1"]
    finally:
        slow.release.set()
        reaper.close()
    assert log == ["exit h0", "exit h1", "collect h0", "collect h1"]
