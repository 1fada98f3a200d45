"""Build candidates (lower, render C, compile) in parallel worker processes, classifying every failure.

Workers are separate Python processes (see worker.py), so a candidate that hangs lowering or kills its
process costs only that candidate: the worker is killed or replaced and the others carry on.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from tensorgen.build import compile_state
from tensorgen.codegen.backend import Backend, backend_for
from tensorgen.errors import CompileError, LoweringError, ScheduleError, ToolchainError
from tensorgen.measure.harness import PRODUCER_C
from tensorgen.measure.types import BuildResult, ErrorKind, MeasureInput
from tensorgen.measure.worker import WorkerDied, WorkerPool, WorkerTimeout
from tensorgen.schedule.layout_rewrite import rewrite_layout

LOGGER = logging.getLogger("tensorgen.measure")

#: Name of the kernel in every candidate module, so the runner knows what to call.
KERNEL_NAME = "tg_candidate"
#: Seconds past `timeout` before a worker is killed; the compiler's own timeout should fire first.
_KILL_GRACE = 2.0

#: Build errors a broken environment causes too (a program's own are instantiation errors)
_MAYBE_ENVIRONMENT = frozenset({ErrorKind.COMPILE_ERROR, ErrorKind.COMPILE_TIMEOUT, ErrorKind.UNKNOWN})

#: What compilers and the OS say when the machine, not the program, stops a build
ENVIRONMENT_ERRORS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied",
                      "Cannot allocate memory")


def environment_error(message: str) -> str | None:
    """The ENVIRONMENT_ERRORS phrase in a build's message, if any."""
    return next((e for e in ENVIRONMENT_ERRORS if e in message), None)


SourceHook = Callable[[MeasureInput, str], str]


class Builder(Protocol):
    """Builds candidates into something a Runner can time; `close` (optional) stops what the builder started."""

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]: ...

    def close(self) -> None:
        return None


def build_candidate(inp: MeasureInput, timeout: float, source_hook: SourceHook | None = None) -> BuildResult:
    """Lower, render and compile one candidate; a bad candidate is returned with its error kind, not raised.

    `source_hook` (an importable module-level function) rewrites the C source before compiling; tests use
    it to inject broken code.
    """
    start = time.perf_counter()
    layouts: tuple = ()

    def result(kind: ErrorKind, msg: str, path: str | None = None, source: str = "") -> BuildResult:
        return BuildResult(path, source, kind, msg, time.perf_counter() - start, layouts)

    try:
        state, plans = rewrite_layout(inp.state)  # constants repacked as a model build will
        layouts = tuple(plans)
        edit = (lambda source: source_hook(inp, source)) if source_hook is not None else None
        backend = backend_for(inp.task.target, inp.task.hw)
        tail = "" if backend.binds_threads else PRODUCER_C  # a GPU's inputs are not in a CPU core's cache
        built = compile_state(state, backend, KERNEL_NAME, tail=tail, edit=edit,
                              deadline=start + timeout if timeout > 0 else None)
        return result(ErrorKind.NONE, "", str(built.path), built.source)
    except (ScheduleError, LoweringError) as exc:
        return result(ErrorKind.INSTANTIATION, f"{type(exc).__name__}: {exc}")
    except ToolchainError as exc:  # not the candidate's fault (LocalBuilder.build stops the run if it persists)
        return result(ErrorKind.UNKNOWN, str(exc), source=exc.source)
    except CompileError as exc:
        if environment_error(f"{exc}\n{exc.log}"):
            return result(ErrorKind.UNKNOWN, str(exc), source=exc.source)
        kind = ErrorKind.COMPILE_TIMEOUT if "timed out" in str(exc) else ErrorKind.COMPILE_ERROR
        return result(kind, str(exc), source=exc.source)
    except Exception:
        return result(ErrorKind.UNKNOWN, traceback.format_exc())


@dataclass
class LocalBuilder(Builder):
    """Builds candidates in `n_parallel` worker processes (default: one per CPU), `timeout` s each.

    Results come back in input order. Use as a context manager, or call `close()`, to stop the workers.
    A toolchain that cannot build a trivial kernel (see toolchain.preflight), checked before the first batch
    and again after a batch in which nothing compiled, raises ToolchainError: the environment is broken, and
    storing every candidate as a compile error would make the database lie about the programs.
    """

    n_parallel: int | None = None
    timeout: float = 15.0
    source_hook: SourceHook | None = None
    _pool: WorkerPool | None = field(default=None, init=False, repr=False)
    _recheck: bool = field(default=False, init=False, repr=False)  # the toolchain failed after the last batch

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        if not inputs:
            return []
        backends = {backend_for(inp.task.target, inp.task.hw) for inp in inputs}
        for backend in backends:
            backend.preflight(again=self._recheck)  # still broken: the run stops here, with the compiler's words
        self._recheck = False
        if self._pool is None:
            self._pool = WorkerPool(max(1, self.n_parallel or os.cpu_count() or 1))
        kill_after = self.timeout + _KILL_GRACE if self.timeout > 0 else None
        outcomes = self._pool.map(build_candidate, [(inp, self.timeout, self.source_hook) for inp in inputs],
                                  kill_after)
        results = []
        for out in outcomes:
            if out.error is None:
                results.append(out.value)
                continue
            if isinstance(out.error, WorkerTimeout):
                kind, msg = ErrorKind.COMPILE_TIMEOUT, f"build ran past {self.timeout}s: {out.error}"
            elif isinstance(out.error, WorkerDied):
                kind, msg = ErrorKind.UNKNOWN, f"build worker died: {out.error}"
            else:
                kind, msg = ErrorKind.UNKNOWN, f"build raised in the worker:\n{out.error}"
            results.append(BuildResult(None, "", kind, msg, out.seconds))
        return self.check_environment(backends, results)

    def check_environment(self, backends: set[Backend], results: list[BuildResult]) -> list[BuildResult]:
        """`results`, unless the batch's failures are the environment's: when every build failed, or one failed to
        compile, the toolchain must still build a trivial kernel (else ToolchainError if nothing was built, as
        it is when every build failed for the same fault of the machine). A compiler that breaks in the middle of
        a batch fails the trivial kernel too: the batch's compile errors are returned as UNKNOWN, which a resumed
        tuning measures again, and the next batch checks the toolchain first, so the run stops there if it is
        still broken."""
        suspects = [r.error_kind in _MAYBE_ENVIRONMENT for r in results]
        if not (all(suspects) or any(r.error_kind == ErrorKind.COMPILE_ERROR for r in results)):
            return results
        try:
            for backend in backends:
                backend.preflight(again=True)
        except ToolchainError as err:
            if all(suspects):
                raise
            self._recheck = True
            LOGGER.warning("the C toolchain broke during this batch (%s): its %d failed build(s) are stored as the "
                           "machine's failures, which a resumed tuning measures again", err.first_error(),
                           sum(suspects))
            why = f"the toolchain fails on a trivial kernel too ({err.first_error()}), not this program's fault"
            return [replace(r, error_kind=ErrorKind.UNKNOWN, error_msg=f"{why}: {r.error_msg}") if suspect else r
                    for r, suspect in zip(results, suspects)]
        if all(suspects):
            causes = {environment_error(r.error_msg) for r in results}
            if len(causes) == 1 and None not in causes:
                raise ToolchainError(f"every build of the batch failed with {causes.pop()!r}, a fault of the "
                                     f"machine: {results[0].error_msg.splitlines()[0]}")
        return results

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> LocalBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
