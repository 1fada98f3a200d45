"""Sketch generation (Ansor §4.1) and random annotation (§4.2) on GMM, conv2d + ReLU and NRM.

Every sampled program is compiled, run and compared against NumPy or the naive program.
"""

from __future__ import annotations

import numpy as np
import pytest
from search_tasks import c2d_relu, gmm, make_task, nrm

from tensorgen import te
from tensorgen.build import build
from tensorgen.costmodel.base import RandomModel
from tensorgen.errors import LoweringError, TuneError
from tensorgen.schedule.lower import lower
from tensorgen.schedule.packing import PackLayoutStep
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import CacheWriteStep, ComputeAtStep, ComputeInlineStep, RfactorStep, SplitStep
from tensorgen.search.annotate import AnnotationPolicy, sample_initial_population, starves_cores
from tensorgen.search.rules import (
    Cond,
    SketchRule,
    has_data_reuse,
    is_tiled,
    multi_level_tiling,
    with_rule,
    without_rule,
)
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.sketch_policy import SketchConfig, SketchPolicy
from tensorgen.task import SearchTask


def kinds(state: State) -> list[type]:
    return [type(s) for s in state.steps]


# ---------------------------------------------------------------------------------------------
# sketches


def test_gmm_sketches():
    sketches = generate_sketches(gmm())
    assert 2 <= len(sketches) < 10
    unpacked = [s for s in sketches if PackLayoutStep not in kinds(s)]
    assert len(unpacked) * 2 == len(sketches)  # each also with B packed (test_packing.py)
    plain = [s for s in unpacked if CacheWriteStep not in kinds(s)]
    cached = [s for s in unpacked if CacheWriteStep in kinds(s)]
    assert len(plain) == 1 and len(cached) == 2  # cache stage fused at tile level 1 and 2
    (s,) = plain
    assert [it.name for it in s.stage("batch_matmul").iters] == [
        "b_0", "i_0", "j_0", "b_1", "i_1", "j_1", "k_0", "b_2", "i_2", "j_2", "k_1", "b_3", "i_3", "j_3"]
    assert {c.stage("batch_matmul_local").attach for c in cached} == {("batch_matmul", "j_0"),
                                                                        ("batch_matmul", "j_1")}
    for sk in sketches:  # sketches are incomplete programs until annotated
        assert any(isinstance(st, SplitStep) and None in st.lengths for st in sk.steps)
        with pytest.raises(LoweringError):
            lower(sk)
    assert len({s.to_json() for s in sketches}) == len(sketches)


def test_conv2d_relu_sketches():
    sketches = generate_sketches(c2d_relu())
    assert 3 <= len(sketches) < 10
    for s in sketches:  # pad has a select: not strictly inlinable, so it stays a stage
        assert s.stage("pad").location == "root"
        assert ComputeInlineStep not in kinds(s)
        assert is_tiled(s, s.stage_id("conv2d"))
    fused = {s.stage("conv2d").attach for s in sketches if s.stage("conv2d").location == "at"}
    assert fused == {("relu", "i3_0"), ("relu", "i3_1")}  # fusion into relu at two tile levels
    assert any(s.stage("conv2d").location == "root" for s in sketches)


def test_nrm_sketches_have_rfactor():
    sketches = generate_sketches(nrm())
    rf = [s for s in sketches if RfactorStep in kinds(s)]
    assert len(rf) == 2 and len(sketches) == 3
    assert all("norm_sumsq_rf" in [st.name for st in s.stages] for s in rf)
    assert generate_sketches(nrm()) == sketches  # deterministic


class TwoLevelTiling(SketchRule):
    """A user rule: "SRS" tiling instead of Ansor's CPU structure, and no cache stage."""

    name = "two_level_tiling"

    def condition(self, task, state, i):
        ok = has_data_reuse(state, i) and not is_tiled(state, i)
        return Cond.APPLY_AND_SKIP_REST if ok else Cond.SKIP

    def apply(self, task, state, i):
        return [(multi_level_tiling(state, i, "SRS")[0], i - 1)]


