"""ALT (tensorgen.search.layouts, tensorgen.tuning.alt): layout templates and joint layout + loop tuning."""

from __future__ import annotations

import numpy as np
import pytest
from search_tasks import make_task

from tensorgen.build import build
from tensorgen.costmodel.base import RandomModel
from tensorgen.records.database import SQLiteDatabase
from tensorgen.schedule.laid_out import lay_out
from tensorgen.schedule.layout import Layout
from tensorgen.schedule.state import State, state_layouts
from tensorgen.search.alt_policy import exploration_rungs, layout_candidates, layout_key
from tensorgen.search.annotate import sample_initial_population
from tensorgen.search.layouts import LAYOUT_TEMPLATES, TilingTemplate, tiled
from tensorgen.search.sketch import generate_sketches
from tensorgen.te import ops
from tensorgen.te.tensor import placeholder
from tensorgen.tuning.alt import AltConfig, tune_alt


def gmm_relu(m=32, n=48, k=40):
    (a, b), (c,) = ops.make_gmm(m, n, k)
    return make_task([a, b], [ops.relu(c)], cores=2)


def test_the_gmm_template_tiles_every_operand_with_shared_tiles():
    """ALT §5.1's GMM template: C (M/mt, N/nt, mt, nt), A (M/mt, K/kt, mt, kt), B (K/kt, N/nt, kt, nt); the
    output layout propagates to the element-wise ReLU after it."""
    task = gmm_relu()
    template = LAYOUT_TEMPLATES["tiling"]
    space = template.space(task.dag)
    _, i, j = (a.name for a in task.dag.by_name[space.anchor].axes)  # make_gmm: (batch of 1, M, N)
    kk = task.dag.by_name[space.anchor].reduce_axes[0].name
    layouts = template.layouts(task.dag, {i: 8, j: 16, kk: 4})
    shapes = {name: Layout.of(task.dag.by_name[name].shape, prims).new_shape for name, prims in layouts.items()}
    assert shapes == {"A": (1, 4, 10, 8, 4), "B": (1, 10, 3, 4, 16),
                      "batch_matmul": (1, 4, 3, 8, 16), "relu": (1, 4, 3, 8, 16)}


def test_an_operator_without_data_reuse_has_no_template():
    x = placeholder((4, 16), "float32", "x")
    assert LAYOUT_TEMPLATES["tiling"].space(make_task([x], [ops.relu(x)]).dag) is None


def test_tiled_leaves_untileable_dimensions_whole():
    assert tiled((6, 10), [1, 1]) == []
    assert Layout.of((6, 10), tiled((6, 10), [3, 4])).new_shape == (2, 10, 3)  # 4 does not divide 10: whole
    assert Layout.of((6, 10), tiled((6, 10), [3, 5])).new_shape == (2, 2, 3, 5)


def test_sampled_layouts_compute_the_same():
    task = gmm_relu()
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, t.shape).astype("float32") for t in task.dag.inputs)
    for layouts in layout_candidates(task, 6, "tiling", np.random.default_rng(3)):
        (out,) = build(State(lay_out(task.dag, layouts))).run(
            *(Layout.of(x.shape, layouts[t.name]).pack(x) if t.name in layouts else x
              for t, x in zip(task.dag.inputs, (a, b))))
        if "relu" in layouts:
            out = Layout.of((1, 32, 48), layouts["relu"]).unpack(out)
        np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_joint_then_loop_only_tuning_gives_a_replayable_state_of_the_task(tmp_path):
    task = gmm_relu()
    db = SQLiteDatabase(tmp_path / "alt.db")
    config = AltConfig(layouts=3, joint_fraction=0.75, exploration="halving")  # rungs: 1 trial each, 4 for the best
    result = tune_alt(task, 12, db=db, config=config, seed=0, batch_size=4)
    assert len(result.explored) == 3 and result.explored[0].layouts == {}  # the task's own layout competes
    assert result.best_state is not None and np.isfinite(result.best_cost) and result.trials == 12
    trials = sorted(t.trials for t in result.explored)  # rungs of 1 and 4 trials, then 5 on the best so far
    assert sum(trials) == 12 and trials[0] == 1 and trials[-1] >= 6
    assert layout_key(result.layouts) in {layout_key(t.layouts) for t in result.explored}
    replayed = State.from_json(task.dag, result.best_state.to_json())
    assert replayed.dag.workload_key == result.best_state.dag.workload_key
    record = db.best(task.workload_key, str(task.target))  # every record is the task's own: layouts, then loops
    assert record.sets_layouts == bool(result.layouts) and len(db.records(task.workload_key)) >= 12
    assert record.state(task.dag).dag.workload_key == result.best_state.dag.workload_key


