"""TaskScheduler (Ansor §6): the gradient formula, allocation strategies, objectives f1-f4, resume, models
sharing tasks, failing tasks, the progress table; and one end-to-end run with the real tuner.

The allocation tests drive FakeTuners (latency as a function of the rounds a task got), so they run in
milliseconds; only the last tests compile and measure programs.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import numpy as np
import pytest

from tensorgen.build import build
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.dag import ComputeDAG
from tensorgen.measure.runner import LocalRunner
from tensorgen.measure.types import ErrorKind, MeasureResult, measure_again
from tensorgen.records import SQLiteDatabase
from tensorgen.records.record import steps_hash
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask
from tensorgen.te import ops, placeholder
from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.objectives import (
    EarlyStopping,
    GeoMeanSpeedup,
    LatencyRequirements,
    SchedulerView,
    TotalLatency,
    estimate_latencies,
    objective_gradient,
    similarity_tag,
    task_gradient,
)
from tensorgen.tuning.progress import ProgressTable, SchedulerProgress, StopTuning, format_table
from tensorgen.tuning.scheduler import ModelTasks, RoundTuner, SchedulerConfig, SchedulerError, TaskScheduler
from tensorgen.tuning.tune import RETIMES, MeasureConfig


def gmm_task(n: int) -> SearchTask:
    inputs, outputs = make_gmm(n, n, n)
    return SearchTask(ComputeDAG(inputs + outputs), Target.parse("cpu"), HardwareParams(cores=2), f"GMM({n})")


def relu_task(n: int) -> SearchTask:
    x = placeholder((n, n), name="x")
    return SearchTask(ComputeDAG([x, ops.relu(x)]), Target.parse("cpu"), HardwareParams(cores=2), f"relu({n})")


TASKS = [gmm_task(n) for n in (16, 18, 20, 22, 24)]


class FakeTuner(RoundTuner):
    """Every trial of the task's r-th round costs `curve(r)` seconds; `limit` rounds, then nothing new."""

    def __init__(self, task: SearchTask, curve: Callable[[int], float], costs=(), limit: int | None = None):
        self.task, self.curve, self.limit = task, curve, limit
        self.best_state = None
        self.costs = list(costs)
        self.rounds = 0
        self.resumed = 0

    @property
    def best_cost(self) -> float:
        return min(self.costs, default=math.inf)

    def resume(self):
        self.resumed += 1

    def confirm(self) -> int:
        return 0

    def round(self, n: int) -> int:
        if self.limit is not None and self.rounds >= self.limit:
            return 0
        self.rounds += 1
        self.costs.extend([self.curve(self.rounds)] * n)
        return n


def run_fake(curves, trials, weights=None, tasks=None, **options):
    """Run a scheduler over fake tuners; return (result, order of tasks tuned, tuners)."""
    tasks = tasks or TASKS[: len(curves)]
    order: list[int] = []
    callbacks = [lambda p: order.append(p.task) if p.phase == "round" else None]
    objective, seed = options.pop("objective", None), options.pop("seed", 0)
    config = SchedulerConfig(**{"round_trials": 4, **options})
    sched = TaskScheduler(tasks, weights, objective=objective, config=config, seed=seed, callbacks=callbacks)
    tuners = [FakeTuner(t, c) if callable(c) else c for t, c in zip(tasks, curves)]
    return sched.run(tuners, trials), order, tuners


def flat(value: float) -> Callable[[int], float]:
    return lambda r: value


# ---------------------------------------------------------------------------------------------
# the gradient


