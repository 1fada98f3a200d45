"""Ansor per-statement features: layout, known values on tiny programs, and the caching extractor."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tensorgen import te
from tensorgen.dag import ComputeDAG
from tensorgen.features import N_FEATURES, NAMES, FeatureExtractor, statement_features
from tensorgen.features.access import footprints, window_footprints
from tensorgen.features.ansor import features_of
from tensorgen.features.layout import INDEX, ONE_HOT
from tensorgen.features.nest import NotAffine, state_statements
from tensorgen.schedule import State
from tensorgen.schedule.lower import lower
from tensorgen.target import HardwareParams

HW = HardwareParams(cores=2, cache_line_bytes=64)


def lg(x: float) -> float:
    return float(np.log2(1 + x))


def add16() -> ComputeDAG:
    a = te.placeholder((16, 16), name="A")
    b = te.placeholder((16, 16), name="B")
    c = te.compute((16, 16), lambda i, j: a[i, j] + b[i, j], name="C")
    return ComputeDAG([a, b, c])


def gmm(n: int) -> ComputeDAG:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return ComputeDAG([a, b, c])


def tiled(n: int, ti: int = 8, tj: int = 16) -> State:
    s = State(gmm(n))
    s.split("C", "i", [ti]).split("C", "j", [tj]).reorder("C", ["i_0", "j_0", "k", "i_1", "j_1"])
    return s.parallel("C", "i_0").unroll("C", "i_1").vectorize("C", "j_1")


def feats(state: State) -> np.ndarray:
    return statement_features(lower(state), HW)


def buffer_row(row: np.ndarray, name_bytes: float, write: bool) -> dict[str, float]:
    """The B<k> slot with this access type and bytes (slots are ranked by bytes, ties by name)."""
    kind = "write" if write else "read"
    for b in range(5):
        if row[INDEX[f"B{b}.acc_type.{kind}"]] == 1 and row[INDEX[f"B{b}.bytes"]] == pytest.approx(name_bytes):
            return {n.split(".", 1)[1]: row[i] for n, i in INDEX.items() if n.startswith(f"B{b}.")}
    raise AssertionError("no such buffer slot")


def test_layout():
    assert N_FEATURES == 164 == len(NAMES) == len(set(NAMES))
    f = feats(State(add16()))
    assert f.shape == (1, N_FEATURES) and f.dtype == np.float64
    assert set(np.unique(f[:, ONE_HOT])) <= {0.0, 1.0}


def test_elementwise_add_counts_and_buffers():
    (row,) = feats(State(add16()))
    assert row[INDEX["float_addsub"]] == pytest.approx(lg(256))
    assert row[INDEX["float_mul"]] == 0 and row[INDEX["float_mad"]] == 0
    assert row[INDEX["outer_prod"]] == pytest.approx(lg(256)) and row[INDEX["num_loops"]] == pytest.approx(lg(2))
    for kind in ("vec", "unroll", "parallel"):
        assert row[INDEX[f"{kind}_type.none"]] == 1 and row[INDEX[f"{kind}_len"]] == 0
    w = buffer_row(row, lg(1024), write=True)  # 256 floats written once each
    assert w["unique_bytes"] == pytest.approx(lg(1024)) and w["lines"] == pytest.approx(lg(16))
    assert w["unique_lines"] == pytest.approx(lg(16)) and w["stride"] == pytest.approx(lg(1))
    assert w["reuse_type.no_reuse"] == 1
    r = buffer_row(row, lg(1024), write=False)
    assert sum(row[INDEX[f"B{b}.acc_type.read"]] for b in range(5)) == 2
    assert r["unique_bytes"] == pytest.approx(lg(1024))
    # 256 flops over 3 KiB: intensity 1/12 at the full nest
    assert row[INDEX["arith_intensity_curve_9"]] == pytest.approx(lg(256 / 3072))
    assert row[INDEX["alloc_size"]] == 0  # the output is an argument, not allocated


def test_vectorize_and_parallel_features():
    s = State(add16()).parallel("C", "i").vectorize("C", "j")
    (row,) = feats(s)
    assert row[INDEX["vec_len"]] == pytest.approx(lg(16)) and row[INDEX["vec_num"]] == pytest.approx(lg(1))
    assert row[INDEX["vec_type.inner_spatial"]] == 1
    assert row[INDEX["parallel_len"]] == pytest.approx(lg(16)) and row[INDEX["parallel_type.outer_spatial"]] == 1
    assert row[INDEX["unroll_type.none"]] == 1
    assert row[INDEX["float_addsub"]] == pytest.approx(lg(256))  # op counts do not depend on annotations


def test_gmm_reduction_reuse_and_tiling():
    naive = feats(State(gmm(64)))
    assert naive.shape == (2, N_FEATURES)  # init and update
    upd = naive[1]
    assert upd[INDEX["float_mad"]] == pytest.approx(lg(64**3)) and upd[INDEX["float_mul"]] == pytest.approx(lg(64**3))
    c = {n.split(".", 1)[1]: upd[i] for n, i in INDEX.items() if n.startswith("B0.")}
    assert c["acc_type.readwrite"] == 1 and c["reuse_type.loop_multiple_read"] == 1
    assert c["reuse_ct"] == pytest.approx(lg(64)) and c["unique_bytes"] == pytest.approx(lg(64 * 64 * 4))
    t = feats(tiled(64))
    assert t.shape == naive.shape and not np.allclose(t, naive)
    assert t[1, INDEX["vec_len"]] == pytest.approx(lg(16)) and t[1, INDEX["unroll_len"]] == pytest.approx(lg(8))
    assert t[1, INDEX["parallel_len"]] == pytest.approx(lg(8))
    # same arithmetic, different memory behaviour: the curve is monotone and reaches the same end point
    assert t[1, INDEX["arith_intensity_curve_9"]] == pytest.approx(upd[INDEX["arith_intensity_curve_9"]])


def test_local_allocation():
    s = State(gmm(64)).cache_write("C", "local")
    s.split("C", "i", [8]).split("C", "j", [8]).reorder("C", ["i_0", "j_0", "i_1", "j_1"])
    s.compute_at("C_local", "C", "j_0")
    f = feats(s)
    assert f.shape == (3, N_FEATURES)
    assert f[0, INDEX["alloc_size"]] == pytest.approx(lg(8 * 8 * 4))
    assert f[0, INDEX["alloc_outer_prod"]] == pytest.approx(lg(64))
    assert f[2, INDEX["alloc_size"]] == 0  # the copy-out writes the argument C


def test_auto_unroll_from_state():
    s = tiled(64).pragma("C", "i_0", "auto_unroll_max_step$64")
    (f,) = FeatureExtractor(HW).extract([s])
    assert np.all(f[:, INDEX["auto_unroll_max_step"]] == pytest.approx(lg(64)))


def test_deterministic():
    a, b = feats(tiled(128)), feats(tiled(128))
    assert np.array_equal(a, b)
    assert np.isfinite(a).all() and (a >= 0).all()


def test_extractor_cache_and_failures(slowdown):
    ex = FeatureExtractor(HW)
    states = [tiled(256, ti, tj) for ti in (2, 4, 8) for tj in (4, 8, 16)]
    first = ex.extract(states)
    assert ex.stats["misses"] == len(states) and len(ex) == len(states)
    t0 = time.perf_counter()
    again = ex.extract([s.copy() for s in states])
    assert time.perf_counter() - t0 < 0.05 * slowdown
    assert ex.stats["hits"] == len(states)
    assert all(x is y for x, y in zip(first, again))
    assert len({x.tobytes() for x in first}) == len(states)  # different tilings, different features
    bad = State(gmm(64)).split("C", "i", [None])  # an unfilled split does not lower
    (f,) = ex.extract([bad])
    assert f.shape == (0, N_FEATURES) and ex.stats["failures"] == 1


INT_OPS = [i for i, n in enumerate(NAMES) if n.startswith("int_")]
NOT_INT_OPS = [i for i in range(N_FEATURES) if i not in INT_OPS]


def laid_out_c2d(co: int = 16, tiles: dict[str, int] | None = None):
    """A stride-2 conv in ALT's layouts (`tiles` of the template, default random ones): its padded input unfolded
    into tiles past its end (clamped reads)."""
    import search_tasks

    from tensorgen.search.alt_policy import laid_out_task
    from tensorgen.search.layouts import LAYOUT_TEMPLATES

    task = search_tasks.make_task(*te.ops.make_c2d(16, 16, 8, co, 3, 2, 1))
    template = LAYOUT_TEMPLATES["tiling"]
    layouts = template.layouts(task.dag, tiles or template.space(task.dag).sample(np.random.default_rng(1)))
    laid = laid_out_task(task, layouts)
    assert any("min(" in str(t.body) for t in laid.dag.tensors if t.body is not None)  # reads past the end
    return laid


@pytest.mark.parametrize("task_name", ["gmm", "c2d_relu", "c2d_cached", "c2d_laid_out"])
def test_nest_statements_match_lowered_program(task_name):
    """`features.nest` derives the loop nest arithmetically; apart from its count of index arithmetic its
    features equal those of the lowered program, on random programs of every sketch."""
    import search_tasks

    from tensorgen.search.annotate import sample_initial_population
    from tensorgen.search.sketch import generate_sketches

    task = {"gmm": lambda: search_tasks.gmm(64), "c2d_relu": search_tasks.c2d_relu,
            "c2d_cached": lambda: search_tasks.make_task(*te.ops.make_c2d(14, 14, 16, 32, 3, 1, 1)),
            "c2d_laid_out": laid_out_c2d}[task_name]()
    states = sample_initial_population(task, generate_sketches(task), 40, np.random.default_rng(3))
    assert len(states) >= 20
    for s in states:
        ours = features_of(state_statements(s), task.hw)
        lowered = statement_features(lower(s), task.hw)
        assert ours.shape == lowered.shape
        np.testing.assert_allclose(ours[:, NOT_INT_OPS], lowered[:, NOT_INT_OPS], atol=1e-9, err_msg=str(s))


def test_loops_misaligned_with_a_layout_read_it_at_an_average_slope():
    """A laid-out conv whose loops split a tiled dimension by other factors: the exact derivation leaves it to
    lowering; the extractor's derives it anyway (tile indices at their average slope), with the lowered program's
    statements, loops and float operations."""
    from tensorgen.search.annotate import sample_initial_population
    from tensorgen.search.sketch import generate_sketches

    task = laid_out_c2d(24, {"h": 4, "w": 8, "co": 8, "rh": 1, "rw": 1, "rc": 4})  # loops split 24 by 3, 6, 12
    states = sample_initial_population(task, generate_sketches(task), 40, np.random.default_rng(5))
    misaligned = 0
    for s in states:
        try:
            state_statements(s)
            continue
        except NotAffine:
            misaligned += 1
        ours = features_of(state_statements(s, exact=False), task.hw)
        lowered = statement_features(lower(s), task.hw)
        assert ours.shape == lowered.shape and np.isfinite(ours).all()
        floats = [i for i, n in enumerate(NAMES) if n.startswith(("float_", "vec_", "unroll_", "parallel_"))]
        np.testing.assert_allclose(ours[:, floats], lowered[:, floats], atol=1e-9)
    assert misaligned


def test_extractor_lowers_what_nest_cannot_derive():
    """rfactor of a fused reduction indexes with div/mod: the extractor falls back to lowering."""
    import search_tasks

    from tensorgen.search.annotate import sample_initial_population
    from tensorgen.search.sketch import generate_sketches

    task = search_tasks.nrm()
    rf = [sk for sk in generate_sketches(task) if any(type(st).__name__ == "RfactorStep" for st in sk.steps)]
    (s,) = sample_initial_population(task, rf, 1, np.random.default_rng(0))
    with pytest.raises(NotAffine):
        state_statements(s)
    (f,) = FeatureExtractor(task.hw).extract([s])
    np.testing.assert_array_equal(f, statement_features(lower(s), task.hw))


def test_a_stage_computed_at_a_gather_has_features():
    """The region of a stage computed inside a gather starts at the gathered index, a tensor load left in the
    lowered indices (a fuzzed model's Gather of a Sqrt): its statements still give features (it was a search fault)."""
    from tensorgen.schedule.state import State

    x = te.placeholder((4, 6, 2), name="x")
    idx = te.placeholder((3,), "int32", name="idx")
    doubled = te.compute(x.shape, lambda a, b, c: x[a, b, c] * 2.0, name="doubled")
    gathered = te.compute((4, 3, 2), lambda a, b, c: doubled[a, idx[b], c], name="gathered")
    s = State(ComputeDAG([x, idx, gathered]))
    s.compute_at("doubled", "gathered", "c")
    (features,) = FeatureExtractor(HW).extract([s])
    assert features.shape == (2, N_FEATURES) and np.isfinite(features).all()


@st.composite
def sliding_windows(draw):
    """Loops over a row-major array whose index along each dimension is `out * stride + window` (a convolution's
    input), in a random loop order: (strides in elements, extents)."""
    coef, ext, dim_stride = [], [], 1
    for _ in range(draw(st.integers(1, 3))):
        out, window = draw(st.integers(1, 6)), draw(st.integers(1, 4))
        stride = draw(st.integers(1, window))  # windows overlap or touch: the dimension stays contiguous
        coef += [stride * dim_stride, dim_stride]
        ext += [out, window]
        dim_stride *= (out - 1) * stride + window + draw(st.integers(0, 3))  # padding between dimensions
    order = draw(st.permutations(range(len(coef))))
    return np.array(coef, float)[order], np.array(ext, float)[order]


@settings(max_examples=60, deadline=None)
@given(sliding_windows())
def test_window_footprints_count_the_distinct_elements_of_sliding_windows(loops):
    coef, ext = loops
    got = window_footprints(coef[None], ext)[0]
    for level in range(len(coef) + 1):
        grids = np.meshgrid(*[np.arange(e) * c for c, e in zip(coef[level:], ext[level:])], indexing="ij")
        assert got[level] == len(np.unique(sum(grids, np.zeros(1)))), level
    assert np.all(got <= footprints(coef[None], ext)[0])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 7).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 63.7, 384.0, 1e6]), min_size=n, max_size=n),
    st.lists(st.integers(1, 50), min_size=n, max_size=n))))
@example(([1.0, 2.0, 3.0], [31, 12, 34]))  # 2 and 3 merge only through 1
def test_window_footprints_never_exceed_the_simple_count_and_grow_outwards(loops):
    coef, ext = np.array(loops[0], float)[None], np.array(loops[1], float)
    got = window_footprints(coef, ext)[0]
    assert np.all(got >= 1) and np.all(got <= footprints(coef, ext)[0])
    assert np.all(np.diff(got) <= 0)  # a level touches at least what the levels inside it touch
