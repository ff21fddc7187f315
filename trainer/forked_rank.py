"""A rank started as a fork of torchrun's agent, not as a new interpreter (launch.py, repair 6).

torchrun starts each rank as `python -u -m MODULE ARGS` (or `python -u SCRIPT ARGS`): a new
interpreter that imports PyTorch again, at every start and at every restart a membership change
brings, though the agent that starts it has imported PyTorch already. That import is most of
a rank's start (1-3.5 CPU-seconds and some 200 MB on a CPU machine, before the rank reads its
first byte). Here a rank is a fork of the agent that then does what that interpreter would:

- its own session (torchrun's `start_new_session`), its output where torchrun sends it,
  unbuffered as `-u` makes it, its environment and working folder, and the import path a new
  interpreter has;
- its thread count from its own environment, as PyTorch takes it;
- every signal's handler as a new interpreter has it (the agent's stop handler is not the
  rank's); the agent's exit work dropped (`multiprocessing`'s finalizers and children) and
  what must differ between processes drawn anew (`multiprocessing`'s key, numpy's global
  generator; Python's `random` reseeds itself at a fork);
- the module or script run as `__main__` with its arguments (`runpy`, as `python` does);
- at its end what an interpreter does at exit: non-daemon threads joined, `atexit` handlers
  run, output flushed; the status it would give (an exception's 1, `sys.exit`'s code, an
  interrupt's SIGINT).

Nothing of the agent's state reaches the rank but modules it imported and their own import-time
state, which a new interpreter importing them would hold too (their `atexit` handlers run at
the rank's end: PyTorch's, which the rank's own import would have registered), and the agent's
open descriptors, as with any fork: Python opens its own close-on-exec, so the rank's own
subprocesses do not get them, and closing them here would let a stale object's finalizer close
a descriptor the rank has reused.

`python` with other options starts a new interpreter as before, and so does a fork of an agent
that has asked CUDA anything (a fork cannot use CUDA then): it becomes that interpreter at once
(`exec`), in its own session and with its output, environment and folder already set.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any, NamedTuple

FRESH_SYS_PATH = list(sys.path)
"""The import path the agent's interpreter started with (its own first entry, which a rank's
replaces, then PYTHONPATH's and the installation's), taken before anything could add to it."""


class Entry(NamedTuple):
    """What a rank's `python -u` runs."""

    module: bool
    """True for `-m MODULE`, False for a script's path."""
    target: str
    arguments: list[str]

    def command(self) -> list[str]:
        return [sys.executable, "-u", *(["-m"] if self.module else []), self.target,
                *self.arguments]  # fmt: skip


def entry_of(command: tuple[str, ...]) -> Entry | None:
    """What `command` runs when it is the `python -u -m MODULE ARGS` or `python -u SCRIPT ARGS`
    torchrun builds, with this interpreter; None for anything else."""
    if len(command) < 3 or command[0] != sys.executable or command[1] != "-u":
        return None
    if command[2] == "-m":
        return Entry(True, command[3], list(command[4:])) if len(command) >= 4 else None
    if command[2].startswith("-"):
        return None
    return Entry(False, command[2], list(command[3:]))


class ForkedRank(subprocess.Popen):  # type: ignore[type-arg]
    """`subprocess.Popen` whose child is this process forked, running `entry` as `python -u`
    would in itself; waiting, polling and signalling it are Popen's own."""

    def __init__(self, entry: Entry, **popen: Any) -> None:
        self._entry = entry
        super().__init__(entry.command(), **popen)

    def _execute_child(  # Popen's own signature
        self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any, pass_fds: Any,
        cwd: Any, env: Any, startupinfo: Any, creationflags: Any, shell: Any,
        p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int, errread: int, errwrite: int,
        *rest: Any,
    ) -> None:  # fmt: skip
        start_new_session = rest[5]  # restore_signals, gid, gids, uid, umask, start_new_session
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child writes the agent's pending output again
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                status = _become_the_rank(
                    self._entry, env=env, cwd=cwd, stdin=p2cread,
                    stdout=c2pwrite, stderr=errwrite, new_session=start_new_session,
                )  # fmt: skip
            except BaseException:  # before its code ran: say why, as an interpreter would
                import traceback

                traceback.print_exc()
            finally:
                os._exit(status)  # never back into the agent's code
        self.pid = pid
        self._child_created = True


