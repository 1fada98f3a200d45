"""Tensors of a DAG laid out by layout primitives (tensorgen.schedule.laid_out.lay_out): inputs, intermediates and
outputs in new layouts compute what NumPy computes, under the default schedule and under sampled schedules."""

from __future__ import annotations

import numpy as np
import pytest
from search_tasks import make_task

from tensorgen.build import build
from tensorgen.errors import ScheduleError
from tensorgen.schedule.laid_out import lay_out
from tensorgen.schedule.layout import Fuse, Layout, Pad, Reorder, Split, StoreAt, Unfold
from tensorgen.schedule.state import State
from tensorgen.search.annotate import sample_initial_population
from tensorgen.search.sketch import generate_sketches
from tensorgen.te import ops

M, N, K = 32, 48, 40
# make_gmm's tensors have a batch dimension of 1 first: A (1, M, K), B (1, K, N), C (1, M, N)
BLOCKED = [Split(1, (M // 4, 4)), Split(3, (N // 16, 16)), Reorder((0, 1, 3, 2, 4))]  # (1, M/4, N/16, 4, 16)
PANELS = [Split(2, (N // 8, 8)), Reorder((0, 2, 1, 3))]  # B as (1, N/8, K, 8)
LAYOUTS = {
    "B packed by column panels": {"B": PANELS},
    "B padded then split": {"B": [Pad(2, 16), Split(2, (4, 16)), Reorder((0, 2, 1, 3))]},
    "intermediate blocked": {"batch_matmul": BLOCKED},
    "intermediate padded": {"batch_matmul": [Pad(2, 16), Split(2, (4, 16)), Reorder((0, 2, 1, 3))]},
    "output blocked": {"relu": BLOCKED},
    "all three": {"B": PANELS, "batch_matmul": BLOCKED, "relu": [Fuse(1, 2), Split(1, (M * N // 96, 96))]},
}


def gmm_relu():
    (a, b), (c,) = ops.make_gmm(M, N, K)
    return (a, b), ops.relu(c)


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    return rng.uniform(-1, 1, (1, M, K)).astype("float32"), rng.uniform(-1, 1, (1, K, N)).astype("float32")


def _run(state: State, layouts, a, b) -> np.ndarray:
    packed_b = Layout.of(b.shape, layouts["B"]).pack(b) if "B" in layouts else b
    (out,) = build(state).run(a, packed_b)
    return Layout.of((1, M, N), layouts["relu"]).unpack(out) if "relu" in layouts else out


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_laid_out_tensors_compute_the_same(case, operands):
    a, b = operands
    layouts = LAYOUTS[case]
    inputs, out = gmm_relu()
    task = make_task(inputs, [out], cores=2)
    dag = lay_out(task.dag, layouts)
    for name, prims in layouts.items():
        assert dag.by_name[name].shape == Layout.of(task.dag.by_name[name].shape, prims).new_shape
        assert dag.by_name[name].attrs["layout"] == [p.to_json() for p in prims]
    want = np.maximum(a @ b, 0)
    np.testing.assert_allclose(_run(State(dag), layouts, a, b), want, rtol=1e-5, atol=1e-5)
    laid_task = make_task(dag.inputs, dag.outputs, cores=2)
    states = sample_initial_population(laid_task, generate_sketches(laid_task), 4, np.random.default_rng(1))
    assert states
    for s in states:  # the search's own schedules of the laid-out DAG (tiling, fusion, packing, parallel)
        np.testing.assert_allclose(_run(s, layouts, a, b), want, rtol=1e-5, atol=1e-5)


def test_a_blocked_output_is_computed_over_its_new_loops():
    inputs, out = gmm_relu()
    original = make_task(inputs, [out]).dag
    dag = lay_out(original, {"relu": BLOCKED})
    relu = dag.by_name["relu"]
    assert relu.shape == (1, M // 4, N // 16, 4, 16)
    _, i, j = (ax.name for ax in original.by_name["relu"].axes)
    assert [ax.name for ax in relu.axes] == ["ax0", f"{i}4", f"{j}16", f"{i}1", f"{j}1"]


@pytest.mark.parametrize(("layouts", "message"), [
    ({"X": [Split(0, (2, 16))]}, "no tensor"),
    ({"B": [Unfold(1, 4, 2)]}, "not an output axis times a stride"),  # B's k is the reduction's
    ({"B": [Split(1, (3, 3))]}, "multiply to"),
])
def test_layouts_lowering_cannot_do_say_why(layouts, message):
    inputs, out = gmm_relu()
    with pytest.raises(ScheduleError, match=message):
        lay_out(make_task(inputs, [out]).dag, layouts)


def test_a_layout_step_replays_from_its_record_and_prints_as_python(operands):
    a, b = operands
    inputs, out = gmm_relu()
    task = make_task(inputs, [out], cores=2)
    s = State(task.dag)
    s.transform_layout("B", PANELS)
    s.transform_layout("relu", BLOCKED)
    assert s.dag.by_name["B"].shape == (1, N // 8, K, 8)
    s.parallel("relu", 0)
    replayed = State.from_json(task.dag, s.to_json())
    assert replayed == s and replayed.dag.workload_key == s.dag.workload_key
    assert "s.transform_layout('B', [split(2, [6, 8]), reorder([0, 2, 1, 3])])" in str(s)
    layouts = {"B": PANELS, "relu": BLOCKED}
    np.testing.assert_allclose(_run(replayed, layouts, a, b), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ScheduleError, match="before any loop step"):
        s.transform_layout("batch_matmul", BLOCKED)


def test_a_laid_out_candidate_is_measured_against_its_own_reference():
    """The runner checks a laid-out state against the naive program of the laid-out DAG, whose arguments
    take the new shapes."""
    from tensorgen.measure.builder import LocalBuilder
    from tensorgen.measure.runner import LocalRunner
    from tensorgen.measure.types import MeasureInput

    inputs, out = gmm_relu()
    task = make_task(inputs, [out], cores=2)
    s = State(task.dag)
    s.transform_layout("B", [Pad(2, 16), Split(2, (4, 16)), Reorder((0, 2, 1, 3))])
    s.transform_layout("relu", BLOCKED)
    s.parallel("relu", 0)
    batch = [MeasureInput(task, s), MeasureInput(task, State(task.dag))]
    results = LocalRunner(number=1, repeat=1).run(batch, LocalBuilder().build(batch))
    assert all(r.ok for r in results), [r.error_msg for r in results]


def test_loop_steps_after_layout_steps_renumber_what_they_follow(operands):
    """A state tuned on the laid-out DAG becomes a state of the task itself: its layout steps first, then the loop
    steps, those that name an earlier split (follow_split) renumbered."""
    from tensorgen.schedule.steps import FollowSplitStep
    from tensorgen.search.alt_policy import laid_out_task

    a, b = operands
    inputs, out = gmm_relu()
    task = make_task(inputs, [out], cores=2)
    layouts = {"B": PANELS}
    variant = laid_out_task(task, layouts)  # its stages in the task's order, as tune_alt tunes it
    states = sample_initial_population(variant, generate_sketches(variant), 8, np.random.default_rng(0))
    tuned = next(s for s in states if any(isinstance(step, FollowSplitStep) for step in s.steps))
    composed = State(task.dag)
    composed.transform_layout("B", PANELS)
    for step in tuned.steps:
        composed.apply(step.shifted(1))
    assert State.from_json(task.dag, composed.to_json()) == composed
    np.testing.assert_allclose(_run(composed, layouts, a, b), _run(tuned, layouts, a, b), rtol=1e-6, atol=1e-6)


def dense_bias(bias_shape=(N,)):
    """y = x @ w + bias, the weight and the bias constants (what store_at may put in one buffer)."""
    from tensorgen import te

    x = te.placeholder((M, K), name="x")
    w = te.placeholder((K, N), name="w", constant=True)
    bias = te.placeholder(bias_shape, name="bias", constant=True)
    k = te.reduce_axis(K, "k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
    z = te.compute((M, N), lambda i, j: y[i, j] + bias[(0,) * (len(bias_shape) - 1) + (j,)], name="z")
    return (x, w, bias), z


@pytest.mark.parametrize("bias_shape", [(N,), (1, N)])
def test_a_bias_stored_at_its_weights_columns_computes_the_same(bias_shape):
    """store_at: the bias is the last row of the weight's column panels, (N/16, K + 1, 16); the DAG takes no bias
    argument, every read of it goes to the weight's buffer (under the default and under sampled schedules)."""
    rng = np.random.default_rng(2)
    x, w, bias = (rng.uniform(-1, 1, s).astype("float32") for s in ((M, K), (K, N), bias_shape))
    prims = [StoreAt(0, "bias"), Split(1, (N // 16, 16)), Reorder((1, 0, 2))]
    inputs, out = dense_bias(bias_shape)
    task = make_task(inputs, [out], cores=2)
    dag = lay_out(task.dag, {"w": prims})
    assert [t.name for t in dag.inputs] == ["x", "w"] and dag.by_name["w"].shape == (N // 16, K + 1, 16)
    packed = Layout.of((K, N), prims).pack(w, {"bias": bias})
    assert np.array_equal(packed[:, K, :].reshape(-1), bias.reshape(-1))
    assert np.array_equal(Layout.of((K, N), prims).unpack(packed), w)
    want = x @ w + bias.reshape(1, N)
    laid_task = make_task(dag.inputs, dag.outputs, cores=2)
    states = [State(dag), *sample_initial_population(laid_task, generate_sketches(laid_task), 4,
                                                     np.random.default_rng(1))]
    for s in states:
        (got,) = build(s).run(x, packed)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("inputs", "layouts", "message"), [
    ("gmm", {"B": [StoreAt(1, "A")]}, "must be constant inputs"),  # neither constant
    ("dense", {"w": [StoreAt(1, "bias")]}, "host's shape without"),  # (K,) is no (N,)
    ("dense", {"w": [StoreAt(0, "x")]}, "must be constant inputs"),
    ("dense", {"w": [StoreAt(0, "bias")], "bias": [Pad(0, 2)]}, "in no other layout"),
])
def test_a_guest_that_cannot_be_stored_says_why(inputs, layouts, message):
    ins, out = gmm_relu() if inputs == "gmm" else dense_bias()
    with pytest.raises(ScheduleError, match=message):
        lay_out(make_task(ins, [out]).dag, layouts)
