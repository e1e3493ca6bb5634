"""The system calls that confine a shell host or worker: Landlock, a seccomp filter, rlimits.

:func:`enter` is called once, in a shell host (at its first ``restore``) or a worker (at its
start), on the thread that then runs ral, before any ral runs; every program and thread it
starts afterwards inherits the confinement, and ``no_new_privs`` means none can leave it (a
setuid binary runs without its privilege). The rules are :mod:`runtime.shell.confinement`'s.

- **Files** (Landlock, ABI >= 1; rights of later ABIs used where the kernel has them): read and
  execute under the ruleset's read paths, every right but device nodes under its write paths,
  read-write on a few device files; nothing else.
- **Network** (when closed): a seccomp filter makes ``socket()`` fail with ``EACCES`` for every
  family (TCP, UDP, raw, netlink and unix sockets alike; ``socketpair`` stays: pipes between a
  program's own processes), and refuses ``io_uring_setup`` (io_uring can open sockets without
  ``socket()``) and every syscall of another ABI (x32, i386); Landlock ABI >= 4 also refuses TCP
  bind/connect, and ABI >= 6 scopes abstract unix sockets and signals to the shell's own domain
  (a program cannot signal another agent's processes).
- **Scope of one thread**: Landlock and seccomp confine the calling thread and what it starts.
  A host's cancel listener thread, started before, stays unconfined: it only reads the control
  pipe, and a confined program cannot reach it (Landlock refuses ptrace and ``/proc/PID/mem``
  outside the domain).

Only x86_64 is supported for the seccomp filter (the syscall numbers below); elsewhere
:func:`enter` confines files only and :func:`network_closable` says so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
from typing import Any

from exarch_actors.runtime.ral.grants import Grants
from exarch_actors.runtime.shell.confinement import (
    MAX_OPEN_FILES,
    Ruleset,
    Sandbox,
    etc_entries,
    path_dirs,
    python_paths,
    ruleset,
)

SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
SYS_SECCOMP = 317
SYS_SOCKET = 41
SYS_IO_URING_SETUP = 425

_LANDLOCK_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 16, 32, 64, 128
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 256, 512, 1024, 2048
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 4096, 8192, 16384, 32768
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights that apply to a file (a rule on a non-directory may hold only these)."""

_ABI_FS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP = 1 | 2  # LANDLOCK_ACCESS_NET_BIND_TCP | CONNECT_TCP (ABI 4)
_SCOPES = 1 | 2  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6)

_libc: Any = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class ConfinementFailed(OSError):
    """The kernel refused to set up a confinement this process was asked to enter."""


def abi() -> int:
    """The kernel's Landlock ABI version (0: no Landlock, or it is disabled)."""
    if platform.system() != "Linux":
        return 0
    v = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(v), 0)


def network_closable() -> bool:
    """Whether :func:`enter` can close the network (the seccomp filter's syscall numbers)."""
    return platform.machine() == "x86_64"


def _handled_fs(version: int) -> int:
    return next(mask for v, mask in sorted(_ABI_FS.items(), reverse=True) if version >= v)


def _fail(what: str) -> ConfinementFailed:
    e = ctypes.get_errno()
    return ConfinementFailed(e, f"{what}: {os.strerror(e)}")


def _add_path(fd: int, path: str, access: int, handled: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist grants nothing
    try:
        if not os.path.isdir(f"/proc/self/fd/{target}"):
            access &= FILE_RIGHTS
        attr = struct.pack("=Qi", access & handled, target)
        buf = ctypes.create_string_buffer(attr, len(attr))
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, _RULE_PATH_BENEATH, buf, 0) != 0:
            raise _fail(f"landlock_add_rule {path}")
    finally:
        os.close(target)


def _landlock(rules: Ruleset, version: int) -> None:
    handled = _handled_fs(version)
    net = _NET_TCP if version >= 4 and not rules.network else 0
    scoped = _SCOPES if version >= 6 and not rules.network else 0
    attr = struct.pack("=QQQ", handled, net, scoped)
    size = 8 if version < 4 else (16 if version < 6 else 24)
    buf = ctypes.create_string_buffer(attr[:size], size)
    fd = int(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, size, 0))
    if fd < 0:
        raise _fail("landlock_create_ruleset")
    try:
        read = EXECUTE | READ_FILE | READ_DIR
        write = handled & ~(MAKE_CHAR | MAKE_BLOCK)
        for path in rules.read:
            _add_path(fd, path, read, handled)
        for path in rules.write:
            _add_path(fd, path, write, handled)
        for path in rules.devices:
            _add_path(fd, path, READ_FILE | WRITE_FILE | IOCTL_DEV, handled)
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(fd)


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW = 0x7FFF0000
_RET_EACCES = 0x00050000 | errno.EACCES


def _close_network() -> None:
    """Install the seccomp filter of the module docstring (``no_new_privs`` is already set)."""
    prog = b"".join(
        [
            _bpf(_LD_W_ABS, 0, 0, 4),  # arch
            _bpf(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
            _bpf(_RET_K, 0, 0, _RET_EACCES),
            _bpf(_LD_W_ABS, 0, 0, 0),  # syscall number
            _bpf(_JGE_K, 3, 0, 0x40000000),  # x32
            _bpf(_JEQ_K, 2, 0, SYS_SOCKET),
            _bpf(_JEQ_K, 1, 0, SYS_IO_URING_SETUP),
            _bpf(_RET_K, 0, 0, _RET_ALLOW),
            _bpf(_RET_K, 0, 0, _RET_EACCES),
        ]
    )
    filt = ctypes.create_string_buffer(prog, len(prog))
    fprog = struct.pack("=HxxxxxxQ", len(prog) // 8, ctypes.addressof(filt))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if _libc.syscall(SYS_SECCOMP, 1, 0, fbuf) != 0:  # SECCOMP_SET_MODE_FILTER
        raise _fail("seccomp")


def limit_files(nofile: int) -> None:
    """Lower this process's open-file soft limit to ``nofile`` (never raise it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))


_entered: list[Ruleset] = []
"""The rulesets this process entered (stacked Landlock layers narrow, never widen)."""


def enter(rules: Ruleset | None) -> bool:
    """Confine the calling thread and everything it starts to ``rules`` (None: nothing). A
    ruleset already entered is not entered twice. Returns whether the thread is confined.
    Raises :class:`ConfinementFailed` when the kernel refuses (no Landlock, say)."""
    if rules is None:
        return bool(_entered)
    if rules in _entered:
        return True
    version = abi()
    if version < 1:
        raise ConfinementFailed(errno.ENOSYS, "this kernel has no Landlock")
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
    _landlock(rules, version)
    if not rules.network and network_closable():
        _close_network()
    _entered.append(rules)
    return True


def enter_sandbox(sandbox: Sandbox | None, grants: Grants) -> bool:
    """Confine this thread to the kernel rules of ``sandbox`` narrowed by ``grants`` (nothing
    for None or full-access) and cap its open files; returns whether it is confined."""
    rules = ruleset(sandbox, grants, python=python_paths() + path_dirs(), etc=etc_entries())
    if rules is None:
        return enter(None)
    limit_files(MAX_OPEN_FILES)
    return enter(rules)


__all__ = ["ConfinementFailed", "abi", "enter", "enter_sandbox", "limit_files", "network_closable"]