def test_task_gradient_by_hand():
    # g = 10, 8, 6, 5 after 4 rounds; window 3: backward (5 - 10) / 3; optimistic -5/4; similar: 2 * 1e9 / V - 5
    h = [10.0, 8.0, 6.0, 5.0]
    slow_peer = task_gradient(2.0, h, 5.0, 1e9, 5e8, alpha=0.2, beta=2.0, window=3)
    assert slow_peer == pytest.approx(2 * (0.2 * (-5 / 3) + 0.8 * -1.25))  # 2e9/5e8 - 5 = -1 > -1.25
    fast_peer = task_gradient(2.0, h, 5.0, 1e9, 1e10, alpha=0.2, beta=2.0, window=3)
    assert fast_peer == pytest.approx(2 * (0.2 * (-5 / 3) + 0.8 * (0.2 - 5)))
    assert task_gradient(1.0, h, 5.0, 1e9, 0.0, 0.2, 2.0, window=4) == pytest.approx(0.8 * -1.25)  # no backward yet
    assert task_gradient(1.0, [math.inf, 8.0, 6.0, 5.0], 5.0, 1e9, 0.0, 0.2, 2.0, 3) == pytest.approx(0.8 * -1.25)


def test_scheduler_gradients_use_weights_and_similar_tasks():
    tasks = [gmm_task(16), gmm_task(18), relu_task(32)]
    assert [similarity_tag(t.dag) for t in tasks] == ["batch_matmul", "batch_matmul", ""]
    sched = TaskScheduler(tasks, [1.0, 2.0, 3.0], config=SchedulerConfig(alpha=0.5, beta=2.0, backward_window=1))
    history = [[4e-5, 2e-5], [1e-4], [1e-5, 1e-5, 1e-5]]
    flops = [t.dag.flop_count for t in tasks]
    best_speed = max(flops[0] / 2e-5, flops[1] / 1e-4)  # the GMMs are similar (FLOPs within 2x) to each other
    expected = [
        1.0 * (0.5 * (2e-5 - 4e-5) + 0.5 * min(-2e-5 / 2, 2 * flops[0] / best_speed - 2e-5)),
        2.0 * (0.5 * 0.0 + 0.5 * min(-1e-4 / 1, 2 * flops[1] / best_speed - 1e-4)),
        3.0 * (0.5 * 0.0 + 0.5 * (-1e-5 / 3)),  # relu: similar to nothing
    ]
    np.testing.assert_allclose(sched.gradients(history), expected, rtol=1e-6)


def test_a_stalled_task_loses_its_similarity_term():
    """A task far slower than its similar peers that stopped improving is not fed forever (Ansor's formula
    alone would: its beta * C / V - g stays large); similarity_patience=None is the formula as published."""
    tasks = [gmm_task(16), gmm_task(18)]
    flops = [t.dag.flop_count for t in tasks]
    stalled_slow = [1e-3] * 5  # five rounds, no gain, 100x slower than its peer
    history = [stalled_slow, [flops[1] / 1e11] * 5]
    with_term = TaskScheduler(tasks, config=SchedulerConfig(alpha=0.2, similarity_patience=None)).gradients(history)[0]
    without = TaskScheduler(tasks, config=SchedulerConfig(alpha=0.2)).gradients(history)[0]
    assert with_term == pytest.approx(0.8 * (2 * flops[0] / 1e11 - 1e-3))
    assert without == pytest.approx(0.8 * (-1e-3 / 5))
    improving = [2e-3, 1.8e-3, 1.5e-3, 1.2e-3, 1e-3]  # still gaining: keeps the term
    assert TaskScheduler(tasks, config=SchedulerConfig(alpha=0.2)).gradients([improving, history[1]])[0] < without


def test_estimates_for_failed_tasks_are_finite():
    best = np.array([1e-3, math.inf, 2e-3, math.inf])
    flops = np.array([1e6, 4e6, 1e6, 0.0])
    # slowest speed 1e6 / 2e-3 = 5e8 FLOP/s: 4e6 FLOPs take 8e-3 s; no FLOPs: the largest latency known
    np.testing.assert_allclose(estimate_latencies(best, flops), [1e-3, 8e-3, 2e-3, 2e-3])
    np.testing.assert_allclose(estimate_latencies(np.full(2, math.inf), flops[:2]), [1.0, 1.0])


# ---------------------------------------------------------------------------------------------
# allocation


