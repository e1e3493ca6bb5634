"""The REPL in a real pseudo-terminal: multi-line entry, and Ctrl-C cancelling a run (native
and external) without leaving the REPL."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


class Terminal:
    def __init__(self, home: Path) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from exarch_actors.cli.main import main; main()", "ral"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=ROOT,
            env={**os.environ, "HOME": str(home)},
            start_new_session=True,
        )
        os.close(slave)
        self.seen = ""

    def read_until(self, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; screen so far:\n{self.seen}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.1))
            if ready:
                try:
                    self.seen += os.read(self.master, 4096).decode(errors="replace")
                except OSError:
                    break
        return self.seen

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> None:
        try:
            os.write(self.master, b"\x04")  # Ctrl-D leaves the REPL
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self.master)


def _program_in_own_group(repl: int) -> bool:
    """Whether the REPL's external program runs in its own process group. Before its
    ``setsid`` (the instant after fork) it is still in the terminal's foreground group, and a
    Ctrl-C then kills it with SIGINT (``killed by signal 2``) instead of cancelling the run."""
    try:
        kids = psutil.Process(repl).children()
        return any(p.name() == "sleep" and os.getpgid(p.pid) == p.pid for p in kids)
    except (psutil.Error, ProcessLookupError):
        return False


def test_ctrl_c_cancels_a_running_sleep_and_the_repl_keeps_its_bindings(tmp_path: Path) -> None:
    term = Terminal(tmp_path)
    try:
        term.read_until("ral> ")
        term.send("let f = { |a|")
        term.read_until("...> ")
        term.send("  mul $a 2 }")
        term.send("f 21")
        term.read_until("42")
        term.send(f"cd {tmp_path}")
        for n, script in enumerate(("sleep 30", "/bin/sleep 30")):
            mark = len(term.seen)
            marker = tmp_path / f"running-{n}"
            term.send(f"write-text {marker.name} x; {script}")
            wait_for(marker.exists, what="the run in flight (its marker written)")
            if script.startswith("/"):
                wait_for(lambda: _program_in_own_group(term.proc.pid), what="the program up")
            os.killpg(term.proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground
            term.read_until("cancelled")  # within 10 s: the 30 s sleep was cut short
            assert "Traceback" not in term.seen[mark:]
            term.seen = term.seen[:mark] + term.seen[mark:].replace("cancelled", "", 1)
        term.send("f 2")
        term.read_until("\r\n4\r\nral> ")
        assert term.proc.poll() is None, "the REPL survived both interrupts"
    finally:
        term.close()
    assert term.proc.returncode == 0
