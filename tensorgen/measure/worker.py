"""Persistent Python worker processes (running `tensorgen.measure.worker.main`) that run picklable calls.

Why not multiprocessing: fork is unsafe once the parent holds OpenMP or other threads, and spawn re-imports
the caller's `__main__`, which breaks every script without an `if __name__ == "__main__"` guard. A worker
started with `-m` imports only what the calls need. Each call has a timeout; a worker that hangs is killed,
one that dies is noticed at once (end of its pipe), and either is replaced on its next call.

A worker dies with its parent, even one killed by SIGKILL (`die_with_parent`: the kernel's parent-death
signal, and the end of its input pipe as the fallback), and ignores SIGINT: Ctrl-C reaches the whole
process group, and the parent alone decides what it means.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from tensorgen.errors import TensorgenError

_HEADER = struct.Struct("<Q")


class WorkerFailure(TensorgenError):
    """Base of the ways a call to a worker can fail without returning."""


class WorkerDied(WorkerFailure):
    """The worker process exited (crash, signal, os._exit) during a call."""


class WorkerTimeout(WorkerFailure):
    """The call ran past its timeout; the worker was killed."""


class WorkerError(WorkerFailure):
    """The call raised in the worker; the message is the remote traceback."""


def describe_exit(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _send(f: IO[bytes], obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(data)) + data)
    f.flush()


def _recv_blocking(f: IO[bytes]) -> bytes | None:
    head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(head)
    return f.read(n)


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Make this (child) process get SIGKILL when its parent dies, ignore SIGINT (the parent handles Ctrl-C) and
    end at SIGTERM whatever handler a forked child inherited (the parent's turns it into an interrupt).

    The parent-death signal is Linux's prctl(PR_SET_PDEATHSIG); elsewhere the caller's end-of-pipe check is
    the only way out. If `parent` is already gone (it died before the call), exit at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


def main(parent: int | None = None) -> None:
    """Worker loop: run (fn, args) calls from stdin, reply on stdout, until stdin closes (the parent closed it,
    or died)."""
    if parent is not None:
        die_with_parent(parent)
    inp, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from calls go to stderr, never into the result pipe
    sys.stdout = sys.stderr
    while (msg := _recv_blocking(inp)) is not None:
        try:
            fn, args = pickle.loads(msg)
            reply: tuple[str, Any] = ("ok", fn(*args))
        except Exception:
            reply = ("error", traceback.format_exc())
        _send(out, reply)


@dataclass
class PopenWorker:
    """One worker process, started lazily and restarted after it dies or is killed."""

    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> None:
        # the parent's sys.path, so functions it can import (tensorgen itself, test hooks) unpickle here too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        code = f"from tensorgen.measure.worker import main; main({os.getpid()})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, start_new_session=True)  # Ctrl-C at the terminal is the parent's

    def call(self, fn: Callable, args: Sequence, timeout: float | None) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            _send(self.proc.stdin, (fn, tuple(args)))
        except BrokenPipeError as exc:
            raise self._died() from exc
        deadline = None if timeout is None else time.monotonic() + timeout
        (n,) = _HEADER.unpack(self._read(_HEADER.size, deadline, timeout))
        status, value = pickle.loads(self._read(n, deadline, timeout))
        if status == "error":
            raise WorkerError(value)
        return value

    def _read(self, n: int, deadline: float | None, timeout: float | None) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        fd, buf = self.proc.stdout.fileno(), bytearray()
        while len(buf) < n:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                self.kill()
                raise WorkerTimeout(f"call ran past {timeout}s; worker killed")
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise self._died()
            buf += chunk
        return bytes(buf)

    def _died(self) -> WorkerDied:
        assert self.proc is not None
        rc = self.proc.wait()
        self.kill()
        return WorkerDied(f"worker process died ({describe_exit(rc)})")

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()

    def interrupt(self) -> None:
        """Kill the process from another thread; the thread in `call` sees it die and cleans up."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def close(self) -> None:
        """Let the worker exit on end of input; kill it if it does not within a second."""
        if self.proc is not None and self.proc.stdin is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=1.0)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass  # killed below
        self.kill()


@dataclass(frozen=True)
class Outcome:
    """A call's return value, or the WorkerFailure that stopped it, and its wall time."""

    value: Any = None
    error: WorkerFailure | None = None
    seconds: float = 0.0


@dataclass
class WorkerPool:
    """`size` PopenWorkers fed by a thread each; `map` keeps input order."""

    size: int
    _idle: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, init=False, repr=False)
    _all: list[PopenWorker] = field(default_factory=list, init=False, repr=False)
    _threads: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._all = [PopenWorker() for _ in range(max(1, self.size))]
        for w in self._all:
            self._idle.put(w)
        self._threads = ThreadPoolExecutor(max_workers=len(self._all), thread_name_prefix="tensorgen-worker")

    def _one(self, fn: Callable, args: Sequence, timeout: float | None) -> Outcome:
        worker = self._idle.get()
        start = time.perf_counter()
        try:
            return Outcome(worker.call(fn, args, timeout), seconds=time.perf_counter() - start)
        except WorkerFailure as exc:
            return Outcome(error=exc, seconds=time.perf_counter() - start)
        finally:
            self._idle.put(worker)

    def map(self, fn: Callable, arg_lists: Sequence[Sequence], timeout: float | None) -> list[Outcome]:
        if self._threads is None:
            raise RuntimeError("WorkerPool is closed")
        futures = [self._threads.submit(self._one, fn, args, timeout) for args in arg_lists]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the workers; calls still running (the caller was interrupted) are cut short, not waited for."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            idle = []
            while not self._idle.empty():
                idle.append(self._idle.get())
            for w in self._all:
                if not any(w is i for i in idle):
                    w.interrupt()
            self._threads.shutdown(wait=True)
            self._threads = None
        for w in self._all:
            w.close()