def test_custom_rule_changes_sketches():
    task = gmm()
    before = generate_sketches(task)
    rules = with_rule(TwoLevelTiling(), before="add_cache_write")
    custom = generate_sketches(task, rules)
    assert len(custom) == 2 and custom != before  # and B packed in its tile layout
    for sketch in custom:
        assert [it.name for it in sketch.stage("batch_matmul").iters] == [
            "b_0", "i_0", "j_0", "k", "b_1", "i_1", "j_1"]
    pop = sample_initial_population(task, custom, 3, np.random.default_rng(0))
    assert len(pop) == 3

    assert SketchPolicy(task, RandomModel(0), rules=rules, config=SketchConfig.of(workers=1)).sketches == custom
    assert generate_sketches(task, without_rule("two_level_tiling", rules)) == before  # the default table is as it was
    assert generate_sketches(task) == before


# ---------------------------------------------------------------------------------------------
# random annotation


def _check_population(task: SearchTask, pop: list[State], expected: list[np.ndarray], inputs) -> None:
    for s in pop:
        assert State.from_json(task.dag, s.to_json()) == s
        got = build(s).run(*inputs)
        for g, want in zip(got, expected):
            np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4, err_msg=str(s))


def _annotations(s: State) -> set[str]:
    return {st.annotation for st in s.steps if hasattr(st, "annotation")}


@pytest.mark.parametrize("name", ["gmm", "c2d_relu", "nrm"])
def test_random_annotation_builds_and_matches(name):
    task = {"gmm": gmm, "c2d_relu": c2d_relu, "nrm": nrm}[name]()
    sketches = generate_sketches(task)
    pop = sample_initial_population(task, sketches, 20, np.random.default_rng(7))
    assert len(pop) == 20
    rng = np.random.default_rng(0)
    inputs = [rng.random(t.shape, dtype=np.float32) for t in task.dag.inputs]
    if name == "gmm":
        expected = [inputs[0] @ inputs[1]]
    elif name == "nrm":
        expected = [np.sqrt((inputs[0].astype(np.float64) ** 2).sum(axis=(1, 2)))]
    else:
        expected = build(State(task.dag)).run(*inputs)
    _check_population(task, pop, expected, inputs)
    for s in pop:
        assert all(None not in st.lengths for st in s.steps if isinstance(st, SplitStep))
    if name != "nrm":  # NRM's naive and rfactor-for-vectorization sketches have a batch of 1 to share out
        assert sum("parallel" in _annotations(s) for s in pop) >= 15
    assert sum("vectorize" in _annotations(s) for s in pop) >= 10
    assert len({s.to_json() for s in pop}) >= 10


def test_sampling_is_reproducible_and_seed_dependent():
    task = c2d_relu()
    sketches = generate_sketches(task)
    a = sample_initial_population(task, sketches, 10, np.random.default_rng(123))
    b = sample_initial_population(task, sketches, 10, np.random.default_rng(123))
    c = sample_initial_population(task, sketches, 10, np.random.default_rng(124))
    assert [s.to_json() for s in a] == [s.to_json() for s in b]
    assert [s.to_json() for s in a] != [s.to_json() for s in c]


def test_tile_sizes_are_perfect_and_bounded():
    task = gmm(96)
    policy = AnnotationPolicy(max_innermost=8)
    pop = sample_initial_population(task, generate_sketches(task), 20, np.random.default_rng(3), policy)
    for s in pop:
        for st in s.steps:
            if isinstance(st, SplitStep):
                assert st.extent % np.prod(st.lengths) == 0 and st.lengths[-1] <= 8
    assert len(policy.factorizations(12, 2)) == 17  # (a, b) with a * b | 12 and b <= 8
    assert all(12 % (a * b) == 0 and b <= 8 for a, b in policy.factorizations(12, 2))


