"""tune(): resumable, never re-measures, keeps records on interrupt; `tensorgen tune` / `show` on the command line."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import numpy as np
import pytest

from tensorgen.build import build
from tensorgen.cli import main as cli
from tensorgen.dag import ComputeDAG
from tensorgen.measure import LocalBuilder, LocalRunner
from tensorgen.measure.types import ErrorKind
from tensorgen.records import SQLiteDatabase
from tensorgen.records.record import program_cost
from tensorgen.search.random_policy import RandomPolicy
from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.progress import ProgressLine
from tensorgen.tuning.tune import MeasureConfig, TuneError, TuneProgress, make_task, tune

pytestmark = pytest.mark.serial  # measures with real timeouts: run alone, not beside other tests

FAST = dict(policy="random", batch_size=8, measure=MeasureConfig(build_timeout=20.0, run_timeout=5.0))


def gmm_dag(n: int = 64) -> ComputeDAG:
    inputs, outputs = make_gmm(n, n, n)
    return ComputeDAG(inputs + outputs)


@pytest.fixture(scope="module")
def task():
    return make_task(gmm_dag())


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, task):
    """16 random trials, then 8 more on the same database."""
    path = tmp_path_factory.mktemp("tune") / "t.db"
    events: list[TuneProgress] = []
    first = tune(task, trials=16, db=path, callbacks=[events.append], **FAST)
    second = tune(task, trials=8, db=path, **FAST)
    return path, first, second, events


def distinct_steps(path) -> tuple[int, int]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*), COUNT(DISTINCT steps_hash) FROM records").fetchone()


def test_best_program_matches_numpy(tuned, task):
    _, first, _, _ = tuned
    assert first.trials == 16 and first.total_trials == 16 and not first.interrupted
    assert first.best_state is not None and first.best_gflops > 0
    assert first.best_gflops == pytest.approx(task.dag.flop_count / first.best_cost / 1e9)
    rng = np.random.default_rng(0)
    a, b = (rng.random((1, 64, 64), dtype=np.float32) for _ in range(2))
    (c,) = build(first.best_state).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_records_committed_and_progress_reported(tuned, task):
    path, first, _, events = tuned
    with SQLiteDatabase(path) as db:
        assert len(db.records(task.workload_key, "cpu")) == 24 + tuned[1].retimed + tuned[2].retimed
    assert [e.phase for e in events] == ["resume", "batch", "batch"]
    assert [e.trials_done for e in events] == [0, 8, 16]
    assert all(len(e.inputs) == 8 for e in events[1:]) and events[-1].best_gflops == first.best_gflops


def test_resume_counts_and_never_remeasures(tuned):
    """The second call resumes the first's 16 programs and measures 8 more; a program whose first measurement
    failed for the machine's sake (a timeout under load) is measured again, within those 8, and not counted twice."""
    path, first, second, _ = tuned
    again = sum(n for kind, n in first.errors.items() if ErrorKind(kind).retryable)
    assert second.trials == 8 and second.total_trials == 24 - again
    assert second.best_cost <= first.best_cost  # resumed records count for the best
    assert first.retimed >= 2  # the first best is re-timed at least once
    assert distinct_steps(path) == (24 + first.retimed + second.retimed, 24 - again)


def test_times_add_up(tuned):
    for r in tuned[1:3]:
        parts = (r.search_overhead_s, r.build_s, r.run_s)
        assert all(t >= 0 for t in parts) and r.build_s > 0 and r.run_s > 0
        assert sum(parts) <= r.tuning_wall_s


def test_policy_instance_and_interrupt_keep_records(tmp_path, task):
    path = tmp_path / "i.db"
    seen = []

    def stop(p: TuneProgress) -> None:
        seen.append(p.trials_done)
        if p.trials_done >= 4:
            raise KeyboardInterrupt

    with LocalBuilder(timeout=20.0) as builder:
        result = tune(task, trials=12, db=path, policy=RandomPolicy(task, seed=3), batch_size=4,
                      measure=MeasureConfig(builder, LocalRunner(timeout=5.0, number=1, repeat=1)), callbacks=[stop])
    assert result.interrupted and result.trials == 4 and seen == [0, 4]
    assert distinct_steps(path) == (4 + result.retimed, 4)


