"""Escape attempts against a confined shell (``--sandbox workspace-write``), run through a real
shell host, its real programs and the real kernel (Landlock + the seccomp filter of
``actors/landlock.py``). Each case asserts what the user sees -- the ral error and the program's
own stderr -- and that the secret never appears; the module ends by checking that nothing was
written outside the workspace and that no listener was reached. One shell host serves the whole
corpus (a module fixture), so the corpus costs one host start.

The tree: ``BASE/home/.ssh/id_rsa`` (the secret), ``BASE/outside/`` (a writable-looking
directory with a file and a program), ``BASE/ws/`` (the workspace and cwd), ``BASE/scratch/``.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exarch_actors.actors.landlock import abi
from exarch_actors.actors.shell import ShellActor
from exarch_actors.runtime.ral.context import DynamicContext
from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.shell.confinement import Sandbox, SandboxMode
from exarch_actors.runtime.shell.limits import MiB, ShellLimits
from exarch_actors.runtime.state.session_dir import SessionDir
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(abi() < 6, reason="needs Landlock ABI >= 6 (Linux >= 6.12)")

SECRET = "SECRET-KEY-0f3a9"
PY = "/usr/bin/python3"
MEMORY = 256 * MiB


@dataclass
class Tree:
    base: Path
    home: Path
    key: Path
    outside: Path
    ws: Path
    scratch: Path
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    unix_path: Path

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.getsockname()[1])

    @property
    def udp_port(self) -> int:
        return int(self.udp.getsockname()[1])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    base = tmp_path_factory.mktemp("escape")
    home, outside, ws, scratch = (base / n for n in ("home", "outside", "ws", "scratch"))
    for d in (home / ".ssh", outside, ws, scratch):
        d.mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text(SECRET + "\n")
    (outside / "existing").write_text("untouched\n")
    shutil.copy("/bin/true", outside / "true")
    (ws / "mine").write_text("workspace file\n")
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    unix_path = outside / "listener.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(unix_path))
    unix.listen()
    unix.setblocking(False)
    yield Tree(base, home, key, outside, ws, scratch, tcp, udp, unix, unix_path)
    for s in (tcp, udp, unix):
        s.close()


@pytest.fixture(scope="module")
def confined(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    sandbox = Sandbox(SandboxMode.WORKSPACE_WRITE, (str(tree.ws),), False, str(tree.scratch))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tree.home), "TMPDIR": str(tree.scratch)}
    ctx = DynamicContext(str(tree.ws), env, Grants.ALL, sandbox)
    ref = ShellActor.start(
        name="trunk",
        session=SessionDir(tmp_path_factory.mktemp("session")),
        context=ctx,
        limits=ShellLimits(memory_bytes=MEMORY),
    )
    shell = ref.proxy()
    assert shell.run("echo ready").get().error is None  # the host starts before any census
    yield shell
    ref.stop(block=True, timeout=20)


def _outside_before() -> set[str]:
    return {"existing", "true", "listener.sock"}


# (id, script, part of the ral error, part of stdout+stderr). ``{k}`` and friends are filled
# from the tree; a case passes only if the secret is nowhere in what the user sees.
CASES: list[tuple[str, str, str, str]] = [
    # -- reads outside the roots ------------------------------------------------------------
    ("cat-key", "cat {key}", "cat exited with code 1", "Permission denied"),
    ("read-text-key", "read-text {key}", "outside the sandbox: workspace-write", ""),
    ("view-text-key", "view-text {key}", "Permission denied", ""),
    ("grep-files-home", "grep-files SECRET {home}", "Permission denied", ""),
    ("explore-dir-home", "explore-dir {home}", "cannot open", ""),
    ("head-key", "head -c 5 {key}", "exited with code 1", "Permission denied"),
    ("sh-redirect-key", "sh -c 'cat < {key}'", "exited with code 2", "cannot open"),
    ("dotdot-key", "cat ../home/.ssh/id_rsa", "exited with code 1", "Permission denied"),
    ("dotdot-read-text", "read-text ../home/.ssh/id_rsa", "outside the sandbox", ""),
    ("symlink-read", "ln -s {key} link1; cat link1", "cat exited", "Permission denied"),
    ("symlink-read-text", "ln -s {key} link2; read-text link2", "outside the sandbox", ""),
    ("hardlink-key", "ln {key} hard", "ln exited", "hard link"),
    ("proc-self-root", "cat /proc/self/root{key}", "exited with code 1", "Permission denied"),
    ("proc-1-root", "cat /proc/1/root{key}", "exited with code 1", "Permission denied"),
    ("proc-1-cwd", "ls /proc/1/cwd/", "exited with code 2", "Permission denied"),
    ("proc-control-cwd", "ls /proc/{control}/cwd/", "ls exited", "Permission denied"),
    ("proc-control-mem", "head -c 1 /proc/{control}/mem", "exited", "Permission denied"),
    ("cp-key", "cp {key} stolen", "cp exited", "Permission denied"),
    ("py-open-key", PY + " -c 'open(\"{key}\").read()'", "exited with code 1", "PermissionError"),
    ("py-listdir-home", PY + " -c 'import os; os.listdir(\"{home}\")'", "exited", "Permission"),
    ("tar-home", "tar cf - {home}", "tar exited", "Permission denied"),
    ("dd-key", "dd if={key}", "dd exited", "Permission denied"),
    ("mv-key-in", "mv {key} stolen2", "mv exited", "Permission denied"),
    ("find-exec-cat", "find {home} -name id_rsa -exec cat '{{}}' ';'", "find exited", "denied"),
    ("etc-shadow", "cat /etc/shadow", "cat exited", "Permission denied"),
    ("tmp-read", "ls {base}", "ls exited", "Permission denied"),
    # -- writes outside the roots -----------------------------------------------------------
    ("write-text-out", "write-text {outside}/w1 x", "outside the sandbox", ""),
    ("sh-redirect-out", "sh -c 'echo x > {outside}/w2'", "exited with code 2", "cannot create"),
    ("touch-out", "touch {outside}/w3", "touch exited", "Permission denied"),
    ("mkdir-out", "mkdir {outside}/d", "mkdir exited", "Permission denied"),
    ("cp-out", "cp mine {outside}/w4", "cp exited", "Permission denied"),
    ("symlink-make-out", "ln -s /etc {outside}/l", "ln exited", "Permission denied"),
    ("rm-out", "rm -f {outside}/existing", "rm exited", "Permission denied"),
    ("mv-out", "mv mine {outside}/w5", "mv exited", "Permission denied"),
    ("truncate-out", "truncate -s 0 {outside}/existing", "truncate exited", "Permission denied"),
    ("py-write-out", PY + ' -c \'open("{outside}/w6", "w")\'', "exited", "PermissionError"),
    (
        "symlink-write-through",
        "ln -s {outside}/w7 out7; sh -c 'echo x > out7'",
        "sh exited",
        "cannot create",
    ),
    (
        "write-text-through-link",
        "ln -s {outside}/w8 out8; write-text out8 x",
        "outside the sandbox",
        "",
    ),
    ("tmp-write", "touch /tmp/exarch-escape-w9", "touch exited", "Permission denied"),
    ("mkfifo-out", "mkfifo {outside}/fifo", "mkfifo exited", "Permission denied"),
    ("mknod-in-ws", "mknod ws-null c 1 3", "mknod exited", "Permission denied"),
    # -- programs, privileges, namespaces ---------------------------------------------------
    ("exec-outside", "{outside}/true", "Permission denied", ""),
    ("ld-preload", "/usr/bin/env LD_PRELOAD={outside}/true cat mine", "", "cannot be preloaded"),
    (
        "unshare-mount",
        "unshare -m mount -t tmpfs none {outside}",
        "unshare exited",
        "Operation not permitted",
    ),
    ("mount-bind", "mount --bind {home} {ws}", "mount exited", "ermission"),
    ("unshare-userns-read", "unshare -r cat {key}", "exited", "Permission denied"),
    (
        "ptrace-control",
        PY + " -c 'import ctypes,sys; l=ctypes.CDLL(None, use_errno=True); "
        "sys.exit(0 if l.ptrace(16, {control}, 0, 0) == 0 else ctypes.get_errno())'",
        "exited with code 1",
        "",
    ),
    ("kill-control", "sh -c 'kill -0 {control}'", "sh exited", "Operation not permitted"),
    ("setuid-su", "su root -c 'cat {key}'", "su exited", ""),
    # -- network --------------------------------------------------------------------------
    (
        "tcp-connect",
        PY + " -c 'import socket; socket.create_connection((\"127.0.0.1\", {tcp}))'",
        "exited",
        "PermissionError: [Errno 13]",
    ),
    (
        "udp-send",
        PY + " -c 'import socket; socket.socket(socket.AF_INET, "
        'socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {udp}))\'',
        "exited",
        "PermissionError: [Errno 13]",
    ),
    (
        "unix-connect",
        PY + " -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{unix}\")'",
        "exited",
        "PermissionError: [Errno 13]",
    ),
    (
        "bash-dev-tcp",
        "bash -c 'echo x > /dev/tcp/127.0.0.1/{tcp}'",
        "bash exited",
        "Permission denied",
    ),
    (
        "tcp6",
        PY + " -c 'import socket; socket.socket(socket.AF_INET6)'",
        "exited",
        "PermissionError",
    ),
    (
        "netlink",
        PY + " -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)'",
        "exited",
        "PermissionError",
    ),
    ("curl-tcp", "curl -s http://127.0.0.1:{tcp}/", "curl exited", ""),
    # -- resources ------------------------------------------------------------------------
    ("memory-bomb", PY + " -c 'b = bytearray(1 << 30)'", "exited with code 1", "MemoryError"),
    (
        "open-files",
        PY + " -c '[open(\"/dev/null\") for _ in range(5000)]'",
        "exited",
        "Too many open files",
    ),
]


def _fill(script: str, tree: Tree) -> str:
    return script.format(
        key=tree.key,
        home=tree.home,
        outside=tree.outside,
        ws=tree.ws,
        base=tree.base,
        control=os.getpid(),
        tcp=tree.tcp_port,
        udp=tree.udp_port,
        unix=tree.unix_path,
    )


@pytest.mark.parametrize(
    ("script", "error", "said"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_an_escape_attempt_fails_with_what_the_user_sees(
    confined: Any, tree: Tree, script: str, error: str, said: str
) -> None:
    r = confined.run(_fill(script, tree)).get()
    shown = f"{r.value}\n{r.stdout}\n{r.stderr}\n{r.error}"
    assert SECRET not in shown
    if error:
        assert r.error is not None and error in r.error, shown
    if said:
        assert said in r.stdout + r.stderr + (r.error or ""), shown


def test_the_corpus_has_at_least_fifty_attempts() -> None:
    assert len(CASES) >= 50


def test_after_the_corpus_nothing_was_written_outside_and_no_listener_was_reached(
    confined: Any, tree: Tree
) -> None:
    confined.run("echo done").get()  # the corpus ran first (module order)
    assert {p.name for p in tree.outside.iterdir()} == _outside_before()
    assert (tree.outside / "existing").read_text() == "untouched\n"
    assert tree.key.read_text() == SECRET + "\n"
    assert not Path("/tmp/exarch-escape-w9").exists()
    for listener in (tree.tcp, tree.unix):
        with pytest.raises(BlockingIOError):
            listener.accept()
    with pytest.raises(BlockingIOError):
        tree.udp.recvfrom(16)


def test_the_workspace_and_scratch_stay_usable_inside_the_sandbox(
    confined: Any, tree: Tree
) -> None:
    for script in (
        "write-text made x",
        "sh -c 'echo y > made2'",
        PY + " -c 'import tempfile; tempfile.NamedTemporaryFile().write(b\"z\")'",
    ):
        assert confined.run(script).get().error is None, script
    assert confined.run("cat made made2").get().value == "xy"
    status = confined.run("cat /proc/self/status").get().value
    assert "NoNewPrivs:\t1" in status  # setuid binaries run without their privilege
    assert (tree.ws / "made2").read_text() == "y\n"


def test_a_worker_runs_under_the_same_sandbox(confined: Any, tree: Tree) -> None:
    r = confined.run(_fill("let w = spawn {{ cat {key} }}; await $w", tree)).get()
    assert r.error is not None and "cat exited with code 1" in r.error
    assert "Permission denied" in r.stderr + r.error
    assert SECRET not in r.stdout + r.stderr


def test_a_program_in_the_workspace_runs_but_stays_confined(confined: Any, tree: Tree) -> None:
    prog = tree.ws / "steal.sh"
    prog.write_text(f"#!/bin/sh\ncat {tree.key}\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    r = confined.run("./steal.sh").get()
    assert r.error is not None and "steal.sh exited with code 1" in r.error
    assert "Permission denied" in r.stderr and SECRET not in r.stdout


def test_a_confined_program_reads_no_key_in_the_control_process_environ(
    confined: Any, tmp_path: Path
) -> None:
    """``/proc/PID/environ`` of an unconfined process stays readable under Landlock, so the
    control process masks its keys there (:func:`actors.process.mask_proc_secrets`)."""
    key = "sk-test-" + "7" * 24
    ready = tmp_path / "ready"
    code = (
        "import pathlib, sys, time\n"
        "from exarch_actors.actors.process import mask_proc_secrets\n"
        "from exarch_actors.runtime.credentials import DEFAULT\n"
        "mask_proc_secrets(DEFAULT)\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "sys.stdin.read()\n"
    )
    env = dict(os.environ, OPENAI_API_KEY=key)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE)
    try:
        wait_for(ready.exists)
        r = confined.run(f"cat /proc/{proc.pid}/environ").get()
        assert r.error is None and "OPENAI_API_KEY=" + "*" * len(key) in r.value
        assert key not in r.value
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
