"""Tuning on a busy machine (tuning.busy, measure.calibration): a batch timed while the calibration kernel ran past
its bound is marked, never a task's best, measured again when the machine is quiet (the next batch, or the next
run), and `tensorgen tune` says so in one warning line. The machine is made "busy" deterministically by giving the
calibration kernel a quiet time far below what it takes, and "quiet" by one far above; the timings are real."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError
from tensorgen.measure.calibration import Calibration, busy_bound
from tensorgen.measure.harness import harness_executable
from tensorgen.measure.runner import LocalRunner
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.jsonl import export, import_
from tensorgen.records.record import Record
from tensorgen.report.data import gather
from tensorgen.report.page import Page, render
from tensorgen.report.profile import KernelTime, Profile
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask
from tensorgen.te import ops
from tensorgen.te.tensor import placeholder
from tensorgen.timing import competing_load
from tensorgen.tuning.registry import local_runner
from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler
from tensorgen.tuning.tune import RETIMES, MeasureConfig, tune

REPO = Path(__file__).resolve().parents[1]
BUSY = {"quiet_s": 1e-12}  # the calibration kernel "quiet" at a picosecond: every timing is far past the bound
QUIET = {"quiet_s": 1.0}  # ... at a second: never past it


def matmul_task(n: int = 8) -> SearchTask:
    a, b = placeholder((n, n), name="a"), placeholder((n, n), name="b")
    return SearchTask(ComputeDAG([a, b, ops.matmul(a, b)]), Target.parse("cpu"), HardwareParams(cores=2), f"mm{n}")


def measure(options: dict) -> MeasureConfig:
    return MeasureConfig(busy_bound=1.5, runner_options=options)


def test_calibration_slowdown_against_its_quiet_time(fresh_kernel_cache):
    cal = Calibration(harness_executable(), threads=2)
    assert 0 < cal.seconds() < 1.0
    assert cal.slowdown(1e-12) > 1e3 and cal.slowdown(1.0) < 1.5  # given quiet times
    assert cal.slowdown() >= 1.0  # against the fastest seen, kept in the kernel cache ...
    (stored,) = fresh_kernel_cache.glob("quiet-*.json")
    assert Calibration(harness_executable(), threads=2).slowdown() >= 1.0  # ... for the next process too
    assert list(fresh_kernel_cache.glob("quiet-*.json")) == [stored]


def test_a_gpu_task_is_not_calibrated_on_the_cpu():
    x = placeholder((8,), name="x")
    gpu = SearchTask(ComputeDAG([x, ops.relu(x)]), Target.parse("cuda -emulate=1"), HardwareParams(cores=2), "relu")
    runner = local_runner()
    try:
        assert runner.slowdown(gpu) is None and runner.slowdown(matmul_task()) > 0
    finally:
        runner.close()


def test_bound_from_the_environment(monkeypatch):
    monkeypatch.setenv("TENSORGEN_BUSY_BOUND", "2")
    assert busy_bound() == 2.0
    monkeypatch.setenv("TENSORGEN_BUSY_BOUND", "fast")
    with pytest.raises(TensorgenError, match="TENSORGEN_BUSY_BOUND='fast' is not a number"):
        busy_bound()
    with pytest.raises(TensorgenError, match="busy_bound must be >= 0"):
        MeasureConfig(busy_bound=-1)


def test_busy_measurements_are_marked_never_best_and_measured_again_on_resume(tmp_path):
    db = tmp_path / "t.db"
    task = matmul_task()
    busy = tune(task, trials=4, batch_size=4, db=db, measure=measure(BUSY))
    assert busy.best_cost == math.inf and busy.best_state is None  # no marked time is a best
    with SQLiteDatabase(db) as d:
        first = d.records(task.workload_key, "cpu")
        marked = [r for r in first if r.error_kind == "busy"]
        assert len(first) == 4 and marked and all(r.result.costs for r in marked)  # the costs measured are kept
        assert all(r.error_kind == "busy" or ErrorKind(r.error_kind).retryable for r in first)  # (a timeout: load)
        assert d.best(task.workload_key, "cpu") is None
    assert (busy.busy.batches, busy.busy.busy_batches, busy.busy.marked) == (1, 1, len(marked))
    assert busy.busy.warning().startswith("the machine was busy during 1 of 1 batch (calibration kernel up to ")
    assert f"their {len(marked)} measurements are marked" in busy.busy.warning()
    assert 0 < busy.busy.calibration_s < busy.busy.measure_s

    quiet = tune(task, trials=4, batch_size=4, db=db, measure=measure(QUIET))
    assert quiet.busy.busy_batches == 0 and quiet.busy.warning() == ""
    assert 0 < quiet.best_cost < math.inf
    with SQLiteDatabase(db) as d:
        again = d.records(task.workload_key, "cpu")[4:]
        assert {r.steps_hash for r in again} == {r.steps_hash for r in first}  # the same programs, measured again
        assert d.best(task.workload_key, "cpu").ok


def test_marked_programs_are_measured_again_in_the_next_quiet_batch(tmp_path):
    runner = local_runner(**BUSY)

    def quiet_after_first_batch(progress):
        if progress.phase == "batch":
            runner.quiet_s = QUIET["quiet_s"]

    try:
        result = tune(matmul_task(), trials=8, batch_size=4, db=tmp_path / "t.db", callbacks=[quiet_after_first_batch],
                      measure=MeasureConfig(runner=runner, busy_bound=1.5))
    finally:
        runner.close()
    assert (result.busy.batches, result.busy.busy_batches) == (2, 1)
    assert result.busy.remeasured == result.busy.marked > 0
    assert 0 < result.best_cost < math.inf
    assert "all of them were measured again while it was quiet" in result.busy.warning()
    some = replace(result.busy, remeasured=result.busy.marked - 1)
    assert f"{some.remeasured} of them were measured again while it was quiet, the rest" in some.warning()


@dataclass
class CountingRunner(LocalRunner):
    """Counts the records in `db` each time it is asked for the next candidate's result."""

    db: Path | None = None
    committed: list[int] = field(default_factory=list)

    def run_each(self, inputs, build_results):
        for item in super().run_each(inputs, build_results):
            yield item
            with SQLiteDatabase(self.db, readonly=True) as d:
                self.committed.append(len(d))


