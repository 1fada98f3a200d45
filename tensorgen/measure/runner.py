"""Run built candidates one at a time, each in its own harness process, and classify what happened.

One process per candidate makes isolation trivial: a segfault, abort or infinite loop takes down (or gets
killed with) that process only, and the next candidate starts in a fresh one right away. Candidates run
sequentially because concurrent runs would disturb each other's timings.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from tensorgen.build import compile_state
from tensorgen.codegen.backend import backend_for
from tensorgen.dag import ComputeDAG
from tensorgen.errors import CompileError, ToolchainError
from tensorgen.hardware import check_memory_budget, format_bytes, local_hardware
from tensorgen.measure.builder import KERNEL_NAME
from tensorgen.measure.calibration import Calibration, given_quiet_s
from tensorgen.measure.guard import ErrorGuard
from tensorgen.measure.harness import (
    HARNESS_FAILED,
    HarnessConfig,
    HarnessRun,
    arg_specs,
    harness_executable,
    read_outputs,
    run_harness,
)
from tensorgen.measure.types import BuildResult, ErrorKind, MeasureInput, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.target import Target
from tensorgen.task import SearchTask
from tensorgen.te.expr import Reduce

_STDERR_TAIL = 2000


class Runner(Protocol):
    """Times built candidates. `note_fastest` (optional) hears the best cost known from elsewhere (a resumed
    database), for runners that give up on or kill candidates much slower than the fastest; `run_each`
    (optional) hands each result over as soon as it is measured; `close` (optional) stops what the runner
    started."""

    def run(self, inputs: list[MeasureInput], build_results: list[BuildResult]) -> list[MeasureResult]: ...

    def run_each(self, inputs: list[MeasureInput],
                 build_results: list[BuildResult]) -> Iterator[tuple[int, MeasureResult]]:
        """(index in `inputs`, result) for every candidate, each as soon as it is measured: a runner that
        measures several at once (on several machines) yields them in the order they finish. The default
        measures one at a time, in order."""
        for i, (inp, br) in enumerate(zip(inputs, build_results)):
            (res,) = self.run([inp], [br])
            yield i, res

    def note_fastest(self, task: SearchTask, cost: float) -> None:
        return None

    def slowdown(self, task: SearchTask) -> float | None:
        """How many times slower than quiet the machine that times `task`'s candidates runs a calibration kernel
        now (see measure.calibration); None: this runner cannot tell."""
        return None

    def close(self) -> None:
        return None


def classify_run(run: HarnessRun, timeout: float, repeat: int) -> tuple[ErrorKind, str] | None:
    """The error of a harness run, or None if it produced all its timings."""
    tail = run.stderr[-_STDERR_TAIL:].strip()
    detail = f"\n{tail}" if tail else ""
    if run.timed_out:
        return ErrorKind.RUN_TIMEOUT, f"candidate ran past the {timeout}s timeout and was killed{detail}"
    rc = run.returncode
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return ErrorKind.RUNTIME_ERROR, f"candidate crashed with {name}{detail}"
    if rc == HARNESS_FAILED and "harness: " in run.stderr:
        return ErrorKind.UNKNOWN, f"the timing harness failed (not the candidate){detail}"
    if rc != 0:
        return ErrorKind.RUNTIME_ERROR, f"harness exited with status {rc}{detail}"
    if len(run.costs) != repeat:
        return ErrorKind.RUNTIME_ERROR, f"harness reported {len(run.costs)} of {repeat} repeats{detail}"
    return None


def compare_outputs(outs: list[np.ndarray], refs: list[np.ndarray], names: list[str], rtol: float) -> str | None:
    """Why `outs` differ from `refs` (tolerance `rtol * max|ref|`, NaN where the reference has none), or None."""
    for name, out, ref in zip(names, outs, refs):
        o, r = out.astype(np.float64), ref.astype(np.float64)
        nan_o, nan_r = np.isnan(o), np.isnan(r)
        if (nan_o != nan_r).any():
            idx = tuple(int(i) for i in np.argwhere(nan_o != nan_r)[0])
            return f"{name}: {int((nan_o & ~nan_r).sum())} NaN values where the reference has none " \
                   f"(first mismatch at {idx}: got {o[idx]}, expected {r[idx]})"
        finite = r[~nan_r]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        tol = rtol * max(scale, float(np.finfo(np.float32).tiny))
        with np.errstate(invalid="ignore"):
            diff = np.where((o == r) | nan_r, 0.0, np.abs(o - r))
        bad = ~(diff <= tol)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"{name}: {int(bad.sum())} of {bad.size} values off by more than {tol:.3g} "
                    f"(= {rtol} * max|ref| {scale:.3g}); max error {float(np.nanmax(diff)):.3g}; "
                    f"first at {idx}: got {o[idx]}, expected {r[idx]}")
    return None


LONG_REDUCTION = 16384  # float32 terms summed in a row before the reference program splits the sum
REFERENCE_FLOPS = 0.5e9  # the slowest the naive reference may run (FLOP/s) before it counts as hung
SLOWEST_FLOPS = 20e9  # candidates slower than this (FLOP/s) may be killed however long the timeout allows
KILL_FLOOR_S = 1.0  # a candidate is never killed for being slow sooner than this ...
KILL_FLOOR_RUNS = 10.0  # ... nor than this many times the median wall time of the last KILL_FLOOR_WINDOW harness runs
KILL_FLOOR_WINDOW = 9


def reference_state(dag: ComputeDAG) -> State:
    """The naive program, except that a reduction over more than LONG_REDUCTION elements sums
    ~sqrt(K) partial sums of ~sqrt(K) terms each (rfactor): a float32 sum of K terms in a row drifts
    by up to K * eps (NRM 4096x4096: 1% off, while the candidates with split sums were right); and the
    outermost loop of every stage is parallel (C3D batch 16 is 200 GFLOP)."""
    s = State(dag)
    for i in range(len(s.stages) - 1, -1, -1):
        st = s.stages[i]
        if st.is_placeholder or not isinstance(st.tensor.body, Reduce):
            continue
        reduce = [it.name for it in st.iters if it.kind == "reduce"]
        k = math.prod(it.extent for it in st.iters if it.kind == "reduce")
        factor = max((d for d in range(1, math.isqrt(k) + 1) if k % d == 0), default=1)
        if k <= LONG_REDUCTION or factor == 1:
            continue
        if len(reduce) > 1:
            s.fuse(i, reduce)
        fused = next(it.name for it in s.stages[i].iters if it.kind == "reduce")
        s.split(i, fused, [factor])
        n_space = sum(it.kind != "reduce" for it in s.stages[i].iters)
        s.rfactor(i, s.stages[i].relations[-1].children[0], n_space)
    for i, st in enumerate(s.stages):
        spatial = [it for it in st.iters if it.kind == "spatial"]
        if st.iters and st.iters[-1].kind == "reduce" and not st.relations and len(spatial) > 1 \
                and spatial[-1].extent > 1:
            # the innermost output axis moves inside the reduction loops: every element still sums its
            # terms in the same order, but the reads along that axis (a conv's output channels in its
            # weight, GMM's columns of B) become contiguous instead of one cache line per term
            reduce = [it.name for it in st.iters if it.kind == "reduce"]
            s.reorder(i, [it.name for it in spatial[:-1]] + reduce + [spatial[-1].name])
        if not st.is_placeholder and st.location == "root" and st.iters and st.iters[0].kind == "spatial":
            s.parallel(i, s.stages[i].iters[0].name)  # output elements are independent: every core works
    return s


@dataclass
class LocalRunner(Runner):
    """Times candidates on this machine with `hw.cores` threads; see HarnessConfig for the timing knobs.

    `check_correctness` compares each candidate's outputs with the naive program's on the same inputs.
    `guard` sees every final result (build errors included), so it alone covers a whole measurement.
    """

    timeout: float = 10.0
    number: int = 3
    repeat: int = 3
    min_repeat_ms: float = 0.0
    enable_cpu_cache_flush: bool = False
    evict_weights: bool = False  # evict the constant inputs before every timed call (see measure.harness)
    cooldown_interval: float = 0.0
    check_correctness: bool = False
    rtol: float = 1e-3
    seed: int = 1
    reference_timeout: float = 120.0
    give_up_seconds: float = 0.0  # > 0: candidates whose first call takes longer are timed by that call alone
    give_up_factor: float = 0.0  # > 0: ... or that are this many times slower than the task's fastest so far
    timeout_factor: float = 0.0  # > 0: candidates this many times slower than the fastest are killed (run_timeout)
    quiet_s: float = field(default_factory=given_quiet_s)  # the calibration kernel's quiet time (0: the one seen)
    guard: ErrorGuard | None = field(default_factory=ErrorGuard)
    _exe: Path | None = field(default=None, init=False, repr=False)
    _references: dict[tuple[str, str], list[np.ndarray] | str] = field(default_factory=dict, init=False, repr=False)
    _fastest: dict[str, float] = field(default_factory=dict, init=False, repr=False)  # task key -> best cost
    _calibrations: dict[int, Calibration] = field(default_factory=dict, init=False, repr=False)  # by threads
    _walls: deque[float] = field(default_factory=lambda: deque(maxlen=KILL_FLOOR_WINDOW), init=False, repr=False)

    def run(self, inputs: list[MeasureInput], build_results: list[BuildResult]) -> list[MeasureResult]:
        self.check_inputs(inputs, build_results)
        return [self.observe(i, inp, self.measure(inp, br)) for i, (inp, br) in enumerate(zip(inputs, build_results))]

    def check_inputs(self, inputs: list[MeasureInput], build_results: list[BuildResult]) -> None:
        """Refuse a batch whose lengths differ or whose tasks' arguments do not fit the memory budget."""
        if len(inputs) != len(build_results):
            raise ValueError(f"{len(inputs)} inputs but {len(build_results)} build results")
        for task in {inp.task.key: inp.task for inp in inputs}.values():
            need = sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in task.dag.args)
            check_memory_budget(need, f"{task.desc or task} needs {format_bytes(need)} for its arguments")

    def observe(self, i: int, inp: MeasureInput, res: MeasureResult) -> MeasureResult:
        """Note the `i`-th candidate's result (a new fastest, the error guard) and return it."""
        if res.ok:
            self.note_fastest(inp.task, res.median_cost)
        if self.guard is not None:
            self.guard.observe(res, f"#{i} of {inp.task}")
        return res

    def note_fastest(self, task: SearchTask, cost: float) -> None:
        """Tell the runner a cost measured elsewhere (e.g. the best record of a resumed database)."""
        if math.isfinite(cost) and cost > 0:
            self._fastest[task.key] = min(self._fastest.get(task.key, math.inf), cost)

    def slowdown(self, task: SearchTask) -> float | None:
        """The calibration kernel's slowdown on this machine, timed with the threads `task`'s candidates get; None
        for a GPU's task (its times are the GPU's, and an emulated GPU's rank nothing)."""
        if task.target.kind != "cpu":
            return None
        threads = self.config(task).threads
        if threads not in self._calibrations:
            self._calibrations[threads] = Calibration(self.executable(), threads)
        return self._calibrations[threads].slowdown(self.quiet_s)

    def give_up_after(self, task: SearchTask) -> float:
        """Seconds of a first call after which a candidate of `task` is timed by that call (0: never)."""
        limits = [self.give_up_seconds] if self.give_up_seconds > 0 else []
        if self.give_up_factor > 0 and task.key in self._fastest and not task.target.emulated:
            limits.append(self.give_up_factor * self._fastest[task.key])
        return min(limits, default=0.0)

    def timeout_for(self, task: SearchTask) -> float:
        """The run timeout of a candidate of `task`: `timeout`, but at least what its calls take at
        SLOWEST_FLOPS (a C3D of batch 16 is 200 GFLOP per call: at a flat 10 s, all 64 candidates of a
        run timed out), or less once a fast candidate is known (bad random samples must not eat the
        tuning time), though never less than `kill_floor()`. An emulated GPU's times rank nothing (they count the
        emulator's thread switches), so its candidates are never given up or killed for being slow."""
        base = max(self.timeout, (1 + self.number * self.repeat) * task.dag.flop_count / SLOWEST_FLOPS)
        if self.timeout_factor <= 0 or task.key not in self._fastest or task.target.emulated:
            return base
        calls = 1 if self.give_up_factor > 0 else 1 + self.number * self.repeat
        return min(base, max(self.kill_floor(), self.timeout_factor * self._fastest[task.key] * calls))

    def kill_floor(self) -> float:
        """The least time a candidate is given before it is killed for being slow: KILL_FLOOR_S, or
        KILL_FLOOR_RUNS times the median wall time of the last harness runs that produced timings, whichever is
        longer. Why: a harness run is a process start and at least six calls (warm-up, repeats of min_repeat_ms)
        whatever the kernel; on a busy machine each call of a two-thread kernel waits out a scheduler time slice
        for its second thread (a 32x32x32 matmul took 20-100 ms per call beside three CPU-bound processes, a
        whole run up to 1.02 s), so a fixed second killed fast candidates as run timeouts."""
        return max(KILL_FLOOR_S, KILL_FLOOR_RUNS * statistics.median(self._walls)) if self._walls else KILL_FLOOR_S

    def config(self, task: SearchTask, number: int | None = None, repeat: int | None = None) -> HarnessConfig:
        flush = -1 if self.evict_weights else 2 * task.hw.l3_bytes if self.enable_cpu_cache_flush else 0
        return HarnessConfig(
            number=self.number if number is None else number, repeat=self.repeat if repeat is None else repeat,
            min_repeat_ms=self.min_repeat_ms if number is None else 0.0, flush_bytes=flush,
            cooldown_interval=self.cooldown_interval, threads=task.hw.cores, seed=self.seed,
            give_up_seconds=self.give_up_after(task) if number is None else 0.0, cuda=task.target.kind == "cuda",
        )

    def measure(self, inp: MeasureInput, br: BuildResult) -> MeasureResult:
        """Measure one candidate; a failed build is passed through with its own error kind."""
        if br.error_kind != ErrorKind.NONE:
            return MeasureResult((), br.error_kind, br.error_msg, br.build_seconds)
        if br.path is None:
            return MeasureResult((), ErrorKind.UNKNOWN, "build reported success but no shared object",
                                 br.build_seconds)
        dag = inp.state.dag  # the task's, or its laid-out form (schedule.laid_out): the arguments in their layouts
        with tempfile.TemporaryDirectory(prefix="tensorgen-run-") as tmp:
            out_path = os.path.join(tmp, "outputs.bin") if self.check_correctness else None
            timeout = self.timeout_for(inp.task)
            run = run_harness(self.executable(), br.path, KERNEL_NAME, arg_specs(dag, br.layouts),
                              self.config(inp.task), timeout, out_path)
            all_cost = br.build_seconds + run.wall_seconds
            error = classify_run(run, timeout, self.repeat)
            if error is not None:
                return MeasureResult((), error[0], error[1], all_cost)
            self._walls.append(run.wall_seconds)
            if out_path is not None:
                refs = self.reference(inp.task, dag)
                if isinstance(refs, str):
                    return MeasureResult((), ErrorKind.UNKNOWN, f"cannot check correctness: {refs}", all_cost)
                names = [t.name for t in dag.outputs]
                why = compare_outputs(read_outputs(dag, out_path), refs, names, self.rtol)
                if why is not None:
                    return MeasureResult((), ErrorKind.WRONG_ANSWER, why, all_cost)
        return MeasureResult(run.costs, all_cost=all_cost)

    def executable(self) -> Path:
        if self._exe is None:
            self._exe = harness_executable()
        return self._exe

    def reference(self, task: SearchTask, dag: ComputeDAG | None = None) -> list[np.ndarray] | str:
        """Outputs of the naive program of `dag` (the task's own by default) on the harness inputs (cached per
        task and DAG), or why there are none."""
        dag = dag if dag is not None else task.dag
        key = (task.key, dag.workload_key)
        if key not in self._references:
            self._references[key] = self._compute_reference(task, dag)
        return self._references[key]

    def _compute_reference(self, task: SearchTask, dag: ComputeDAG) -> list[np.ndarray] | str:
        """The naive program runs on this CPU whatever the task's target (on the same inputs: the harness makes
        them from the seed)."""
        cpu = task if task.target.kind == "cpu" else SearchTask(dag, Target("cpu"), local_hardware())
        try:
            so = compile_state(reference_state(dag), backend_for(cpu.target, cpu.hw), KERNEL_NAME).path
        except ToolchainError:
            raise  # the environment, not this task: the run stops with it
        except CompileError as err:
            return f"the naive reference program does not compile: {err.first_error()}"
        with tempfile.TemporaryDirectory(prefix="tensorgen-ref-") as tmp:
            out_path = os.path.join(tmp, "outputs.bin")
            timeout = max(self.reference_timeout, dag.flop_count / REFERENCE_FLOPS)
            run = run_harness(self.executable(), str(so), KERNEL_NAME, arg_specs(dag),
                              self.config(cpu, number=1, repeat=1), timeout, out_path)
            error = classify_run(run, timeout, 1)
            if error is not None:
                return f"the naive reference program failed ({error[0].value}): {error[1]}"
            return [a.copy() for a in read_outputs(dag, out_path)]
