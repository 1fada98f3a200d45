"""Weight layout rewrite (Ansor §4.2): repacked constants give the same results, in the layout the tiling walks."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.loopir.footprint import evaluate
from tensorgen.measure.builder import build_candidate
from tensorgen.measure.runner import LocalRunner
from tensorgen.measure.types import ErrorKind, MeasureInput
from tensorgen.schedule.layout_rewrite import LayoutRewrite, plan_layout_rewrites, rewrite_layout
from tensorgen.schedule.state import State
from tensorgen.search.annotate import sample_initial_population
from tensorgen.search.sketch import generate_sketches
from tensorgen.te import ops
from tensorgen.tuning.tune import make_task


def conv_task(constant: bool = True):
    x = te.placeholder((1, 8, 10, 10), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w", constant=constant)
    return make_task([x, w, ops.conv2d(x, w, padding=1, layout="NCHW")])


@pytest.fixture(scope="module")
def population():
    task = conv_task()
    return task, sample_initial_population(task, generate_sketches(task), 8, np.random.default_rng(3))


def test_pack_puts_every_element_where_the_new_index_reads_it():
    plan = LayoutRewrite.of("w", (4, 6), ((1, 2, 3), (0, 1, 4), (1, 1, 2)))
    a = np.arange(24, dtype="float32").reshape(4, 6)
    packed = plan.pack(a)
    assert packed.shape == plan.new_shape == (3, 4, 2)
    for i in range(4):
        for j in range(6):
            assert packed[tuple(int(evaluate(e, {})) for e in plan.index((i, j)))] == a[i, j]


def test_rewritten_programs_compute_the_same_on_packed_weights(population):
    task, states = population
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 8, 10, 10)).astype("float32")
    w = rng.uniform(-1, 1, (16, 8, 3, 3)).astype("float32")
    ref = np.zeros((1, 16, 10, 10), "float32")
    build(State(task.dag))(x, w, ref)
    rewritten = 0
    for state in states:
        new, plans = rewrite_layout(state)
        assert [p.name for p in plans] in ([], ["w"])
        out = np.zeros_like(ref)
        build(new)(x, plans[0].pack(w) if plans else w, out)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        if plans:
            rewritten += 1
            assert new.dag.by_name["w"].shape == plans[0].new_shape
            assert not plan_layout_rewrites(new)  # the rewritten DAG's weight is no longer `constant`
    assert rewritten >= len(states) // 2  # multi-level tiled sketches split the weight's axes


def test_only_constants_are_rewritten():
    task = conv_task(constant=False)
    states = sample_initial_population(task, generate_sketches(task), 4, np.random.default_rng(3))
    assert all(rewrite_layout(s) == (s, []) for s in states)


def test_constant_marks_change_the_workload_and_survive_serialization():
    from tensorgen.dag_json import dag_from_json, dag_to_json

    a, b = conv_task(True).dag, conv_task(False).dag
    assert a.workload_key != b.workload_key
    assert dag_from_json(dag_to_json(a)).workload_key == a.workload_key


def test_measurement_checks_rewritten_candidates_against_the_one_reference(population):
    """The harness hands a repacked constant the naive program's data, repacked: one reference per task."""
    task, states = population
    runner = LocalRunner(number=1, repeat=1, check_correctness=True)
    rewritten = [s for s in states if plan_layout_rewrites(s)]
    assert rewritten
    for state in rewritten[:2] + [s for s in states if s not in rewritten][:1]:
        br = build_candidate(MeasureInput(task, state), 60)
        assert br.error_kind == ErrorKind.NONE, br.error_msg
        assert bool(br.layouts) == bool(plan_layout_rewrites(state))
        res = runner.measure(MeasureInput(task, state), br)
        assert res.error_kind == ErrorKind.NONE, res.error_msg