def test_with_the_watch_off_each_measurement_is_committed_as_it_arrives(tmp_path):
    runner = CountingRunner(db=tmp_path / "t.db")
    tune(matmul_task(), trials=3, batch_size=3, db=runner.db, measure=MeasureConfig(runner=runner, busy_bound=0))
    assert runner.committed == [1, 2, 3]


def test_marked_records_round_trip_through_sqlite_and_json_lines(tmp_path):
    task = matmul_task()
    marked = MeasureResult((1.5e-3, 1.6e-3), ErrorKind.BUSY, "measured while the machine was busy")
    record = Record.from_measure(task, State(task.dag), marked)
    assert Record.from_json_line(record.to_json_line()).result == marked
    with SQLiteDatabase(tmp_path / "a.db") as a:
        a.commit_record(record)
        export(a, tmp_path / "a.jsonl")
        assert a.best(task.workload_key, "cpu") is None
    with SQLiteDatabase(tmp_path / "b.db") as b:
        import_(b, tmp_path / "a.jsonl")
        (back,) = b.records(task.workload_key, "cpu")
        assert back.result == marked and back.error_kind == "busy"
        assert b.error_counts(task.workload_key, "cpu") == {"busy": 1}


def test_tune_cli_prints_one_warning_line(tmp_path):
    env = {**os.environ, "TENSORGEN_BUSY_BOUND": "1.5", "TENSORGEN_QUIET_SECONDS": "1e-12",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tensorgen.cli", "tune", "gmm", "--shape", "8,8,8", "--trials", "4",
                           "--batch-size", "4", "--target", "cpu -cores=2", "--db", str(tmp_path / "t.db")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("tensorgen: warning:")]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("tensorgen: warning: the machine was busy during 1 of 1 batch")
    assert "measurements are marked" in warnings[0]


