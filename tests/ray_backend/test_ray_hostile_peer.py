"""A hostile peer on the launch port of a real Ray run: every listener the driver opens during
``examples/fanout.toml`` is sent garbage as soon as it appears, and the run still finishes
(``result.json``, exit 0, ``check`` holding), each refused peer named on stderr, and every
listener was bound to the node's address, none to a wildcard. Before, the
first garbage ended the run: ``RayHostFailed: ... refused a peer (digest received was wrong)``,
a traceback, exit 1, no ``result.json`` (issue 34)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ray_backend.conftest import ROOT, START_TIMEOUT, Cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

PEST = r"""
import os, socket, sys, time
driver = sys.argv[1]

def alive():
    try:
        with open(f"/proc/{driver}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

def sockets():
    out = set()
    try:
        fds = os.listdir(f"/proc/{driver}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{driver}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out

seen, hits = set(), 0
first = None
while alive():
    owned = sockets()
    with open("/proc/net/tcp") as fh:
        rows = [line.split() for line in fh.read().splitlines()[1:]]
    listening = {r[1] for r in rows if r[3] == "0A" and r[9] in owned}
    if first is None:
        first = listening  # Ray's own ports of the driver, open before any launch
        seen |= listening
    for local in listening - seen:
        seen.add(local)
        try:
            with socket.create_connection(("127.0.0.1", int(local.split(":")[1], 16)), 1) as s:
                s.sendall(b"\x00\x00\x00\x10garbage garbage!")
            hits += 1
        except OSError:
            pass
    time.sleep(0.001)
print("LISTENERS", " ".join(sorted(seen)), flush=True)
print("HITS", hits, flush=True)
"""
"""Run inside the cluster's namespace: watches the driver's listening sockets (those it held
at the start are Ray's own) and sends garbage to each new one, until the driver ends."""


def test_garbage_sent_to_every_launch_listener_is_refused_and_the_run_still_finishes(
    cluster: Cluster, tmp_path: Path
) -> None:
    session = tmp_path / "session"
    with cluster.ray_run(ROOT / "examples" / "fanout.toml", session) as run:
        pest = subprocess.Popen(
            cluster._cmd([sys.executable, "-c", PEST, str(run.pid)]),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            _, err = run.communicate(timeout=START_TIMEOUT)
            out, _ = pest.communicate(timeout=START_TIMEOUT)
        finally:
            pest.kill()
            pest.communicate()
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    hits = int(lines["HITS"])
    assert hits >= 1, f"the pest reached no launch listener; stderr: {err}"
    # every listener the driver held was bound to the node's address (127.0.0.1 here), none
    # to a wildcard (0.0.0.0 is 00000000 in /proc/net/tcp)
    listeners = lines["LISTENERS"].split()
    assert listeners and all(a.startswith("0100007F:") for a in listeners), listeners
    assert run.returncode == 0, err
    assert "Traceback" not in err and "RayHostFailed" not in err, err
    assert err.count("refused a peer at 127.0.0.1:") >= 1, err
    result = json.loads((session / "result.json").read_text())
    assert result["fleetYield"]["neverSettled"] == 0
    check = cluster.exarch("check", "--json", str(session))
    assert check.returncode == 0 and json.loads(check.stdout)["ok"], check.stdout