def test_warm_up_is_round_robin_then_gradient():
    curves = [flat(1e-3), flat(1e-3), flat(1e-3), lambda r: 1e-2 / r]
    result, order, _ = run_fake(curves, trials=4 * 10, weights=[1, 1, 1, 100], eps_greedy=0.0)
    assert order[:4] == [0, 1, 2, 3]  # warm-up in order, whatever the weights
    assert order[4:] == [3] * 6  # then the task that dominates the objective
    assert result.stopped == "budget" and result.trials == 40 and result.rounds == 10


def test_the_warm_up_round_has_its_own_size():
    """`warmup_trials`: each task's first round measures that many, the later ones `round_trials`."""
    result, order, tuners = run_fake([flat(1e-3), flat(1e-3), flat(1e-3)], trials=3 * 2 + 2 * 4,
                                     strategy="round-robin", warmup_trials=2)
    assert order == [0, 1, 2, 0, 1] and [len(t.costs) for t in tuners] == [6, 6, 2]
    assert result.trials == 14 and result.models["model"] == pytest.approx(3e-3)
    with pytest.raises(SchedulerError, match="warmup_trials"):
        SchedulerConfig(warmup_trials=0)


def test_more_rounds_to_the_task_that_dominates():
    curves = [lambda r: 1e-2 / r, flat(1e-3), flat(1e-3)]  # task 0 keeps improving and weighs most
    result, order, _ = run_fake(curves, trials=4 * 30, weights=[5, 1, 1], eps_greedy=0.0)
    counts = np.bincount(order, minlength=3)
    assert counts[0] > counts[1:].sum() and counts.sum() == 30
    assert [r.rounds for r in result.rows] == counts.tolist()
    assert result.models["model"] == pytest.approx(5 * 1e-2 / counts[0] + 2e-3)


def test_eps_greedy_is_reproducible_by_seed():
    curves = [lambda r: 1e-2 / r, flat(1e-3), flat(1e-3), flat(2e-3)]
    weights = [1, 1, 1, 0]  # task 3 is in no model: only a random pick tunes it again
    runs = {seed: run_fake(curves, trials=4 * 40, weights=weights, eps_greedy=0.5, seed=seed)[1] for seed in (1, 2)}
    again = run_fake(curves, trials=4 * 40, weights=weights, eps_greedy=0.5, seed=1)[1]
    assert runs[1] == again and runs[1] != runs[2]
    greedy = run_fake(curves, trials=4 * 40, weights=weights, eps_greedy=0.0, seed=1)[1]
    assert 3 not in greedy[4:] and 3 in runs[1][4:] and 3 in runs[2][4:]


def test_round_robin_is_even_and_the_last_round_is_cut():
    result, order, tuners = run_fake([lambda r: 1e-2 / r, flat(1e-3), flat(1e-3)], trials=4 * 9 - 3,
                                     weights=[100, 1, 1], strategy="round-robin")
    assert order == [0, 1, 2] * 3
    assert [len(t.costs) for t in tuners] == [12, 12, 9] and result.trials == 33
    assert (result.search_s, result.build_s, result.run_s) == (0, 0, 0)  # fakes count no time (the default)


def test_exhausted_and_failing_tasks():
    dead = FakeTuner(TASKS[0], flat(1e-3), limit=1)  # one round, then nothing new to measure
    failing = FakeTuner(TASKS[1], flat(math.inf))  # never a valid measurement
    result, order, _ = run_fake([dead, failing, lambda r: 1e-3 / r], trials=4 * 20, eps_greedy=0.0)
    assert result.stopped == "budget" and result.trials == 80
    assert order.count(0) == 1 and order.count(1) >= 4 and order.count(2) >= 4  # neither starves the other
    assert math.isinf(result.rows[1].latency) and result.models["model"] is None
    only_dead = run_fake([FakeTuner(TASKS[0], flat(1e-3), limit=2)], trials=400)[0]
    assert only_dead.stopped == "exhausted" and only_dead.trials == 8