def test_policy_that_repeats_itself_costs_nothing(task):
    class Stuck:
        """Proposes the same program forever: tune must measure it once and stop."""

        def __init__(self) -> None:
            self.state = RandomPolicy(task, seed=1).next_batch(1)[0]

        def next_batch(self, n):
            return [self.state] * n

        def update(self, inputs, results):
            pass

    result = tune(task, trials=8, policy=Stuck(), batch_size=4, measure=MeasureConfig(run_timeout=5.0))
    assert result.trials == 1 and result.total_trials == 1


def test_random_policy_is_seeded_and_never_repeats(task):
    a, b = RandomPolicy(task, seed=7), RandomPolicy(task, seed=7)
    first = [s.to_json() for s in a.next_batch(10)]
    assert first == [s.to_json() for s in b.next_batch(10)]
    assert len(set(first)) == len(first)
    assert not set(first) & {s.to_json() for s in a.next_batch(10)}


def test_bad_arguments():
    with pytest.raises(TuneError, match="unknown search policy"):
        tune(gmm_dag(8), trials=1, policy="nope")
    with pytest.raises(TuneError, match="trials"):
        tune(gmm_dag(8), trials=-1, policy="random")


# ---------------------------------------------------------------------------------------------
# command line


def test_cli_tune_json_and_show(tmp_path, capsys):
    db, out = str(tmp_path / "c.db"), tmp_path / "r.json"
    assert cli(["tune", "GMM", "--shape", "64,64,64", "--trials", "8", "--policy", "random", "--db", db,
                "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "8/8 trials" in captured.err and "GFLOP/s" in captured.out
    data = json.loads(out.read_text())
    assert data["trials"] == 8 and data["best_gflops"] > 0 and data["best_seconds"] > 0
    assert {"tuning_wall_s", "search_overhead_s"} <= data.keys()
    assert cli(["show", "gmm", "--shape", "64,64,64", "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "s.split(" in shown and "void " in shown and "GFLOP/s" in shown


def test_cli_tune_with_the_psa_prefilter(tmp_path):
    out = tmp_path / "r.json"
    assert cli(["tune", "gmm", "--shape", "32,32,32", "--trials", "4", "--prefilter", "psa", "--db",
                str(tmp_path / "p.db"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["prefilter"] == "psa" and data["trials"] == 4 and data["best_gflops"] > 0


@pytest.mark.parametrize("argv, message", [
    (["tune", "nosuchop", "--shape", "1,2"], "unknown operator 'nosuchop'"),
    (["tune", "gmm", "--shape", "64,64"], "GMM takes 3 shape values (n, m, k)"),
    (["tune", "gmm", "--shape", "64,x,64"], "not a comma-separated list of integers"),
    (["show", "nrm", "--shape", "8,8"], "has no records for NRM(8,8)"),
    (["tune", "gmm", "--shape", "8,8,8", "--policy", "random", "--prefilter", "psa"], "prunes the ansor policy"),
])
def test_cli_errors_exit_2(tmp_path, capsys, argv, message):
    db = tmp_path / "e.db"
    SQLiteDatabase(db).close()
    assert cli([*argv, "--db", str(db)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tensorgen: error:") and message in line


def test_progress_line_rewrites_on_a_tty(task):
    class Stream:
        def __init__(self):
            self.text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    resumed = TuneProgress(task, "resume", 0, 16, 16, 1e-3, 0.5, 0, 0.5)
    p = TuneProgress(task, "batch", 8, 16, 24, 1e-3, 0.5, 1, 1.0)
    tty, log = ProgressLine(Stream(), tty=True), ProgressLine(Stream(), tty=False)
    for line in (tty, log):
        line(resumed)
        line(p)
        line.close()
    assert tty.stream.text.count("\r") == 2 and tty.stream.text.endswith("\n")
    assert log.stream.text.count("\n") == 2 and "8/16 trials (+16 resumed" in log.stream.text
    # resumed programs measured again (a timeout, a busy machine) are trials of this run, not fewer resumed ones
    again = ProgressLine(Stream(), tty=False)
    again(resumed)
    again(TuneProgress(task, "batch", 8, 16, 16, 1e-3, 0.5, 0, 1.0))
    assert "8/16 trials (+16 resumed" in again.stream.text and "+-" not in again.stream.text


def test_runner_timeout_follows_the_fastest():
    t = make_task(gmm_dag(8))
    runner = LocalRunner(timeout=10.0, number=3, repeat=3, timeout_factor=20.0)
    assert runner.timeout_for(t) == 10.0  # nothing known yet
    runner.note_fastest(t, 1e-4)
    assert runner.timeout_for(t) == 1.0  # floor
    runner.note_fastest(t, float("inf"))
    assert runner.timeout_for(t) == 1.0  # failures teach nothing
    runner._fastest.clear()
    runner.note_fastest(t, 0.01)
    assert runner.timeout_for(t) == pytest.approx(20.0 * 0.01 * 10)
    runner.give_up_factor = 4.0  # slow candidates run one call
    assert runner.timeout_for(t) == pytest.approx(max(1.0, 20.0 * 0.01))
    runner._fastest.clear()
    runner.note_fastest(t, 1.0)
    assert runner.timeout_for(t) == 10.0  # never above the user's limit...


def test_runner_timeout_leaves_room_for_huge_workloads():
    """... unless a candidate's calls need longer even at SLOWEST_FLOPS (a 200 GFLOP C3D of batch 16)."""
    from tensorgen.measure.runner import SLOWEST_FLOPS
    from tensorgen.te.ops.suite import make_c3d

    small, huge = make_task(gmm_dag(8)), make_task(make_c3d(16, 224, 224, 3, 64, 7, 2, 3, batch=16)[1])
    runner = LocalRunner(timeout=10.0, number=1, repeat=3, timeout_factor=20.0, give_up_factor=4.0)
    assert runner.timeout_for(small) == 10.0
    floor = 4 * huge.dag.flop_count / SLOWEST_FLOPS
    assert floor > 30 and runner.timeout_for(huge) == pytest.approx(floor)
    runner.note_fastest(huge, 1.5)  # slow candidates are then timed by one call and killed at 20x
    assert runner.timeout_for(huge) == pytest.approx(min(floor, 20 * 1.5))


class LuckyOnce(LocalRunner):
    """A LocalRunner whose `lucky`-th measurement reads 1000x faster than the program ran (a disturbed timer)."""

    def __init__(self, lucky: int) -> None:
        super().__init__(timeout=5.0, number=1, repeat=1)
        self.lucky, self.calls, self.lucky_cost = lucky, 0, None

    def run(self, inputs, build_results):
        results = super().run(inputs, build_results)
        self.calls += 1
        if self.calls == self.lucky:
            results = [dataclasses.replace(r, costs=tuple(c / 1000 for c in r.costs)) for r in results]
            self.lucky_cost = results[0].median_cost
        return results


def test_one_lucky_measurement_does_not_make_the_best(task, tmp_path):
    """A program whose first measurement was disturbed becomes the best, is re-timed, and drops back."""
    runner = LuckyOnce(lucky=3)
    with LocalBuilder(timeout=20.0) as builder:
        result = tune(task, trials=8, db=tmp_path / "l.db", policy=RandomPolicy(task, seed=5), batch_size=8,
                      measure=MeasureConfig(builder, runner))
    assert runner.lucky_cost is not None and result.retimed >= 2
    with SQLiteDatabase(tmp_path / "l.db") as db:
        best = db.best(task.workload_key, "cpu")
        runs = [r.cost for r in db.records(task.workload_key, "cpu") if r.ok and r.steps_hash == best.steps_hash]
    # the reported best is its program's re-timed cost, never the disturbed reading (on a loaded machine the
    # re-timings themselves may differ by 1000x: a thread of the team waits for a core for a time slice)
    assert result.best_cost != runner.lucky_cost and best.cost == result.best_cost
    assert result.best_cost == program_cost(runs) and len(runs) > 1, runs


def test_cli_model_tuning_with_a_smaller_warm_up_round(tmp_path):
    """`--warmup-trials 1`: each of the model's two tasks gets one program first, then the batch size a round."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n)
               for n, s in (("w1", (16, 32)), ("w2", (32, 8)))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], weights)
    model = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), model)
    db = tmp_path / "w.db"
    assert cli(["tune", str(model), "--trials", "6", "--batch-size", "4", "--warmup-trials", "1", "--policy",
                "random", "--strategy", "round-robin", "--db", str(db)]) == 0
    with sqlite3.connect(db) as conn:
        counts = sorted(n for (n,) in conn.execute(
            "SELECT COUNT(DISTINCT steps_hash) FROM records GROUP BY workload_key"))
    assert counts == [1, 5]  # warm-up: 1 + 1; then a round of 4 to the first task