def test_the_report_flags_marked_measurements_and_kernels_whose_times_disagree(tmp_path):
    pytest.importorskip("matplotlib")
    task = matmul_task()
    path = tmp_path / "t.db"
    with SQLiteDatabase(path) as db:
        db.commit_record(Record.from_measure(task, State(task.dag), MeasureResult((3e-3,), ErrorKind.BUSY, "busy")))
        state = State(task.dag)
        state.split(len(state.stages) - 1, state.stages[-1].iters[0].name, [2])
        db.commit_record(Record.from_measure(task, state, MeasureResult((1e-5,))))
    kernels = (KernelTime("fused_matmul", 0.031, 0.9, None, None, "tuned", 0.01),  # 3.1x its tuned time
               KernelTime("transpose_7", 0.003, 0.1, None, None, "tuned", 0.002))
    assert [k.flagged for k in kernels] == [True, False]
    with SQLiteDatabase(path, readonly=True) as db:
        html = render(gather(db), Page("tensorgen report", Profile("m", 2, 20, kernels, None, None)))
    assert "1 measurements of 1 task(s) were timed while the machine was busy" in html
    assert "0.0100 (!)" in html and "0.0020 (!)" not in html
    assert "(!) 1 kernel(s) ran more than 2x faster or slower in the model than their tuned time alone " \
           "(fused_matmul)" in html


class _Fake:
    """A tuner whose every program costs 1 ms (the scheduler's RoundTuner)."""

    def __init__(self, task: SearchTask):
        self.task, self.best_state, self.costs, self.rounds, self.remeasured = task, None, [], 0, 0

    best_cost = property(lambda self: min(self.costs, default=math.inf))

    def resume(self):
        return None

    def confirm(self):
        return 0

    def offer(self, states):
        return None

    def release(self):
        return None

    def seconds(self):
        return 0.0, 0.0, 0.0

    def remeasure(self):
        self.remeasured += 1
        self.costs.append(1e-3)
        return 1

    def round(self, n):
        self.rounds += 1
        self.costs += [1e-3] * n
        return n


def test_scheduler_gives_a_task_without_flops_a_second_round_and_its_best_a_second_measurement():
    x = placeholder((64, 64), name="x")
    transpose = SearchTask(ComputeDAG([x, ops.transpose(x, (1, 0))]), Target.parse("cpu"), HardwareParams(cores=2),
                           "transpose")
    assert transpose.dag.flop_count == 0
    tasks = [transpose, matmul_task(16), matmul_task(24)]
    order = []
    sched = TaskScheduler(tasks, config=SchedulerConfig(round_trials=4, eps_greedy=0.0),
                          callbacks=[lambda p: order.append(p.task) if p.phase == "round" else None])
    tuners = [_Fake(t) for t in tasks]
    sched.run(tuners, trials=16)
    assert order[:4] == [0, 1, 2, 0]  # the transpose's second round, first after the warm-up ...
    assert [t.remeasured for t in tuners] == [1, 0, 0]  # ... begins by measuring its best again


def test_a_transposes_best_is_measured_again_in_its_second_round(tmp_path):
    x = placeholder((64, 64), name="x")
    transpose = SearchTask(ComputeDAG([x, ops.transpose(x, (1, 0))]), Target.parse("cpu"), HardwareParams(cores=2),
                           "transpose")
    sched = TaskScheduler([transpose, matmul_task()], config=SchedulerConfig(round_trials=2, eps_greedy=0.0))
    sched.tune(6, db=tmp_path / "t.db", measure=MeasureConfig(busy_bound=0))
    with SQLiteDatabase(tmp_path / "t.db") as d:
        records = d.records(transpose.workload_key, "cpu")
        best = d.best(transpose.workload_key, "cpu")
    # its best of round 1 (a transpose has one program): the first timing and RETIMES re-timings in that round,
    # then one more when its second round comes (which finds no new program)
    assert best is not None and sum(r.steps_hash == best.steps_hash for r in records) >= 2 + RETIMES


@pytest.mark.slow
def test_a_competing_process_slows_the_calibration_kernel():
    """Real load, not run in CI (its machine is loaded already): one CPU-bound process beside a kernel timed with a
    thread per core takes a core from one of its threads."""
    cal = Calibration(harness_executable(), threads=os.cpu_count() or 2)
    quiet = min(cal.seconds() for _ in range(5))
    with competing_load():
        assert cal.slowdown(quiet) > busy_bound()
