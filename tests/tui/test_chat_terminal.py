"""The bare ``exarch-actors`` command in a real pseudo-terminal: what a new user meets first.

The pilot tests drive the app in-process; this one runs the installed command as a user does, so
the whole path (click, the packaged demo, textual's terminal driver, the fork server, the quit
sequence) is exercised, and the process tree is checked after Ctrl-C twice.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from tests.support.terminal import Terminal
from tests.support.waiting import wait_for


@pytest.mark.slow
def test_the_bare_command_opens_the_demo_says_so_on_screen_and_ctrl_c_twice_leaves_no_process(
    tmp_path: Path,
) -> None:
    screen = Terminal([], cwd=tmp_path, env={"TERM": "xterm-256color"}, size=(100, 30))
    try:  # no arguments at all
        screen.read_until("this is the scripted demo", timeout=30)
        screen.read_until("scripted:demo", timeout=30)  # the status line: trunk and shell up
        tree = psutil.Process(screen.proc.pid).children(recursive=True)
        assert tree, "the fork server and the trunk's shell host run under the command"
        screen.keys(b"\x03")
        time.sleep(0.2)  # two key events, well inside the 2 s quit window
        screen.keys(b"\x03")
        assert screen.wait(30) == 0, screen.plain[-3000:]
        assert "session:" in screen.plain
        wait_for(lambda: not [p for p in tree if _alive(p)], what="every child reaped")
        (session,) = (tmp_path / ".exarch" / "sessions").iterdir()
        assert (session / "result.json").exists()
    finally:
        screen.close()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
