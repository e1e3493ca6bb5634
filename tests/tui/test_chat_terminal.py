"""The bare ``exarch-actors`` command in a real pseudo-terminal: what a new user meets first.

The pilot tests drive the app in-process; this one runs the installed command as a user does, so
the whole path (click, the packaged demo, textual's terminal driver, the fork server, the quit
sequence) is exercised, and the process tree is checked after Ctrl-C twice.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")


class Screen:
    """A pseudo-terminal of ``cols`` x ``rows`` running ``exarch-actors ARGS``."""

    def __init__(self, cwd: Path, *args: str, cols: int = 100, rows: int = 30) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import main; main()", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env={**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
        os.close(slave)
        self.raw = ""

    @property
    def text(self) -> str:
        """What was written, less the escape sequences (words of one widget stay together)."""
        return _ESCAPES.sub("", self.raw)

    def pump(self, timeout: float = 0.1) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                self.raw += os.read(self.master, 65536).decode(errors="replace")
            except OSError:  # the child closed its side: nothing more to read
                pass

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text:
            gone = self.proc.poll() is not None
            assert not gone and time.monotonic() < deadline, (
                f"never saw {text!r} (exit {self.proc.returncode}); so far:\n{self.text[-3000:]}"
            )
            self.pump()

    def keys(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def test_the_bare_command_opens_the_demo_says_so_on_screen_and_ctrl_c_twice_leaves_no_process(
    tmp_path: Path,
) -> None:
    screen = Screen(tmp_path)  # no arguments at all
    try:
        screen.wait_for("this is the scripted demo")
        screen.wait_for("scripted:demo")  # the status line: the trunk is up, its shell too
        tree = psutil.Process(screen.proc.pid).children(recursive=True)
        assert tree, "the fork server and the trunk's shell host run under the command"
        screen.keys(b"\x03")
        time.sleep(0.2)  # two key events, well inside the 2 s quit window
        screen.keys(b"\x03")
        deadline = time.monotonic() + 30
        while screen.proc.poll() is None:
            assert time.monotonic() < deadline, screen.text[-3000:]
            screen.pump()
        screen.pump()
        assert screen.proc.returncode == 0, screen.text[-3000:]
        assert "session:" in screen.text
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