def _register_tile(state: State, lanes: int) -> tuple[int, int] | None:
    """(rows, vectors) of a GMM program's innermost space tile level; None when the level above it is not 1
    or the vectorized length is not whole vectors."""
    i, j = [st.lengths for st in state.steps if isinstance(st, SplitStep) and len(st.lengths) == 3 and st.extent > 1]
    if i[-2] != 1 or j[-2] != 1 or j[-1] % lanes:
        return None
    return i[-1], j[-1] // lanes


def test_register_tile_prior_draws_whole_vectors_and_enough_accumulators():
    task = gmm(256)  # default HardwareParams: 32-byte SIMD, 8 lanes, 16 vector registers
    lanes, sketches = task.hw.simd_bytes // 4, generate_sketches(task)
    prior = sample_initial_population(task, sketches, 60, np.random.default_rng(1),
                                      AnnotationPolicy(register_tile_share=1.0))
    uniform = sample_initial_population(task, sketches, 60, np.random.default_rng(1),
                                        AnnotationPolicy(register_tile_share=0.0))

    def good(s: State) -> bool:  # 6-12 accumulators, at least 2 rows and 2 vectors: 4x2 or 2x4 here
        tile = _register_tile(s, lanes)
        return tile is not None and 6 <= tile[0] * tile[1] <= 12 and min(tile) >= 2

    assert len(prior) == 60 and sum(map(good, prior)) >= 57  # the rest: no such tile found in the tries
    assert sum(map(good, uniform)) < 20
    for s in prior:  # still perfect tilings, still runnable programs
        assert all(st.extent % np.prod(st.lengths) == 0 for st in s.steps if isinstance(st, SplitStep))
    rng = np.random.default_rng(0)
    a, b = (rng.random((1, 256, 256), dtype=np.float32) for _ in range(2))
    _check_population(task, prior[:4], [a @ b], [a, b])


