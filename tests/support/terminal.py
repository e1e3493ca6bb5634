"""A command in a real pseudo-terminal: what a user at a terminal sees, escape codes included.

:class:`Terminal` starts ``exarch-actors ARGS`` (this tree's code) with stdin, stdout and stderr
on one pty, in its own session (so a test can signal its process group as Ctrl-C would), reads
everything it writes, and always reaps it.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")
"""Control sequences: CSI ones, character-set selections and keypad modes (textual's)."""


class Terminal:
    def __init__(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
        size: tuple[int, int] | None = None,
    ) -> None:
        """``prefix``: a command the CLI runs under (``nsenter ... --``: another namespace);
        ``size``: the terminal's columns and rows (the pty's default otherwise)."""
        self.master, slave = pty.openpty()
        if size is not None:
            cols, rows = size
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", **(env or {})}
        full_env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            [
                *(prefix or []),
                sys.executable,
                "-c",
                "from exarch_actors.cli.main import main; main()",
                *args,
            ],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=full_env,
            start_new_session=True,
        )
        os.close(slave)
        self.seen = ""

    @property
    def plain(self) -> str:
        """What was written, escape sequences removed."""
        return ANSI.sub("", self.seen)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the other end closed
            return False
        if not data:
            return False
        self.seen += data.decode(errors="replace")
        return True

    def read_until(self, text: str, timeout: float = 20.0) -> str:
        """Read until ``text`` appears in :attr:`plain`; fail with the screen so far."""
        deadline = time.monotonic() + timeout
        while text not in self.plain:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; screen so far:\n{self.plain}"
            if not self._read(min(left, 0.1)):
                assert text in self.plain, f"exited without {text!r}; screen:\n{self.plain}"
        return self.plain

    def keys(self, data: bytes) -> None:
        """Type ``data`` at the terminal (``b"\\x03"``: Ctrl-C)."""
        os.write(self.master, data)

    def wait(self, timeout: float = 60.0) -> int:
        """Read everything until the command exits; its exit code."""
        deadline = time.monotonic() + timeout
        while self._read(0.05):
            if self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]:
                break
            assert time.monotonic() < deadline, f"still running; screen:\n{self.plain}"
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        """Ctrl-C if it still runs (the run cancels its tree), then SIGKILL the whole group."""
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        finally:
            os.close(self.master)
