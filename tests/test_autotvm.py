"""AutoTVM (search.autotvm): spaces, templates, simulated annealing and the tuner as policy "autotvm"."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensorgen
from tensorgen import te
from tensorgen.costmodel.base import RandomModel
from tensorgen.dag import ComputeDAG
from tensorgen.errors import ScheduleError, TuneError
from tensorgen.examples import conv2d_nhwc_reference
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.schedule.state import State
from tensorgen.search.autotvm.anneal import AnnealConfig, SimulatedAnnealing
from tensorgen.search.autotvm.space import ConfigSpace, OtherOptionKnob, SpaceBuilder, SplitKnob, factorizations
from tensorgen.search.autotvm.templates import TEMPLATES, template_for
from tensorgen.search.autotvm.tuner import AutoTVMConfig, AutoTVMPolicy
from tensorgen.te import ops
from tensorgen.te.ops.suite import make_c2d, make_gmm
from tensorgen.tuning.tune import MeasureConfig, make_task


def gmm(n: int, m: int, k: int) -> ComputeDAG:
    inputs, outputs = make_gmm(n, m, k)
    return ComputeDAG(inputs + outputs)


def conv(padding: int = 1) -> ComputeDAG:
    inputs, outputs = make_c2d(6, 6, 4, 8, 3, 1, padding)
    return ComputeDAG(inputs + outputs)


def softmax() -> ComputeDAG:
    x = te.placeholder((4, 16), name="X")
    return ComputeDAG([x, ops.softmax(x)])


def elementwise() -> ComputeDAG:
    x = te.placeholder((4, 6, 8), name="X")
    return ComputeDAG([x, ops.relu(ops.add(x, 1.0))])


def numpy_of(name: str, args: list[np.ndarray]) -> np.ndarray:
    if name == "gmm":
        return args[0] @ args[1]
    if name.startswith("conv"):
        return conv2d_nhwc_reference(args[0], args[1], padding=1 if name == "conv" else 0)
    if name == "softmax":
        e = np.exp(args[0] - args[0].max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return np.maximum(args[0] + 1.0, 0.0)


DAGS = {"gmm": lambda: gmm(16, 24, 8), "conv": conv, "conv_nopad": lambda: conv(0), "softmax": softmax,
        "elementwise": elementwise}


def space_of(template, dag: ComputeDAG) -> ConfigSpace:
    builder = SpaceBuilder()
    template.define(builder, dag)
    return builder.space()


def test_dense_space_has_the_size_its_knobs_imply_and_indices_round_trip():
    name, template = template_for(gmm(64, 32, 48))
    assert name == "dense"
    space = space_of(template, gmm(64, 32, 48))
    assert [k.name for k in space.knobs] == ["tile_y", "tile_x", "tile_k", "k_inside_rows", "vectorize",
                                              "auto_unroll"]
    # 64 = 2^6 into 3 ordered factors: C(8, 2); 32 = 2^5: C(7, 2); 48 = 2^4 * 3 into 2: its 10 divisors
    assert space.size == 28 * 21 * 10 * 2 * 2 * 4
    assert len(factorizations(48, 2)) == 10 and all(math.prod(f) == 12 for f in factorizations(12, 3))
    for index in np.random.default_rng(0).integers(space.size, size=50).tolist() + [0, space.size - 1]:
        config = space.config(index)
        assert space.index(space.choices(index)) == index == config.index
        assert math.prod(config["tile_y"]) == 64 and math.prod(config["tile_k"]) == 48
    with pytest.raises(TuneError, match="outside the space"):
        space.choices(space.size)


def test_neighbours_change_exactly_one_knob():
    space = ConfigSpace([SplitKnob("a", 12, 2), OtherOptionKnob("b", (1,)), OtherOptionKnob("c", (0, 1, 2))])
    rng = np.random.default_rng(1)
    points = space.random(rng, 200)
    moved = space.neighbours(points, rng)
    assert ((moved != points).sum(axis=1) == 1).all() and (moved[:, 1] == 0).all()
    assert (moved < space.lengths).all() and space.features(moved).shape == (200, 2 + 1 + 1)


@pytest.mark.parametrize("name", list(DAGS))
def test_sampled_configs_apply_lower_and_equal_numpy(name):
    """Configs of the template `auto` picks (and the generic one) build programs equal to NumPy."""
    dag = DAGS[name]()
    rng = np.random.default_rng(0)
    args = [rng.random(t.shape, dtype=np.float32) for t in dag.inputs]
    expected = numpy_of(name, args)
    picked, _ = template_for(dag)
    assert picked == {"gmm": "dense", "conv": "conv2d", "conv_nopad": "conv2d"}.get(name, "generic")
    for template_name in {picked, "generic"}:
        _, template = template_for(dag, template_name)
        space = space_of(template, dag)
        for index in rng.choice(space.size, 3, replace=False).tolist():
            (got,) = tensorgen.build(template.apply(dag, space.config(index))).run(*args)
            np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{template_name} config {index}")


def test_annealing_finds_the_optimum_sooner_than_random():
    """A synthetic score (peaked at one config of 10^8) that the annealing climbs and random sampling,
    given as many evaluations, does not reach."""
    space = ConfigSpace([OtherOptionKnob(f"k{i}", tuple(range(10))) for i in range(8)])
    target = np.array([3, 7, 1, 9, 0, 5, 2, 8])
    evaluated = []

    def score(points: np.ndarray) -> np.ndarray:
        evaluated.append(len(points))
        return -np.abs(points - target).sum(axis=1).astype(float)

    anneal = SimulatedAnnealing(space, np.random.default_rng(0), AnnealConfig(chains=32, steps=300))
    best = anneal.search(score, plan_size=4)
    assert best[0] == tuple(target.tolist())
    random_best = score(space.random(np.random.default_rng(0), sum(evaluated))).max()
    assert random_best < 0  # the optimum scores 0
    assert anneal.search(score, 4, excluded={tuple(target.tolist())})[0] != tuple(target.tolist())


def test_tune_autotvm_measures_valid_programs_and_the_best_equals_numpy():
    dag = gmm(32, 32, 32)
    result = tensorgen.tune(dag, 16, policy="autotvm", batch_size=8,
                            measure=MeasureConfig(build_timeout=20.0, run_timeout=5.0))
    assert result.trials == 16 and result.best_state is not None and result.best_gflops > 0
    assert not result.skipped
    rng = np.random.default_rng(0)
    a, b = (rng.random((1, 32, 32), dtype=np.float32) for _ in range(2))
    (c,) = tensorgen.build(result.best_state).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


class BrokenTemplate:
    """Applies only to DAGs with a stage named `autotvm_broken`, and fails on every config."""

    def condition(self, dag: ComputeDAG) -> bool:
        return any(t.name == "autotvm_broken" for t in dag.compute_tensors)

    def define(self, space: SpaceBuilder, dag: ComputeDAG) -> None:
        space.option("anything", (0, 1))

    def apply(self, dag: ComputeDAG, config) -> State:
        raise ScheduleError("this template schedules nothing")


TEMPLATES.register("broken_for_tests", BrokenTemplate, replace=True)


@pytest.mark.parametrize("options, message", [
    ({"template": "nope"}, "unknown autotvm template 'nope'; choose one of dense, conv2d, generic"),
    ({"template": "conv2d"}, "autotvm template 'conv2d' does not apply to the DAG of batch_matmul"),
    ({"chians": 4}, "the autotvm policy has no knob 'chians'"),
    ({"eps_greedy": 2.0}, "need plan_size >= 1, 0 <= eps_greedy <= 1"),
])
def test_a_bad_template_or_knob_is_one_line(options, message):
    with pytest.raises(TuneError) as err:
        tensorgen.tune(gmm(8, 8, 8), 4, policy="autotvm", policy_options=options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_gpu_target_is_one_line():
    with pytest.raises(TuneError, match="^the autotvm templates are CPU schedules; target cuda -emulate=1 is not a "
                                        "CPU$"):
        tensorgen.tune(gmm(8, 8, 8), 4, policy="autotvm", target="cuda -emulate=1")


def test_a_template_that_fails_is_skipped_not_a_traceback():
    x = te.placeholder((8,), name="X")
    dag = ComputeDAG([x, ops.relu(x, name="autotvm_broken")])
    result = tensorgen.tune(dag, 4, policy="autotvm")
    assert result.trials == 0 and result.best_state is None and result.skipped == {"autotvm template": 2}


def test_max_factor_bounds_the_inner_loops():
    knob = SplitKnob("t", 4096, 3, max_factor=64)
    assert knob.options and all(max(f[1:]) <= 64 and math.prod(f) == 4096 for f in knob.options)
    assert len(knob.options) < len(SplitKnob("t", 4096, 3).options)


class GlobalModel(RandomModel):
    """A 'trained' model of other tasks that scores a program by the sum of its features (and keeps the scores)."""

    trained = True
    scored: list[float] = []

    def predict(self, features):
        self.scored = [float(f.sum()) for f in features]
        return np.array(self.scored)


def test_a_trained_session_model_ranks_the_first_batch():
    """Transfer: the session's trained model (the global model) picks the first batch: the best 8 of its pool."""
    task = make_task(gmm(32, 32, 32))
    config = AutoTVMConfig(eps_greedy=0.0, plan_size=8, transfer_pool=4)
    model = GlobalModel()
    batch = AutoTVMPolicy(task, config=config, global_model=model).next_batch(8)
    chosen = sorted(float(f.sum()) for f in FeatureExtractor(task.hw).extract(batch))
    assert len(model.scored) == 32 and chosen == pytest.approx(sorted(model.scored)[-8:])
    untrained = AutoTVMPolicy(task, config=config, global_model=RandomModel())
    assert untrained.global_model is None and not untrained.plan