def test_interrupt_keeps_what_was_measured():
    def stop_after_two(p):
        if p.rounds == 2:
            raise KeyboardInterrupt

    sched = TaskScheduler(TASKS[:2], config=SchedulerConfig(round_trials=4), callbacks=[stop_after_two])
    result = sched.run([FakeTuner(t, flat(1e-3)) for t in TASKS[:2]], trials=100)
    assert result.interrupted and result.trials == 8 and [r.latency for r in result.rows] == [1e-3, 1e-3]

    class Refuses(FakeTuner):
        def resume(self):
            raise KeyboardInterrupt

    early = TaskScheduler(TASKS[:1]).run([Refuses(TASKS[0], flat(1.0))], trials=100)
    assert early.interrupted and early.trials == 0 and early.rows[0].rounds == 0


def test_a_callback_ends_the_run_at_a_target():
    def until_estimate(p):
        if p.phase == "round" and p.models["model"] is not None and p.models["model"] <= 2e-3 + 1e-12:
            raise StopTuning

    sched = TaskScheduler(TASKS[:2], config=SchedulerConfig(round_trials=4), callbacks=[until_estimate])
    result = sched.run([FakeTuner(t, lambda r: 4e-3 / r) for t in TASKS[:2]], trials=400)
    assert result.stopped == "callback" and not result.interrupted
    assert result.models["model"] <= 2e-3 + 1e-12 and 0 < result.trials < 400


# ---------------------------------------------------------------------------------------------
# objectives (Table 2)


def view(weights, history=None, latencies=None, models=None) -> SchedulerView:
    w = np.asarray(weights, dtype=float)
    names = tuple(models or [f"m{j}" for j in range(w.shape[0])])
    hist = tuple(tuple(h) for h in (history or [[1.0]] * w.shape[1]))
    return SchedulerView(names, w, hist, np.asarray(latencies if latencies is not None else [1.0] * w.shape[1]))


def test_objective_values_and_gradients():
    v = view([[1, 2, 0], [0, 1, 1]], models=["a", "b"])
    g = np.array([1.0, 2.0, 3.0])  # model latencies: a = 5, b = 5
    assert TotalLatency()(g, v) == 10
    assert LatencyRequirements({"a": 6.0, "b": 4.0})(g, v) == 6 + 5
    np.testing.assert_allclose(objective_gradient(LatencyRequirements([6.0, 4.0]), g, v), [0, 1, 1], rtol=1e-6)
    speedup = GeoMeanSpeedup({"a": 10.0, "b": 20.0})
    assert speedup(g, v) == pytest.approx(-math.sqrt(2 * 4))
    s = math.sqrt(8)  # d/dL_j of -(prod B_j / L_j)^(1/m) is S / (m L_j)
    np.testing.assert_allclose(objective_gradient(speedup, g, v), [s / 10, s / 10 * 2 + s / 10, s / 10], rtol=1e-3)


def test_f2_spends_nothing_on_a_model_that_meets_its_requirement():
    models = [ModelTasks("fast", (0, 1), (1, 1)), ModelTasks("slow", (2, 3), (1, 1))]
    curves = [lambda r: 1e-3 / r] * 4
    objective = LatencyRequirements({"fast": 1.0, "slow": 1e-9})  # "fast" is met from the start
    _, order, _ = run_fake(curves, trials=4 * 20, weights=models, objective=objective, eps_greedy=0.0)
    assert order[:4] == [0, 1, 2, 3] and set(order[4:]) == {2, 3}
    met = run_fake(curves, trials=4 * 20, weights=models, objective=LatencyRequirements([1.0, 1.0]))[0]
    assert met.stopped == "converged" and met.rounds == 4