def test_bad_alt_configs_are_refused():
    from tensorgen.errors import TuneError

    for bad in ({"layouts": 0}, {"joint_fraction": 0}, {"template": "nope"}, {"exploration": "ppo"}):
        with pytest.raises(TuneError):
            AltConfig(**bad)
    assert isinstance(LAYOUT_TEMPLATES["tiling"], TilingTemplate)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 8])
def test_successive_halving_spends_the_joint_budget_on_the_layouts_that_last(count):
    rungs = exploration_rungs(count, 64, "halving")
    alive, spent = count, 0
    for share in rungs:
        spent += alive * share
        alive = max(1, alive // 2)
    assert spent <= 64 and rungs == sorted(rungs)  # the survivors get more trials each rung
    assert exploration_rungs(count, 64, "uniform") == [64 // count]


@pytest.mark.parametrize(("conv", "tiles"), [
    ((8, 8, 16, 16, 3, 1, 1), {"h": 4, "w": 4, "co": 8, "rc": 8}),   # 3x3, padded input unfolded by 4 + 2 rows
    ((17, 17, 8, 16, 3, 2, 1), {"h": 3, "w": 1, "co": 8, "rc": 4}),  # stride 2: tiles of 3 outputs read 7 rows
    ((6, 6, 8, 8, 1, 1, 0), {"h": 3, "w": 2, "co": 4, "rc": 1}),     # 1x1: no overlap, nothing unfolded
])
def test_the_conv_template_unfolds_the_input_and_computes_the_same(conv, tiles):
    """ALT §5.1's convolution template: output N(H/ht)(W/wt)(O/ot) ht wt ot, input unfolded into the
    overlapping (ht + KH - 1) x (wt + KW - 1) windows its output tiles read, weight tiled."""
    from tensorgen.te.ops.suite import make_c2d

    inputs, (out,) = make_c2d(*conv)
    task = make_task(inputs, [ops.relu(out)], cores=2)
    template = LAYOUT_TEMPLATES["tiling"]
    layouts = template.layouts(task.dag, tiles)  # the conv's axes: n, h, w, co; rh, rw, rc
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, t.shape).astype("float32") for t in task.dag.inputs]
    (want,) = build(State(task.dag)).run(*arrays)
    dag = lay_out(task.dag, layouts)
    packed = [Layout.of(x.shape, layouts[t.name]).pack(x) if t.name in layouts else x
              for t, x in zip(task.dag.inputs, arrays)]
    laid_task = make_task(dag.inputs, dag.outputs, cores=2)
    states = [State(dag), *sample_initial_population(laid_task, generate_sketches(laid_task), 3,
                                                     np.random.default_rng(1))]
    out_name = task.dag.outputs[0].name
    for s in states:
        (got,) = build(s).run(*packed)
        if out_name in layouts:
            got = Layout.of(want.shape, layouts[out_name]).unpack(got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _drive(policy, rounds: int, batch: int, cost) -> list[list[int]]:
    """Run `policy` for `rounds` batches with made-up costs (`cost(layout index, state)`); each batch's layouts."""
    from tensorgen.measure.types import MeasureInput, MeasureResult

    seen = []
    for _ in range(rounds):
        states = policy.next_batch(batch)
        which = [policy.index[layout_key(state_layouts(s))] for s in states]
        seen.append(which)
        policy.update([MeasureInput(policy.task, s) for s in states],
                      [MeasureResult((cost(i, s),)) for i, s in zip(which, states)])
    return seen


def test_the_evolving_exploration_breeds_layouts_from_the_best_tiles():
    """"evolve": generations of one trial per layout; after each, the worse half is replaced by mutants of the
    better half (one tile changed); the loop-only stage then tunes the best layout found."""
    from tensorgen.search.alt_policy import AltPolicy

    task = gmm_relu()
    policy = AltPolicy(task, layouts=4, joint_trials=12, exploration="evolve", own_lead=0, population=16,
                       generations=0)
    assert policy.rungs == [1, 1, 1] and len(policy.candidates) == 4
    seen = _drive(policy, 7, 2, lambda i, s: 1e-3 / (1 + i))  # later candidates are "faster"; 3 generations of 4
    assert len(policy.candidates) > 4  # mutants joined
    for child in range(4, len(policy.candidates)):
        genes = policy.genes[child]
        assert any(sum(genes[a] != parent[a] for a in genes) == 1 for parent in policy.genes[:child] if parent)
    assert not policy.joint and seen[-1] == [policy.chosen] * 2 == [len(policy.candidates) - 1] * 2


@pytest.mark.parametrize("exploration", ["uniform", "halving"])
def test_the_joint_stage_gives_each_layout_its_share_then_tunes_the_best(exploration):
    from tensorgen.search.alt_policy import AltPolicy

    policy = AltPolicy(gmm_relu(), layouts=4, joint_trials=8, exploration=exploration, own_lead=0, population=16,
                       generations=0)
    seen = _drive(policy, 8, 2, lambda i, s: 1e-3 * (1 + (i == 2) * -0.5))  # layout 2 is the fast one
    counts = [policy.measured[i] for i in range(4)]
    assert sum(counts) == 16 and policy.chosen == 2 and seen[-1] == [2, 2]
    if exploration == "uniform":
        assert policy.rungs == [2] and counts[:2] == [2, 2]


def test_the_own_layout_leads_before_other_layouts_are_tried():
    """With a lead, the task's own layout gets the first trials (a task the scheduler gives one round is tuned as
    Ansor would); then every layout its share, and the best of them all."""
    from tensorgen.search.alt_policy import AltPolicy

    policy = AltPolicy(gmm_relu(), layouts=3, joint_trials=6, own_lead=4, population=16, generations=0)
    seen = _drive(policy, 6, 2, lambda i, s: 1e-3 * (1 + (i == 1) * -0.5))  # layout 1 is the fast one
    assert seen[:2] == [[0, 0], [0, 0]] and seen[2] == [0, 0]  # the lead, then the own layout's share of 2
    assert [policy.measured[i] for i in range(3)] == [6, 4, 2] and seen[-1] == [1, 1]


def test_a_laid_out_conv_fuses_its_epilogue():
    """A batch-1 tensor's laid-out index reads 0 on its batch axis (extent 1): the ReLU still reads the conv at its
    own axes, so a sketch computes the conv inside the ReLU's tiles (the epilogue fused, as in the plain DAG)."""
    import search_tasks

    from tensorgen.search.alt_policy import laid_out_task
    from tensorgen.search.rules import fusible_consumer

    task = search_tasks.c2d_relu()
    template = LAYOUT_TEMPLATES["tiling"]
    laid = laid_out_task(task, template.layouts(task.dag, template.space(task.dag).sample(np.random.default_rng(0))))
    state = State(laid.dag)
    conv = next(i for i, s in enumerate(state.stages) if s.name == "conv2d")
    assert fusible_consumer(state, conv) is not None
    assert any(s.stage("conv2d").attach is not None and s.stage("conv2d").attach[0] == "relu"
               for s in generate_sketches(laid))


def test_the_template_may_store_a_bias_in_its_weight_and_computes_the_same():
    """A dense layer with a constant bias: the template's STORE_AT gene stores the bias at the end of the weight's
    reduction dimension (left untiled); every sampled layout, stored or not, computes x @ w + bias."""
    from test_layout_dag import M, N, dense_bias

    from tensorgen.search.layouts import STORE_AT

    inputs, out = dense_bias()
    task = make_task(inputs, [out], cores=2)
    template = LAYOUT_TEMPLATES["tiling"]
    space = template.space(task.dag)
    assert space.choices[STORE_AT] == (0, 1)
    rng = np.random.default_rng(0)
    x, w, bias = (rng.uniform(-1, 1, t.shape).astype("float32") for t in task.dag.inputs)
    arrays = {"x": x, "w": w, "bias": bias}
    seen = set()
    for _ in range(8):
        layouts = template.layouts(task.dag, space.sample(rng))
        dag = lay_out(task.dag, layouts)
        stored = "bias" not in {t.name for t in dag.inputs}
        seen.add(stored)
        assert stored == any(p.name == "store_at" for p in layouts.get("w", []))
        args = [Layout.of(t.shape, layouts[t.name]).pack(arrays[t.name], arrays) if t.name in layouts
                else arrays[t.name] for t in task.dag.inputs if t.name in {u.name for u in dag.inputs}]
        (got,) = build(State(dag)).run(*args)
        if "z" in layouts:
            got = Layout.of((M, N), layouts["z"]).unpack(got)
        np.testing.assert_allclose(got, x @ w + bias, rtol=1e-5, atol=1e-5)
    assert seen == {True, False}


class _Sure(RandomModel):
    """Random scores that the search takes as trained (the screen's predictions are set by the test)."""

    trained = True


def test_the_cost_model_screens_the_layouts_it_predicts_slower(monkeypatch):
    """After the own layout's lead, a layout whose predicted best is below SCREEN of the own layout's is never
    measured; its joint share goes to the loop-only stage, and the layouts that pass compete as before."""
    from tensorgen.search.alt_policy import SCREEN, AltPolicy

    predicted = {0: 1.0, 1: SCREEN * 0.99, 2: 1.3}
    monkeypatch.setattr(AltPolicy, "_predicted_best", lambda self, i, seeds: predicted[i])
    policy = AltPolicy(gmm_relu(), _Sure(), layouts=3, joint_trials=6, own_lead=4, population=16, generations=0)
    seen = _drive(policy, 6, 2, lambda i, s: 1e-3 * (1 + (i == 2) * -0.5))  # layout 2 is the fast one
    assert seen[:3] == [[0, 0]] * 3 and policy.screened_out == [1]  # the lead, own's share, then the screen
    assert [policy.measured[i] for i in range(3)] == [6, 0, 6] and seen[-1] == [2, 2]
    unscreened = AltPolicy(gmm_relu(), _Sure(), layouts=3, joint_trials=6, own_lead=4, screen=None, population=16,
                           generations=0)
    _drive(unscreened, 6, 2, lambda i, s: 1e-3)
    assert unscreened.screened_out == [] and [unscreened.measured[i] for i in range(3)] == [8, 2, 2]


def test_the_screen_predicts_with_the_shared_model_after_real_measurements(tmp_path, monkeypatch):
    """tune_alt with XGBoost and a lead: the screen scores every layout with the model the own layout's
    measurements trained (finite scores), and the tuning ends with its budget spent."""
    from tensorgen.search.alt_policy import AltPolicy

    scores = []
    predicted_best = AltPolicy._predicted_best
    monkeypatch.setattr(AltPolicy, "_predicted_best", lambda self, i, seeds: scores.append(
        predicted_best(self, i, seeds)) or scores[-1])
    from tensorgen.costmodel.xgb import XGBModel
    from tensorgen.tuning.tune import tune

    task = gmm_relu()
    policy = AltPolicy(task, XGBModel(seed=0, min_samples=8), layouts=3, own_lead=12, population=32, generations=1)
    result = tune(task, 24, db=tmp_path / "s.db", policy=policy, batch_size=4)
    assert len(scores) == 3 and all(np.isfinite(scores))  # the own layout's, then each other's
    assert policy.screened and result.best_cost < np.inf


def test_the_other_layouts_start_from_the_own_layouts_best_loops(monkeypatch):
    """A layout of the weight only keeps the loop nest: its search's first batch measures the own layout's best
    loops over it (the layouts compete at the same loops, not a tuned program against random ones)."""
    from tensorgen import te
    from tensorgen.measure.types import MeasureInput, MeasureResult
    from tensorgen.schedule.state import loop_steps
    from tensorgen.search.alt_policy import AltPolicy

    x = te.placeholder((32, 40), name="x")
    w = te.placeholder((40, 48), name="w", constant=True)
    k = te.reduce_axis(40, "k")
    y = te.compute((32, 48), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
    task = make_task([x, w], [y], cores=2)
    monkeypatch.setitem(LAYOUT_TEMPLATES, "weights", TilingTemplate(name="weights", constants_only=True))
    policy = AltPolicy(task, layouts=2, joint_trials=4, own_lead=2, template="weights", screen=None, population=16,
                       generations=0)
    own, costs = [], [4e-3, 3e-3, 1e-3, 2e-3]  # the third program is the own layout's best
    for _ in range(2):  # the lead and the own layout's share
        batch = policy.next_batch(2)
        assert all(not state_layouts(s) for s in batch)
        policy.update([MeasureInput(task, s) for s in batch],
                      [MeasureResult((costs[len(own) + n],)) for n in range(len(batch))])
        own += batch
    challenger = policy.next_batch(2)
    assert all(state_layouts(s) for s in challenger)
    assert loop_steps(own[2]) in [loop_steps(s) for s in challenger]


SMALL_SUITE = {  # every operator family of the suite at a small shape, batch 2 (the template tiles N too)
    "C1D": (20, 8, 16, 3, 2, 1), "C2D": (9, 9, 4, 8, 3, 2, 1), "C3D": (4, 6, 6, 4, 8, 3, 1, 1),
    "GMM": (16, 24, 8), "GRP": (8, 8, 8, 16, 3, 1, 1, 4), "DIL": (12, 12, 4, 8, 3, 1, 2, 2),
    "DEP": (8, 8, 16, 3, 1, 1), "T2D": (4, 4, 8, 8, 4, 2, 1), "CAP": (6, 6, 4, 8, 3, 1, 1, 2),
    "ConvLayer": (8, 8, 4, 8, 3, 1, 1), "TBS": (8, 4, 16),
}


@pytest.mark.parametrize("op", sorted(SMALL_SUITE))
def test_every_operator_familys_template_layouts_compute_the_same(op):
    """The tiling template on each operator family of the suite (conv 1-d/2-d/3-d, grouped, dilated, depthwise,
    transposed, capsule, conv + epilogue, GEMM, batched transposed matmul): a few sampled layouts of its operands
    and output, laid out, compute what the task does, checked with NumPy-packed arrays."""
    from tensorgen.te.ops.suite import SUITE

    make, _ = SUITE[op]
    inputs, outputs = make(*SMALL_SUITE[op], batch=2)
    task = make_task(inputs, outputs, cores=2)
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, t.shape).astype("float32") for t in task.dag.inputs]
    want = build(State(task.dag)).run(*arrays)
    candidates = layout_candidates(task, 4, "tiling", np.random.default_rng(1))
    assert len(candidates) >= 2, f"{op}: the template offers no layout"
    for layouts in candidates[1:]:
        packed = [Layout.of(x.shape, layouts[t.name]).pack(x) if t.name in layouts else x
                  for t, x in zip(task.dag.inputs, arrays)]
        got = build(State(lay_out(task.dag, layouts))).run(*packed)
        for t, g, w in zip(task.dag.outputs, got, want):
            g = Layout.of(w.shape, layouts[t.name]).unpack(g) if t.name in layouts else g
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{op} {layouts}")
