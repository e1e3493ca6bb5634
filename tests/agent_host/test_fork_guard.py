"""A fork request its client abandons (connects, then dies before it sends its descriptors)
is refused by the fork server, which serves the next one: before, CPython's fork server
raised out of its loop (``EOFError``), exited, and took every agent process, shell host and
worker of the run with it (``actors/fork_guard.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, os, socket
from multiprocessing import forkserver
from exarch_actors.actors.process import fork_server_address, start_process

address = fork_server_address()
server = forkserver._forkserver._forkserver_pid

def fork_one(code):
    # the server takes requests one by one, in order: this start is answered only after the
    # abandoned request before it was (and fails if that request ended the server)
    try:
        proc = start_process(os._exit, (code,), name="probe")
    except OSError as e:
        return type(e).__name__
    proc.join(30)
    return proc.exitcode

seen = []
for code, send in ((7, b""), (8, b"x")):  # nothing at all; one byte and no descriptors
    s = socket.socket(socket.AF_UNIX)
    s.connect(address)
    if send:
        s.send(send)
    s.close()
    seen.append(fork_one(code))
print(json.dumps({"forked": seen, "same": forkserver._forkserver._forkserver_pid == server}))
"""


@pytest.mark.timeout(120)
def test_a_fork_request_abandoned_by_its_client_leaves_the_fork_server_serving() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"forked": [7, 8], "same": True}, out.stderr
