"""The shell host's cancel listener around the end of one evaluation and the start of the next
(issue 34, item 8): a cancel decided for run 1 is applied while run 1 is still the host's
current run, never to run 2 that the main thread began meanwhile.

A real control pipe and the real listener thread; the host's ``session.cancel`` is a callable
that records which run was in flight when it tripped. The interleaving is forced: the cancel
is held at its entry (the listener has decided it hits run 1) while another thread ends run 1
and begins run 2, as the host's main thread does between two calls; only then is it let go.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest

from exarch_actors.actors.frames import Channel
from exarch_actors.actors.process import CancelListener
from tests.support.waiting import HANG_GUARD

SWITCH_WAIT = 1.0
"""Seconds the held cancel gives the other thread to switch runs: the switch must not happen
while the cancel is being applied (with the fix it waits for it); a switch slower than this on a
loaded box only lets the test pass without proving the ordering, it can never fail it."""


class Host:
    """What the listener cancels: the run in flight as the host's main thread sets it."""

    def __init__(self, hold_call: int) -> None:
        self.running: int | None = None
        self.tripped: list[int | None] = []
        self.calls = 0
        self.hold_call = hold_call
        self.entered = threading.Event()
        self.release = threading.Event()
        self.applied = threading.Event()

    def cancel(self, reason: str) -> None:
        if reason == "control side gone":
            return
        self.calls += 1
        if self.calls == self.hold_call:
            self.entered.set()
            assert self.release.wait(HANG_GUARD)
        self.tripped.append(self.running)
        if self.calls == self.hold_call:
            self.applied.set()


@pytest.fixture
def control() -> Iterator[tuple[Channel, Channel]]:
    a, b = multiprocessing.Pipe(duplex=True)
    here, there = Channel(a), Channel(b)
    yield here, there
    a.close()  # the listener sees the channel closed and returns
    for t in threading.enumerate():
        if t.name == "cancel-listener":
            t.join(HANG_GUARD)
    b.close()


@pytest.mark.parametrize("hold_call", [1, 2], ids=["the-frame's-cancel", "a-re-trip"])
def test_a_cancel_decided_for_a_run_as_it_ends_trips_that_run_and_never_the_next_one(
    control: tuple[Channel, Channel], hold_call: int
) -> None:
    here, there = control
    host = Host(hold_call)
    listener = CancelListener(there, host.cancel)
    listener.begin(1)
    host.running = 1
    here.send("cancel", run=1, reason="stop run 1")
    assert host.entered.wait(HANG_GUARD), "the listener applied the cancel"

    switched = threading.Event()

    def next_call() -> None:  # the host's main thread: run 1 returns, run 2 begins
        listener.end()
        host.running = None
        listener.begin(2)
        host.running = 2
        switched.set()

    main = threading.Thread(target=next_call, name="host-main")
    main.start()
    switched.wait(SWITCH_WAIT)  # with the fix it cannot happen while the cancel is held
    host.release.set()
    assert host.applied.wait(HANG_GUARD)
    main.join(HANG_GUARD)
    assert switched.is_set()
    assert host.tripped and set(host.tripped) == {1}, host.tripped
    assert not listener.event.is_set(), "run 2 does not stand cancelled"
    listener.end()