def test_register_tile_prior_on_a_conv_tiles_only_the_innermost_level():
    task = c2d_relu()  # NHWC 8x8, 16 -> 16 channels: rows come from the image axes, vectors from the channels
    lanes = task.hw.simd_bytes // 4
    pop = sample_initial_population(task, generate_sketches(task), 30, np.random.default_rng(3),
                                    AnnotationPolicy(register_tile_share=1.0))
    tiles = []
    for s in pop:  # the conv stage's space splits with more than one output: h, w, then the channels
        *rows, vec = [st for st in s.steps if isinstance(st, SplitStep) and len(st.lengths) == 3 and st.extent > 1]
        if all(st.lengths[1] == 1 for st in (*rows, vec)) and vec.lengths[-1] % lanes == 0:
            tiles.append((int(np.prod([st.lengths[-1] for st in rows])), vec.lengths[-1] // lanes))
    assert len(tiles) >= 25 and all(r >= 2 and v >= 2 and 6 <= r * v <= 12 for r, v in tiles)


def test_whole_vector_register_tiles_are_vectorized():
    task = gmm(256)
    policy = AnnotationPolicy(register_tile_share=1.0)
    pop = sample_initial_population(task, generate_sketches(task), 40, np.random.default_rng(4), policy)
    inner = [st.iters[-1] for s in pop for i, st in enumerate(s.stages) if is_tiled(s, i) and st.tensor.reduce_axes]
    wide = [it for it in inner if it.extent > policy.max_vectorize and it.extent % policy.max_vectorize == 0]
    assert wide and all(it.annotation == "vectorize" for it in wide)


def test_register_tile_prior_leaves_untileable_axes_alone():
    from tensorgen.search.annotate import register_tile_lengths

    task = gmm(96)
    split = SplitStep(0, 2, 7, (1, 1, 7))  # 7 outputs: no whole vector to end in
    assert register_tile_lengths([split, split], np.random.default_rng(0), AnnotationPolicy(), task.hw) == \
        [(1, 1, 7), (1, 1, 7)]


def test_sizeable_programs_are_sampled_parallel():
    # a GEMV with a bias (ResNet-50's fc, smaller): 1000 outputs in 4 tile levels often leave the loops
    # before the bias stage's attach point with a single iteration
    x, w = te.placeholder((1, 512), name="x"), te.placeholder((1000, 512), name="w")
    b = te.placeholder((1000,), name="b")
    k = te.reduce_axis(512, "k")
    gemv = te.compute((1, 1000), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="gemv")
    out = te.compute((1, 1000), lambda i, j: gemv[i, j] + b[j], name="out")
    task = make_task([x, w, b], [gemv, out], cores=2)
    assert task.dag.flop_count >= AnnotationPolicy().min_parallel_flops
    sketches = generate_sketches(task)
    anything = AnnotationPolicy(min_parallel_flops=float("inf"))
    before = sample_initial_population(task, sketches, 100, np.random.default_rng(0), anything)
    assert sum(starves_cores(s, 2) for s in before) >= 3
    after = sample_initial_population(task, sketches, 100, np.random.default_rng(0))
    assert len(after) == 100 and not any(starves_cores(s, 2) for s in after)


def test_padding_location_varies():
    task = c2d_relu()
    pop = sample_initial_population(task, generate_sketches(task), 30, np.random.default_rng(5))
    where = {s.stage("pad").location for s in pop}
    assert "at" in where and len(where) >= 2
    assert any(isinstance(st, ComputeAtStep) and s.stages[st.stage_id].name == "pad" for s in pop for st in s.steps)


def test_transpose_read_by_a_tiled_stage_is_inlined_or_materialized():
    from search_tasks import make_task

    from tensorgen.search.rules import is_transpose
    from tensorgen.te.ops.suite import make_tbs

    task = make_task(*make_tbs(16, 2, 8))
    sketches = generate_sketches(task)
    where = {(s.stage("k_transpose").location, s.stage("q_transpose").location) for s in sketches}
    assert where == {("inline", "inline"), ("root", "inline")}  # K^T walks k's rows: both; Q's copy keeps rows
    fresh = State(task.dag)
    assert is_transpose(fresh, fresh.stage_id("k_transpose")) and not is_transpose(fresh, fresh.stage_id("q_transpose"))


def _const_matrix(values: np.ndarray, name: str):
    """A small constant tensor as a compute of nested selects (how a Winograd op writes its matrices)."""
    from tensorgen import te

    def body(i, j):
        e = te.const(0.0)
        for (r, c), v in np.ndenumerate(values):
            if v:
                e = te.select(te.all_of(te.eq(i, r), te.eq(j, c)), float(v), e)
        return e

    return te.compute(values.shape, body, name=name)


def test_const_tensor_axes_are_unrolled_innermost():
    """simplify-compute-with-const-tensor: a Winograd-style input transform B^T d B."""
    from tensorgen import te
    from tensorgen.schedule.steps import AnnotationStep, ReorderStep
    from tensorgen.search.rules import CONST_TENSOR_INDICES
    from tensorgen.tuning.tune import make_task

    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float32)
    b = _const_matrix(bt.T.copy(), "B")
    d = te.placeholder((4, 4, 64), name="d")
    r1, r2 = te.reduce_axis(4, "r1"), te.reduce_axis(4, "r2")
    v = te.compute((4, 4, 64), lambda a, c, t: te.sum(b[r1, a] * d[r1, r2, t] * b[r2, c], axis=[r1, r2]),
                   name="V", attrs={CONST_TENSOR_INDICES: ["a", "c", "r1", "r2"]})
    task = make_task([d, v])
    sketches = generate_sketches(task)
    assert len(sketches) == 1
    (sk,) = sketches
    unrolled = {sk.stages[st.stage_id].iters[st.iter_id].name for st in sk.steps
                if isinstance(st, AnnotationStep) and st.annotation == "unroll"}
    assert unrolled == {"a", "c", "r1", "r2"}
    order = [it.name for it in sk.stages[sk.stage_id("V")].iters]
    assert order[-4:] == ["a", "c", "r1", "r2"] and any(isinstance(st, ReorderStep) for st in sk.steps)
    pop = sample_initial_population(task, sketches, 6, np.random.default_rng(0))
    data = np.random.default_rng(1).random((4, 4, 64), dtype=np.float32)
    expected = np.einsum("ia,ijt,jc->act", bt.T, data, bt.T)
    for s in pop:
        np.testing.assert_allclose(build(s).run(data)[0], expected, rtol=1e-5, atol=1e-5)


def test_long_elementwise_loops_are_vectorized_and_call_vector_math():
    """BERT's GELU: rows of 3072. The innermost loop is longer than max_vectorize, but codegen steps it by
    whole vectors, so it is vectorized and erf runs as libmvec's vector erff where glibc has it."""
    import math

    from tensorgen.codegen.toolchain import has_vector_math

    x = te.placeholder((4, 3072), name="x")
    gelu = te.compute((4, 3072), lambda i, j: x[i, j] * (te.erf(x[i, j] * 0.7071) + 1.0) * 0.5, name="gelu")
    task = make_task([x], [gelu], cores=2)
    pop = sample_initial_population(task, generate_sketches(task), 16, np.random.default_rng(0))
    vectorized = [s for s in pop if "vectorize" in _annotations(s)]
    assert len(vectorized) >= 4  # the others run every element in parallel: no loop left to vectorize
    f = build(vectorized[0])
    if has_vector_math(64, "erf"):
        assert "v_erff(" in f.source
    a = np.random.default_rng(1).standard_normal((4, 3072)).astype(np.float32)
    want = a * (np.vectorize(math.erf)(a * 0.7071) + 1.0) * 0.5
    np.testing.assert_allclose(f.run(a)[0], want, rtol=1e-5, atol=1e-6)


def test_search_spaces_are_registered_and_named_by_policies():
    """The "sketch" space is Ansor's; "limited" its template-like ablation; a user's own space is named like them."""
    from tensorgen.search.random_policy import RandomPolicy
    from tensorgen.search.sketch import SPACES, generate_sketches
    from tensorgen.search.sketch_policy import SketchConfig, SketchPolicy

    task = gmm()
    full, limited = SPACES.create("sketch", task), SPACES.create("limited", task)
    assert [s.to_json() for s in full] == [s.to_json() for s in generate_sketches(task)]
    assert len(limited) == 1 < len(full) and "cache_write" not in limited[0].to_json()
    SPACES.register("first_only", lambda task, rules=None, skips=None: generate_sketches(task, rules, skips=skips)[:1],
                    replace=True)
    policy = SketchPolicy(task, RandomModel(0), config=SketchConfig.of(space="first_only", workers=1))
    assert [s.to_json() for s in policy.sketches] == [full[0].to_json()]
    assert len(RandomPolicy(task, space="limited").sketches) == 1
    with pytest.raises(TuneError, match="unknown search space 'nowhere'"):
        SketchConfig.of(space="nowhere")


def test_a_space_past_the_bound_falls_back_to_the_limited_space(monkeypatch, caplog):
    """The default rules multiply their choices per stage (a fused group of five chained reductions had 1350
    sketches, past the old bound of 1000, and its tuning stopped with a RuntimeError: fuzz seed 4216): past the
    bound the task is searched in the limited space, with a warning; rules a user gave that run away raise."""
    from functools import partial

    from tensorgen.search import sketch
    from tensorgen.search.targets import for_target

    task = c2d_relu()
    full, limited = sketch.sketch_space(task), sketch.limited_space(task)
    assert len(full) > len(limited) >= 1
    monkeypatch.setattr(sketch, "generate_sketches", partial(sketch.generate_sketches, max_sketches=len(limited)))
    with caplog.at_level("WARNING", logger="tensorgen.search"):
        fallback = sketch.sketch_space(task)
    assert [s.to_json() for s in fallback] == [s.to_json() for s in limited]
    assert "searching the plain multi-level tiling sketch" in caplog.text
    with pytest.raises(sketch.TooManySketches, match="check the rules"):
        sketch.sketch_space(task, rules=list(for_target(task).rules))