def _become_the_rank(
    entry: Entry, *, env: dict[str, str] | None, cwd: str | None,
    stdin: int, stdout: int, stderr: int, new_session: bool,
) -> int:  # fmt: skip
    import multiprocessing.process
    import multiprocessing.util

    if new_session:
        os.setsid()
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        if fd != -1:
            os.dup2(fd, target)
    if cwd is not None:
        os.chdir(cwd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if _cuda_unusable_in_a_fork():  # the interpreter torchrun would have started, in this process
        os.execv(sys.executable, entry.command())
    _threads_as_a_new_interpreter_takes_them()
    _default_signal_handlers()
    multiprocessing.util._finalizer_registry.clear()  # the agent's, as multiprocessing's own fork
    multiprocessing.process._children.clear()  # start does for its children
    multiprocessing.current_process().authkey = os.urandom(32)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    _unbuffered_stdio()
    # First on the path: the working folder for `-m`, the script's own folder for a script.
    first = os.getcwd() if entry.module else os.path.dirname(os.path.realpath(entry.target))
    sys.path[:] = [first, *FRESH_SYS_PATH[1:]]
    sys.argv = [entry.target, *entry.arguments]  # run_module puts the module's file first
    return _run_as_main(entry)


def _run_as_main(entry: Entry) -> int:
    import atexit
    import runpy
    import threading
    import traceback

    cannot_open = _what_python_cannot_open(entry)
    if cannot_open is not None:  # python's own one line, not a traceback through this module
        print(f"{sys.executable}: {cannot_open[0]}", file=sys.stderr)
        return cannot_open[1]
    status: int = 0
    interrupted = False
    try:
        if entry.module:
            runpy.run_module(entry.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(entry.target, run_name="__main__")
    except SystemExit as leaving:
        status = _exit_status(leaving.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    # What an interpreter does at its end, in its order.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream
            stream.flush()
    if interrupted:  # an interpreter ends an unhandled interrupt by SIGINT's own death
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


def _what_python_cannot_open(entry: Entry) -> tuple[str, int] | None:
    """(python's message, its exit status) when the module or script is not there, or cannot
    be run: a package or a folder without a `__main__`."""
    if not entry.module:
        path = os.path.join(os.getcwd(), entry.target)  # as python names it: joined, not resolved
        if os.path.isfile(entry.target):
            return None
        if os.path.isdir(entry.target):
            if os.path.isfile(os.path.join(entry.target, "__main__.py")):
                return None
            return f"can't find '__main__' module in {path!r}", 1
        return f"can't open file {path!r}: [Errno 2] No such file or directory", 2
    spec = _spec_of(entry.target)
    if spec is None:
        return f"No module named {entry.target}", 1
    if spec.submodule_search_locations is not None and _spec_of(f"{entry.target}.__main__") is None:
        return (f"No module named {entry.target}.__main__; '{entry.target}' is a package and "
                "cannot be directly executed", 1)  # fmt: skip
    return None


def _spec_of(name: str) -> Any:
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except ImportError:  # its package is not there either
        return None


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _cuda_unusable_in_a_fork() -> bool:
    """Whether the agent asked CUDA anything before this fork (torchrun asks whether CUDA is
    available where it starts): a fork cannot use CUDA then, and PyTorch marks the child."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda._is_in_bad_fork())


def _threads_as_a_new_interpreter_takes_them() -> None:
    """PyTorch sizes its thread pool from OMP_NUM_THREADS (or MKL_NUM_THREADS) when it first
    uses it; the agent's pool was sized before torchrun set the ranks' (1 where a machine has
    several ranks), so the fork would keep every core a rank."""
    torch = sys.modules.get("torch")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(name, "")
        if torch is not None and value.isdigit() and int(value) > 0:
            torch.set_num_threads(int(value))
            return


def _default_signal_handlers() -> None:
    signal.set_wakeup_fd(-1)
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _unbuffered_stdio() -> None:
    import io

    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False), encoding=getattr(old, "encoding", None) or "utf-8",
            errors=errors, write_through=True,
        )  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