def test_f3_weighs_relative_not_absolute_gains():
    models = [ModelTasks("a", (0,), (1,)), ModelTasks("b", (1,), (1,))]
    tasks = [TASKS[0], TASKS[4]]  # not similar (FLOPs 3.4x apart): only the objective differs
    curves = [lambda r: 1e-2 / r, lambda r: 1e-3 / r]  # model a is 10x slower; both halve in 2 rounds
    _, f1_order, _ = run_fake(curves, trials=4 * 20, weights=models, tasks=tasks, eps_greedy=0.0)
    _, f3_order, _ = run_fake(curves, trials=4 * 20, weights=models, tasks=tasks,
                              objective=GeoMeanSpeedup([1e-2, 1e-2]), eps_greedy=0.0)
    assert f1_order.count(0) >= 3 * f1_order.count(1)  # f1: the absolute latency of a dominates
    assert abs(f3_order.count(0) - f3_order.count(1)) <= 2  # f3: the same relative speedup from either


def test_f4_and_early_stopping_stop_stalled_tasks():
    curves = [flat(1e-3), lambda r: 1e-4 / r]  # task 0 weighs 10x more but never improves
    _, f1_order, _ = run_fake(curves, trials=4 * 20, weights=[10, 1], eps_greedy=0.0)
    result, f4_order, _ = run_fake(curves, trials=4 * 20, weights=[10, 1], objective=EarlyStopping(2),
                                   eps_greedy=0.0)
    assert f1_order.count(0) > 10 and f4_order.count(0) == 3  # warm-up + 2 rounds without improvement
    stalled_all = run_fake([flat(1e-3), flat(2e-3)], trials=400, objective=EarlyStopping(2), eps_greedy=0.0)[0]
    assert stalled_all.stopped == "converged" and [r.rounds for r in stalled_all.rows] == [3, 3]
    hard = run_fake([flat(1e-3), lambda r: 1e-3 / r], trials=4 * 12, strategy="round-robin", early_stopping=2)
    assert [r.rounds for r in hard[0].rows] == [3, 9]
    exhausted = run_fake([flat(1e-3)], trials=400, early_stopping=1)[0]
    assert exhausted.stopped == "exhausted" and exhausted.rounds == 2


# ---------------------------------------------------------------------------------------------
# resume, models sharing tasks, progress


def test_resume_from_recorded_costs():
    old = FakeTuner(TASKS[0], lambda r: 1e-3 / r, costs=[5e-3] * 4 + [math.inf] * 4 + [2e-3] * 3)
    result, order, tuners = run_fake([old, flat(1e-3)], trials=4 * 3, eps_greedy=0.0)
    assert tuners[0].resumed == 1 and tuners[1].resumed == 1
    assert order[0] == 1  # only the task without records is warmed up
    assert result.rows[0].trials == 11 + 4 * order.count(0) and result.rows[0].rounds == 3 + order.count(0)
    sched = TaskScheduler(TASKS[:1], config=SchedulerConfig(round_trials=4))
    history = []
    sched.callbacks = (lambda p: history.append(p.rows[0].latency),)
    sched.run([FakeTuner(TASKS[0], flat(1.0), costs=[5e-3] * 4 + [math.inf] * 4 + [2e-3] * 3)], trials=0)
    assert history == [2e-3]


def test_models_share_tasks():
    t0, t1, t2 = TASKS[:3]
    class Extracted:  # like tensorgen.graph.backend.tasks.ModelTask
        def __init__(self, task, weight):
            self.task, self.weight = task, weight

    sched = TaskScheduler.from_models({"a": [(t0, 1), (t1, 2)], "b": [Extracted(t1, 1), (t2, 3), (t1, 1)]},
                                      config=SchedulerConfig(round_trials=4))
    assert sched.tasks == [t0, t1, t2]
    np.testing.assert_array_equal(sched.weights, [[1, 2, 0], [0, 2, 3]])
    result = sched.run([FakeTuner(t, flat(c)) for t, c in zip(sched.tasks, (1e-3, 2e-3, 3e-3))], trials=12)
    assert result.models == pytest.approx({"a": 1e-3 + 4e-3, "b": 4e-3 + 9e-3})
    assert [r.weight for r in result.rows] == [1, 4, 3]


