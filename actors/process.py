"""Child processes of the control process: how shell hosts and workers are started, watched,
killed and cancelled.

Process start (measured on the 2-core dev box: start a real host, restore an empty scope, run
``1``, read the result; 11 starts after a warm-up, median/worst): forkserver with the ral modules
preloaded **10.2 / 28.9 ms**, spawn 76.5 / 80.3 ms. Plain fork is unsafe here: the control
process runs pykka threads. So every host and worker starts from one preloaded fork server
(:func:`process_context`), without re-importing ``__main__`` (:class:`_NoMainPopen`).

Invariants:

- A child makes itself a process-group leader first thing (:func:`become_group_leader`), and
  every external program it starts dies with it (``PR_SET_PDEATHSIG``) and is announced to the
  control side (:func:`report_programs`); the child is a child subreaper, so whatever its
  programs leave running, detached or not, stays its descendant and dies with it
  (``actors/descendants.py``). :meth:`ChildProcess.kill` leaves nothing running.
- No fork-server child holds a credential: the fork server (and so every host, worker and
  agent process forked from it) starts with the secrets of :func:`keep_secrets_from_forks`'s
  policy out of its environment (``runtime/credentials.py``); an agent process gets its key
  in its provider object, never from the environment.
- Nothing outlives the control process, however it ends (:func:`die_with_parent`): the fork
  server exits when the control process's end of its ``alive`` pipe closes, every host and
  worker dies with the fork server, and multiprocessing's resource tracker exits once the last
  of them has closed its pipe.
- A child has two channels: data, and the **control path**, which carries only ``cancel`` frames
  and is read by :class:`CancelListener` in its own thread, so a run in flight can be cancelled
  while the child's main thread is busy evaluating.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import math
import multiprocessing
import os
import resource
import select
import signal
import socket
import threading
import weakref
from collections.abc import Callable
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing import process as mp_process
from multiprocessing.connection import wait
from multiprocessing.context import BaseContext, ForkServerProcess, set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any

import psutil

from exarch_actors.actors.descendants import (
    become_subreaper,
    end_descendants,
    freeze_descendants,
    reap_adopted,
)
from exarch_actors.actors.frames import Channel, ChannelClosed, FrameError
from exarch_actors.actors.priority import to_idle_class
from exarch_actors.actors.process_identity import HAS_PROC, create_time, kill_program, start_ticks
from exarch_actors.runtime.cancel import POLL_INTERVAL
from exarch_actors.runtime.credentials import DEFAULT as DEFAULT_SECRETS
from exarch_actors.runtime.credentials import SecretPolicy

PRELOAD = [
    "exarch_actors.actors.shell_host",
    "exarch_actors.actors.worker_process",
    "exarch_actors.actors.agent_host",
    "exarch_actors.actors.agent_process",
    "exarch_actors.actors.agent_process_host",
    "exarch_actors.runtime.providers.scripted",
    "exarch_actors.runtime.ral.session",
    "exarch_actors.runtime.ral.codec",
    "exarch_actors.actors.fork_guard",
    "exarch_actors.actors.fork_warm",
]
"""Modules the fork server imports once, so a new host or worker starts warm (the last one
fills the caches an agent process would fill after its fork and freezes the GC:
``actors/fork_warm.py``; ``actors/fork_guard.py`` keeps a request its client abandoned from
ending the fork server). An import error here is silent (the stdlib's fork server skips the
module), so ``tests/agent_host/test_spawn_path.py`` checks what a child inherits."""


def preload_names() -> list[str]:
    """:data:`PRELOAD`, the long names by which every process imports them."""
    return list(PRELOAD)


_ctx_lock = threading.Lock()
_ctx: BaseContext | None = None


_stdlib_flags = util._args_from_interpreter_flags  # type: ignore[attr-defined]


def _flags_without_cwd() -> list[str]:
    """The interpreter flags the stdlib gives a helper interpreter it starts with ``-c`` (the
    fork server, the resource tracker), plus ``-P``: without it the helper's ``sys.path``
    starts with the working directory, and a file there named like a standard module
    (``inspect.py``, ``signal.py``) replaced that module in the fork server and in every
    process forked from it: a run started from such a directory ended in a traceback
    ("cannot start: unexpected EOF"). The command itself is found through its installation,
    never through the working directory."""
    args: list[str] = _stdlib_flags()
    return args if "-P" in args or "-I" in args else [*args, "-P"]


def process_context() -> BaseContext:
    """The forkserver context with :data:`PRELOAD` set (once per control process), its
    helpers started without the working directory on their path (:func:`_flags_without_cwd`;
    multiprocessing's own hook for their flags, private to CPython 3.8-3.13 like
    :func:`use_fork_server`'s)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            util._args_from_interpreter_flags = _flags_without_cwd  # type: ignore[attr-defined]
            util.spawnv_passfds = _spawn_without_secrets
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(preload_names())
            _ctx = ctx
        return _ctx


_stdlib_spawnv = util.spawnv_passfds
_fork_secrets: SecretPolicy = DEFAULT_SECRETS
_env_lock = threading.Lock()


def keep_secrets_from_forks(policy: SecretPolicy) -> None:
    """Start the fork server (if it is not running yet) without ``policy``'s secrets in its
    environment, and so every process forked from it: a shell host's ``/proc/PID/environ``
    (which any program it runs can read) is the fork server's. The fork server of a process
    starts once; a later policy applies to the shells' environments (``Fleet``), not to it."""
    global _fork_secrets
    with _env_lock:
        _fork_secrets = policy
    mask_proc_secrets(policy)


MIN_MASKED = 8
"""Shorter values are not masked: replacing them could change unrelated entries of the block."""


def mask_proc_secrets(policy: SecretPolicy) -> None:
    """Overwrite, in this process's own memory, every secret value of its initial environment
    and command line with ``*``: what ``/proc/PID/environ`` and ``/proc/PID/cmdline`` show any
    process of the user -- a confined program included (Landlock's ptrace scoping refuses it
    ``/proc/PID/mem`` but not ``environ``; tests/shell/test_escapes.py). Python's ``os.environ``
    and ``sys.argv`` are copies made at start, so the provider still finds its key. Off Linux,
    or where ``/proc/self/mem`` cannot be written, nothing happens."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # fields after the command name start at field 3; arg_start..env_end are 48..51
        arg_start, arg_end, env_start, env_end = (int(fields[n - 3]) for n in (48, 49, 50, 51))
        found = {os.environ.get(k, "") for k in policy.secret_names(os.environ)}
        values = {v.encode() for v in found | set(policy.values) if len(v) >= MIN_MASKED}
        if not values:
            return
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end in ((arg_start, arg_end), (env_start, env_end)):
                mem.seek(start)
                block = mem.read(end - start)
                masked = block
                for v in values:
                    masked = masked.replace(v, b"*" * len(v))
                if masked != block:
                    mem.seek(start)
                    mem.write(masked)
    except (OSError, ValueError, IndexError):
        pass


def _spawn_without_secrets(path: Any, args: Any, passfds: Any) -> int:
    """``util.spawnv_passfds`` (how the stdlib starts the fork server and its resource tracker,
    with this process's C environment) run with the secrets out of that environment: each is
    unset for the call and put back after it, under a lock, so this process's own
    ``os.environ`` never changes."""
    with _env_lock:
        hidden = {k: os.environ[k] for k in _fork_secrets.secret_names(os.environ)}
        for name in hidden:
            os.unsetenv(name)
        try:
            pid: int = _stdlib_spawnv(path, args, passfds)
        finally:
            for name, value in hidden.items():
                os.putenv(name, value)
        return pid


class _NoMainPopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` without re-importing ``__main__`` in the child.

    Every target here lives in an importable module, so the child never needs the parent's main
    script; the stdlib would otherwise re-run it in each new host (under pytest that imports
    pytest; under an unguarded script it raises the "bootstrapping phase" error). The body is
    the stdlib's ``_launch`` (CPython 3.11) with the two main-module keys dropped.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(
            self,
            util.close_fds,  # type: ignore[attr-defined]
            (_parent_w, self.sentinel),
        )
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _NoMainPopen(process_obj)


def ensure_fork_server() -> None:
    """Start the fork server (and multiprocessing's resource tracker) now rather than at the
    first shell. Test suites call this from a session fixture so the long-lived helper
    processes are not mistaken for a test's leak."""
    process_context()
    forkserver.ensure_running()


def fork_server_address() -> str:
    """The address of this control process's fork server (started if need be), for
    :func:`use_fork_server` in an agent host."""
    ensure_fork_server()
    address = getattr(forkserver._forkserver, "_forkserver_address", None)
    if not isinstance(address, str):
        raise RuntimeError("the fork server has no address")
    return address


def use_fork_server(address: str) -> None:
    """In an agent host (a fork-server child): start every later process from the control
    process's one fork server at ``address`` instead of a fork server of its own.

    A fork-server child does not know its server's address (the stdlib keeps it in the client
    only), and left alone would start a second fork server -- re-importing :data:`PRELOAD`, and
    forking from a process that by then runs threads. The stdlib client needs three things: the
    address; an "alive" fd to hand each new child (the child only closes it, see
    :func:`die_with_parent`; a ``/dev/null`` fd stands in, as this host must not keep the fork
    server alive); and no attempt to (re)start the server, which it would do because it is not
    this process's child. The resource tracker's fd is inherited and reused as is. Private to
    CPython's forkserver (3.8-3.13), like :func:`die_with_parent`.
    """
    server: Any = forkserver._forkserver
    with server._lock:
        server._forkserver_address = address
        server._forkserver_alive_fd = os.open(os.devnull, os.O_RDONLY)
    server.ensure_running = lambda: None


def start_process(target: Callable[..., Any], args: tuple[Any, ...], *, name: str) -> BaseProcess:
    """Start ``target(*args)`` in a new process from the preloaded fork server (a daemon:
    terminated if the control process exits normally first, :func:`_end_started`).

    The process is kept out of ``multiprocessing``'s own list of children: each start polls
    every child on that list (``multiprocessing.process._cleanup``, a selector built per
    child), so a spawn cost time in proportion to the agents alive -- with hundreds live, most
    of a spawn's control-side time (issue 33, docs/benchmarks.md)."""
    proc = _Process(target=target, args=args, name=name, daemon=True)
    proc.start()
    mp_process._children.discard(proc)  # type: ignore[attr-defined]
    _STARTED.add(proc)
    return proc


_STARTED: weakref.WeakSet[BaseProcess] = weakref.WeakSet()
"""Every process :func:`start_process` started and still holds a handle on."""


@atexit.register
def _end_started() -> None:
    """What the stdlib does at exit for the children on its list, for the ones kept off it:
    terminate a daemon still running, then join it (its end of file and ``PR_SET_PDEATHSIG``
    end it in any case once the fork server goes)."""
    started = [p for p in list(_STARTED) if p.exitcode is None]
    for proc in started:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in started:
        with contextlib.suppress(Exception):
            proc.join(1.0)


# -- the control side's handle on one child process ------------------------------------------


class ChildProcess:
    """A host or worker process with its data and cancel channels (control side).

    The child makes itself a process-group leader first thing, so :meth:`kill` takes down the
    external programs it started too (a SIGKILLed evaluator cannot kill them itself).
    """

    def __init__(
        self, target: Callable[..., Any], *, name: str, memory_bytes: int | None = None
    ) -> None:
        """``target(data, ctl, memory_bytes)`` runs in the child; it applies ``memory_bytes``
        with :func:`limit_memory` before anything else."""
        ctx = process_context()
        data_here, data_there = ctx.Pipe(duplex=True)
        ctl_here, ctl_there = ctx.Pipe(duplex=True)
        self.data = Channel(data_here)
        self.ctl = Channel(ctl_here)
        self.proc: BaseProcess = _Process(
            target=target, args=(data_there, ctl_there, memory_bytes), name=name, daemon=True
        )
        self.proc.start()
        data_there.close()
        ctl_there.close()
        self.pid: int = self.proc.pid or 0
        # read now, off any cancel path: the first call result needs it, and a sleeper's first
        # result is its cancelled one (read lazily there, psutil cost 0.15-0.3 ms of the
        # 100-agent cascade per agent; this read is ~13 us warm)
        self._started_at: float | None = create_time(self.pid)
        self._known: dict[int, int | psutil.Process] = {}
        """Programs the child started: pid -> its identity (:func:`start_ticks`; a
        ``psutil.Process`` where there is no ``/proc``)."""
        self._signalled = False
        """A SIGKILL went to the live child, its group and its programs (:meth:`kill`)."""
        self._pollers: dict[tuple[Any, ...], tuple[select.poll, dict[int, Any]]] = {}

    @property
    def sentinel(self) -> int:
        return self.proc.sentinel

    @property
    def started_at(self) -> float | None:
        """The child's create time as ``psutil`` reports it (:func:`create_time`), read at the
        start (or, if that failed, once here; None if it is gone)."""
        if self._started_at is None:
            self._started_at = create_time(self.pid)
        return self._started_at

    def alive(self) -> bool:
        return self.proc.exitcode is None and self.proc.is_alive()

    def wait_frame(self, timeout: float | None, extra: tuple[Any, ...] = ()) -> list[Any]:
        """Block until the data channel is readable, the process exits, or an ``extra`` object
        (anything with ``fileno``) is readable. Returns the ready objects.

        One ``poll`` object per set of objects, kept for the life of the handle: the stdlib's
        ``multiprocessing.connection.wait`` builds and registers a selector on every call, a
        measurable share of a trivial call's round trip."""
        if self.data.has_frame():  # read already, with the frame before it
            return [self.data.conn]
        got = self._pollers.get(extra)
        if got is None:
            poller, by_fd = select.poll(), {}
            for obj in (self.data.conn, self.proc.sentinel, *extra):
                fd = obj if isinstance(obj, int) else obj.fileno()
                poller.register(fd, select.POLLIN)
                by_fd[fd] = obj
            got = self._pollers[extra] = (poller, by_fd)
        poller, by_fd = got
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        while True:
            try:
                events = poller.poll(ms)
            except InterruptedError:  # PEP 475 retries, but keep the contract explicit
                continue
            return [by_fd[fd] for fd, _ in events if fd in by_fd]

    def adopt_program(self, pid: int) -> None:
        """Remember an external program the child started (reported by a ``notice`` frame).

        The ral evaluator starts each program in a new session (so a cancel can kill its whole
        group), which also takes it out of the child's group: a SIGKILLed host would orphan it.
        The child reports every program the moment it starts (:func:`report_programs`), so a
        rollback can kill what the dead host left running.
        """
        if pid in self._known:
            return
        ticks = start_ticks(pid)
        if ticks is not None:
            self._known[pid] = ticks
        elif not HAS_PROC:
            try:
                self._known[pid] = psutil.Process(pid)
            except psutil.Error:
                pass  # already gone
        # else already gone

    def note_children(self) -> None:
        """Stop and adopt every descendant of the live child, about to be killed: a program
        that detached (``setsid``) is the child's own child (it is a subreaper) or a
        descendant of one (:func:`actors.descendants.freeze_descendants`)."""
        for pid in freeze_descendants(self.pid):
            self.adopt_program(pid)

    def kill(self) -> None:
        """SIGKILL the child, its process group and every program it started; idempotent.

        A child whose exit is known is not signalled itself (it is gone, and its pid may be
        reused); its group and its programs still are: they may outlive it."""
        if self._signalled:
            return
        self._kill(self._wait_exit(0) is not None)

    def _kill(self, exited: bool) -> None:
        if not exited:
            with contextlib.suppress(OSError):  # it starts nothing more while it is walked
                os.kill(self.pid, signal.SIGSTOP)
            self.note_children()
        for pid in (self.pid, *self._known):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        for pid, identity in list(self._known.items()):  # a terminal cancel's thread too
            kill_program(pid, identity)
        if exited:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        # A SIGKILLed process starts nothing more (a fork racing the signal fails), so what
        # it and its group could run was killed just now: a later kill() has nothing to do
        # (an ended agent's host was killed by its terminal cancel, then again at its end:
        # the /proc reads of note_children and the exit poll twice, ~0.2 ms each).
        self._signalled = True

    def kill_behind(self) -> None:
        """:meth:`kill` the child after moving its main thread to the idle class
        (:func:`to_idle_class`). A SIGKILLed process runs no instruction of its own again,
        but the kernel's reclaim of its memory runs in its name and at its priority: for a
        shell host, unmapping what it inherited from the fork server, 0.7-0.8 ms of CPU each
        (perf, 100-agent cascade), which at the agents' nice took its share of the cores from
        the agents still ending. At nice 19 it still took ~30 % of a core against an ending
        agent at nice 15 (weights 15 against 36): 55-82 ms of reclaim inside the
        cascade's window. The main thread is the one that usually unmaps the memory (the last
        to leave it); demoting every thread made the fork server's reap wait on the ``/proc``
        entries that a demoted thread was freeing as it left (its ``wait4``, 16 -> 129 ms of
        CPU a cascade). Reap it afterwards (:meth:`reap`); the idle class only defers, never
        starves it (its weight is 3 against a nice-0 thread's 1,024)."""
        if self._signalled:
            return
        exited = self._wait_exit(0) is not None  # not ``exitcode``: a selector built per call
        if not exited:
            to_idle_class(self.pid)
        self._kill(exited)

    def reap(self, grace: float = 2.0) -> int | None:
        """Close the channels and join the process, killing it if it outlives ``grace``."""
        exited = self._wait_exit(grace) is not None
        # kill() also takes down programs a dead host left behind (SIGKILL, os._exit)
        self.kill()
        if not exited:
            self.proc.join(5.0)
        self.data.close()
        self.ctl.close()
        code = self.proc.exitcode
        try:
            self.proc.close()
        except ValueError:
            pass
        return code

    def _wait_exit(self, timeout: float) -> int | None:
        """The child's exit code, waiting up to ``timeout`` for it with one ``poll`` of its
        sentinel; None if it still runs. What ``Process.join`` does (the stdlib's
        ``popen_forkserver`` reads the code the fork server writes to the sentinel), without
        building and registering a selector twice (join, then its poll): 0.4 ms of an agent's
        end in the 100-agent cascade (yappi, CPU clock)."""
        popen = getattr(self.proc, "_popen", None)
        if not isinstance(popen, popen_forkserver.Popen):
            self.proc.join(timeout)
            return self.proc.exitcode
        if popen.returncode is None:
            poller = select.poll()
            poller.register(popen.sentinel, select.POLLIN)
            if not poller.poll(max(0, math.ceil(timeout * 1000))):
                return None
            try:
                popen.returncode = forkserver.read_signed(popen.sentinel)
            except (OSError, EOFError):  # as the stdlib's poll: the fork server itself is gone
                popen.returncode = 255
        code: int | None = popen.returncode
        return code


# -- shared by host and worker processes ----------------------------------------------------


def report_programs(data: Channel) -> None:
    """In a host or worker process: tie every external program's life to this process.

    Wraps ``subprocess.Popen`` for this process only (the evaluator looks it up at call time):

    - the program is started with ``PR_SET_PDEATHSIG = SIGKILL`` (Linux), so the kernel kills it
      the moment this process dies, however it dies -- no window in which a SIGKILLed host
      leaves it running;
    - it keeps this process's memory limit (``--shell-memory``, per program: a program that
      allocates past it gets ``ENOMEM``, which Python reports as ``MemoryError`` and C
      programs as a failed ``malloc``), so a memory bomb in a program stops there;
    - its pid is announced with a ``notice`` frame, so the control side can also kill the
      program's own process group (its children) at a rollback;
    - this process is made a child subreaper, so what a program leaves running when it
      detaches stays its descendant (killed with it: :func:`end_programs`), and the ones of
      those that exited are reaped before the next program starts (a zombie holds a pid).
    """
    import subprocess

    base = subprocess.Popen
    die_with_parent = _pdeathsig_setter()
    become_subreaper(_prctl())
    owned = _owned_programs

    def preexec() -> None:
        if die_with_parent is not None:
            die_with_parent()

    class _Reported(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("preexec_fn") is None:
                kwargs["preexec_fn"] = preexec
            reap_adopted(owned)
            super().__init__(*args, **kwargs)
            owned.add(self.pid)
            data.try_send("notice", program=self.pid)

    subprocess.Popen = _Reported  # type: ignore[misc]


_owned_programs: set[int] = set()
"""The programs this host or worker started through ``Popen`` (each reaped by its own
``Popen``): what :func:`actors.descendants.reap_adopted` leaves alone."""


def end_programs() -> None:
    """In a host or worker: kill everything its programs left running, detached or not (a
    cancelled call, the process's own end). Programs started through ``Popen`` are killed by
    their caller first, so all that is left here is what no one waits for."""
    end_descendants()
    _owned_programs.clear()


_PR_SET_PDEATHSIG = 1

_IMPORTED_IN = os.getpid()
"""The process that imported this module. The fork server imports it with :data:`PRELOAD`, so in
a host or worker forked from there it is the pid of the parent (the fork server)."""


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (None where there is none: not Linux)."""
    try:
        import ctypes

        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


_PRCTL = _load_prctl()
"""Loaded once, at import: the fork server imports this module with :data:`PRELOAD`, so every
host, worker and agent process inherits it. Loading it after each fork (``import ctypes`` and
``dlopen``) took 3-5 ms of a process agent's spawn, twice (agent process and shell host; cProfile
of 31 back-to-back spawns, load average ~40)."""


def _prctl() -> Callable[..., int] | None:
    return _PRCTL


def _pdeathsig_setter() -> Callable[[], None] | None:
    """A preexec function that makes the child die with this process (None off Linux).

    It only calls ``prctl`` and ``getppid`` (async-signal-safe system calls) in the forked
    child; the ``getppid`` check closes the race of the parent dying before ``prctl`` ran.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


def die_with_parent() -> None:
    """In a host or worker (a fork-server child): die with the control process, however it ends.

    The chain, SIGKILL of the control process included:

    1. the fork server exits at EOF of its ``alive`` pipe (multiprocessing's own watch). The
       stdlib hands every fork-server child a copy of the pipe's write end, which would keep
       the fork server alive for as long as any host lives -- a host spinning in C code, for
       ever -- so this child closes its copy: the control process is then the only writer;
    2. every host and worker, forked by the fork server's single thread, carries
       ``PR_SET_PDEATHSIG = SIGKILL`` and so dies with the fork server; every program they start
       carries the same (:func:`report_programs`);
    3. multiprocessing's resource tracker exits at EOF of its own pipe, once all of the above
       have closed it by dying.

    A kernel signal is needed because a host spinning in C code holds the GIL, so no thread of
    it could notice its pipes closing. The ``getppid`` check closes the race of the fork server
    dying before ``prctl`` ran. Off Linux (no ``prctl``) the fallback is the control path: its
    EOF cancels the run and the frame loop exits (:class:`CancelListener`), which needs a free
    GIL. A signal sent to the control process's whole process group (``timeout``, ``kill --
    -PGID``) also reaches the fork server (SIGINT excepted: it ignores it); its death then takes
    every host and worker with it, and the control side rolls each shell back on a fresh one.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getpid() != _IMPORTED_IN and os.getppid() != _IMPORTED_IN:
            os._exit(1)  # the fork server died before prctl took effect
    server = getattr(forkserver, "_forkserver", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None and os.getpid() != _IMPORTED_IN:
        # private to CPython's forkserver (3.8-3.13): this child never starts processes itself
        with contextlib.suppress(OSError):
            os.close(alive_fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]


def limit_memory(memory_bytes: int | None) -> None:
    """In a host or worker: cap its writable memory (``RLIMIT_DATA``, soft limit) at
    ``memory_bytes`` (None: leave it), so an allocation past it raises ``MemoryError`` in this
    process instead of growing it (see :mod:`runtime.shell.limits` for why this limit and its
    default). Programs started here keep it (:func:`report_programs`)."""
    if memory_bytes is None:
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        memory_bytes = min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, hard))


def become_group_leader() -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


class CancelListener:
    """Reads the control path in its own thread and cancels the run it names.

    ``cancel`` frames carry the run id they target (``None`` = whatever is in flight). Because a
    cancel may overtake the ``run`` frame it targets, a cancel for a run not yet started is
    remembered and applied when that run begins; while the targeted run is in flight the
    listener re-trips ``session.cancel`` every poll interval, closing the window between a run
    starting and its scope existing. Between cancels the thread blocks (no idle wake-ups: a
    host costs nothing while its agent thinks).

    A cancel is applied under the lock that :meth:`begin` and :meth:`end` take, in the same
    hold as the decision that it hits the run in flight: applied after releasing it, a cancel
    decided for run N could land once the main thread had ended N and begun N+1, and
    ``session.cancel`` (which trips whatever run is in flight) stopped N+1 instead. So the run
    a cancel hits is still the current one when it is tripped; ``begin``/``end`` wait for it.
    """

    def __init__(self, ctl: Channel, cancel: Callable[[str], None]) -> None:
        self._ctl = ctl
        self._cancel = cancel
        self._lock = threading.Lock()
        self._current: int | None = None
        self._max_cancelled = -1
        self._reason = "cancelled"
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.event = threading.Event()
        """Set while the current run is cancelled; enquiry waits poll it."""
        self.peer_gone = threading.Event()
        threading.Thread(target=self._loop, name="cancel-listener", daemon=True).start()

    def begin(self, run_id: int) -> None:
        with self._lock:
            self._current = run_id
            pending = run_id <= self._max_cancelled
            if pending:
                self.event.set()
            elif self.event.is_set():  # clear() takes the Event's condition: ~3 us a call
                self.event.clear()
        if pending:
            self._cancel(self._reason)
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")  # the listener starts re-tripping this run

    def end(self) -> None:
        with self._lock:
            self._current = None
            if self.event.is_set():
                self.event.clear()

    def _live(self) -> bool:
        with self._lock:
            return self._current is not None and self.event.is_set()

    def _loop(self) -> None:
        while True:
            live = self._live()
            if self._ctl.has_frame():  # a second cancel read with the first
                ready: list[Any] = [self._ctl.conn]
            else:
                ready = wait([self._ctl.conn, self._wake_r], POLL_INTERVAL if live else None)
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            if self._ctl.conn not in ready:
                with self._lock:  # re-trip the run in flight, never its successor
                    if self._current is not None and self.event.is_set():
                        self._cancel(self._reason)
                continue
            try:
                frame = self._ctl.recv()
            except ChannelClosed:
                self.peer_gone.set()
                with self._lock:
                    self._reason = "control side gone"
                    self.event.set()
                    self._cancel(self._reason)
                return
            except FrameError:
                # An undecodable frame names no run, so there is nothing it could cancel; the
                # next well-formed frame (or the channel closing) is still acted on.
                continue
            if frame.kind != "cancel":
                continue
            target = frame.get("run")
            reason = str(frame.get("reason") or "cancelled")
            with self._lock:
                self._reason = reason
                if target is None:
                    hit = self._current is not None
                else:
                    self._max_cancelled = max(self._max_cancelled, int(target))
                    hit = self._current is not None and self._current <= int(target)
                if hit:
                    self.event.set()
                    self._cancel(reason)  # under the lock: the run it hit is still current