def test_progress_table_tty_and_plain():
    tasks = [gmm_task(16), relu_task(32)]
    streams = {tty: io.StringIO() for tty in (True, False)}
    tables = [ProgressTable(streams[tty], tty=tty) for tty in streams]
    seen: list[SchedulerProgress] = []
    sched = TaskScheduler(tasks, [2, 1], config=SchedulerConfig(round_trials=4), callbacks=[*tables, seen.append])
    sched.run([FakeTuner(tasks[0], lambda r: 1e-5 / r), FakeTuner(tasks[1], flat(2e-6))], trials=12)
    for table in tables:
        table.close()
    last = seen[-1]
    assert [p.phase for p in seen] == ["resume", "round", "round", "round"] and last.trials_done == 12
    assert last.models["model"] == pytest.approx(2 * 1e-5 / 2 + 2e-6) and last.objective == last.models["model"]
    lines = format_table(last)
    assert lines[0].split("|")[1:-1] == [" ID ", " Task     ", " FLOPs ", " Weight ", " Latency (ms) ", " GFLOP/s ",
                                         " Trials "]
    assert "GMM(16)" in lines[2] and "0.0050" in lines[2] and "8" in lines[2].split("|")[-2]
    assert lines[-2] == "Estimated total latency: model 0.0120 ms"
    tty, plain = streams[True].getvalue(), streams[False].getvalue()
    assert tty.count("\x1b[J") == 3 and "\x1b" not in plain
    assert plain.count("[schedule] round") == 3 and plain.count("Estimated total latency") == 2


def test_bad_arguments():
    with pytest.raises(SchedulerError, match="same workload"):
        TaskScheduler([TASKS[0], gmm_task(16)])
    with pytest.raises(SchedulerError, match="2 numbers"):
        TaskScheduler(TASKS[:2], [1.0])
    with pytest.raises(SchedulerError, match="indices in"):
        TaskScheduler(TASKS[:2], [ModelTasks("m", (0, 2), (1, 1))])
    with pytest.raises(SchedulerError, match=">= 0"):
        TaskScheduler(TASKS[:2], [1.0, -1.0])
    with pytest.raises(SchedulerError, match="expected \\(task, weight\\) items"):
        TaskScheduler.from_models({"m": [TASKS[0]]})
    with pytest.raises(SchedulerError, match="unknown strategy"):
        TaskScheduler(TASKS[:2], config=SchedulerConfig(strategy="greedy"))
    with pytest.raises(SchedulerError, match="no value for model"):
        TaskScheduler(TASKS[:2], objective=GeoMeanSpeedup({"other": 1.0}))
    with pytest.raises(SchedulerError, match="must return a number"):
        TaskScheduler(TASKS[:2], objective=lambda g, v: "fast")
    with pytest.raises(SchedulerError, match="one policy per task"):
        from tensorgen.search.random_policy import RandomPolicy

        TaskScheduler(TASKS[:1]).tune(4, policy=RandomPolicy(TASKS[0]))


# ---------------------------------------------------------------------------------------------
# the real tuner


def test_end_to_end_with_the_real_tuner_and_resume(tmp_path, monkeypatch):
    """Ansor's policy with one shared cost model, then the random policy resuming from the same database; the
    first run's first relu measurement is made a timeout, which the second run measures again."""
    tasks = [gmm_task(16), relu_task(32)]
    path = tmp_path / "model.db"
    plain = io.StringIO()
    table = ProgressTable(plain, tty=False)
    sched = TaskScheduler(tasks, [1, 2], config=SchedulerConfig(round_trials=4), callbacks=[table])
    model = XGBModel(seed=0)  # Ansor: one cost model learns from every task
    tiny = {"population": 64, "generations": 1, "init_population": 32, "workers": 1}
    run_each, timed_out = LocalRunner.run_each, []

    def one_timeout(runner, inputs, built):
        for i, res in run_each(runner, inputs, built):
            if not timed_out and inputs[i].task.workload_key == tasks[1].workload_key:
                timed_out.append(i)
                res = MeasureResult((), ErrorKind.RUN_TIMEOUT, "made a timeout by the test")
            yield i, res

    with monkeypatch.context() as patch:
        patch.setattr(LocalRunner, "run_each", one_timeout)
        first = sched.tune(12, db=path, policy="ansor", cost_model=model, policy_options=tiny,
                           measure=MeasureConfig(build_timeout=20.0, run_timeout=5.0))
    assert timed_out
    table.close()
    assert model.num_samples == 12
    assert first.stopped == "budget" and first.trials == 12 and all(r.rounds >= 1 for r in first.rows)
    assert all(0 < r.latency < math.inf for r in first.rows)
    assert first.models["model"] == pytest.approx(first.rows[0].latency + 2 * first.rows[1].latency)
    rng = np.random.default_rng(0)
    a, b = (rng.random((1, 16, 16), dtype=np.float32) for _ in range(2))
    np.testing.assert_allclose(build(first.best_states[0]).run(a, b)[0], a @ b, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((32, 32)).astype(np.float32)
    np.testing.assert_array_equal(build(first.best_states[1]).run(x)[0], np.maximum(x, 0))
    assert "Estimated total latency" in plain.getvalue()
    # the time split: every part was spent, and together they fit in the run's wall time
    assert 0 < first.search_s and 0 < first.build_s and 0 < first.run_s
    assert first.search_s + first.build_s + first.run_s <= first.wall_s
    assert first.to_dict()["run_s"] == first.run_s

    # relu(32) has few distinct programs: it may run out, and the scheduler then drops it
    with SQLiteDatabase(path) as db:  # a program that failed for the machine's sake (a timeout under load) is
        stored = [db.records(t.workload_key, "cpu") for t in tasks]  # not resumed: it is measured again
    again = [sum(measure_again([r.result for r in rs if r.steps_hash == h]) for h in {r.steps_hash for r in rs})
             for rs in stored]
    second = sched.tune(4, db=path, policy="random", measure=MeasureConfig(build_timeout=20.0, run_timeout=5.0))
    # resumed counts continue; a program measured again is one trial of this call, not a new program
    assert again[1] >= 1 and second.trials == 4 and 16 - sum(again) <= sum(r.trials for r in second.rows) <= 16
    # the resumed records count as rounds of 4; a round that found fewer than 4 programs to measure takes another
    resumed = sum(math.ceil((r.trials - a) / 4) for r, a in zip(first.rows, again))
    assert second.rounds >= 1 and sum(r.rounds for r in second.rows) == resumed + second.rounds
    assert all(s <= f for s, f in zip(second.best_costs, first.best_costs))
    with SQLiteDatabase(path) as db:
        records = [db.records(t.workload_key, "cpu") for t in tasks]
    assert [len({r.steps_hash for r in rs}) for rs in records] == [r.trials for r in second.rows]
    for rs, best in zip(records, second.best_states):  # each best was re-timed: 1 + RETIMES measurements
        assert sum(r.ok and r.steps_hash == steps_hash(best.to_json()) for r in rs) == 1 + RETIMES


def test_model_tuning_times_candidates_with_their_weights_evicted(monkeypatch):
    """A model's kernels find their weights in memory (the other kernels' weights were read in between)."""
    import tensorgen.tuning.scheduler as scheduler

    class Seen(Exception):
        pass

    real_open = scheduler.MeasureSetup.open

    def capture(db, config):
        with real_open(db, config) as setup:
            raise Seen(setup.runner)

    monkeypatch.setattr(scheduler.MeasureSetup, "open", capture)
    with pytest.raises(Seen) as seen:
        TaskScheduler([gmm_task(16)]).tune(4)
    assert seen.value.args[0].evict_weights and seen.value.args[0].check_correctness
