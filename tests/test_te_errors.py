"""Bad input raises the named tensorgen error with a message that says what was wrong.

Schedule errors must leave the State untouched: every primitive either appends one step or raises.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen import te
from tensorgen.build import build
from tensorgen.errors import LoweringError, RuntimeCallError, ScheduleError, TensorExprError, TensorgenError
from tensorgen.schedule import State

# ---------------------------------------------------------------------------------------------
# tensor expressions


A = te.placeholder((4, 5), name="A")
V = te.placeholder((6,), name="V")


def test_errors_are_value_errors_and_tensorgen_errors():
    for cls in (TensorExprError, ScheduleError, RuntimeCallError):
        assert issubclass(cls, TensorgenError) and issubclass(cls, ValueError)
    assert issubclass(LoweringError, TensorgenError)


@pytest.mark.parametrize("index", [(0,), (0, 1, 2)])
def test_wrong_index_arity(index):
    with pytest.raises(TensorExprError, match=rf"A has 2 dimension\(s\).*indexed with {len(index)}"):
        A[index]


def test_wrong_index_arity_inside_compute():
    with pytest.raises(TensorExprError, match="indexed with 1"):
        te.compute((4,), lambda i: A[i], name="bad")


def test_float_index():
    with pytest.raises(TensorExprError, match="index 1 of A .*float32.*integers"):
        A[0, 1.5]
    with pytest.raises(TensorExprError, match="indices must be integers"):
        te.compute((4, 5), lambda i, j: A[i, te.cast(j, "float32")], name="bad")


@pytest.mark.parametrize("index, dim, extent", [((4, 0), 0, 4), ((0, -1), 1, 5), ((0, 5), 1, 5)])
def test_constant_index_out_of_range(index, dim, extent):
    with pytest.raises(TensorExprError, match=f"constant index .* out of range for dimension {dim} of A "
                                              rf"\(extent {extent}\)"):
        A[index]


def test_reduce_axis_outside_its_reduction():
    k = te.reduce_axis(5, "k")
    with pytest.raises(TensorExprError, match="reduce axis k is used outside a reduction"):
        te.compute((4,), lambda i: A[i, k], name="bad")
    k2 = te.reduce_axis(5, "k2")
    with pytest.raises(TensorExprError, match="reduce axis k2 is used outside a reduction"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) + A[i, k2] * 0.0, name="bad")


def test_reduce_axis_of_another_reduction():
    k, k2 = te.reduce_axis(5, "k"), te.reduce_axis(5, "k2")
    with pytest.raises(TensorExprError, match="k2"):
        te.compute((4,), lambda i: te.sum(A[i, k] * A[i, k2], axis=k), name="bad")


def test_nested_reduction():
    k, k2 = te.reduce_axis(5, "k"), te.reduce_axis(4, "k2")
    with pytest.raises(TensorExprError, match="reduction must be the whole body"):
        te.compute((1,), lambda z: te.sum(te.sum(A[k2, k], axis=k), axis=k2), name="bad")
    with pytest.raises(TensorExprError, match="reduction must be the whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) * 2.0, name="bad")


def test_sum_over_a_spatial_axis():
    with pytest.raises(TensorExprError, match="is not a reduce_axis"):
        te.compute((4,), lambda i: te.sum(A[i, 0], axis=i), name="bad")


def test_true_division_on_ints():
    i32 = te.placeholder((4,), dtype="int32", name="I")
    with pytest.raises(TensorExprError, match=r"`/` on integers .* use `//`"):
        te.compute((4,), lambda i: i32[i] / 2, name="bad")
    with pytest.raises(TensorExprError, match="use `//`"):
        te.compute((4,), lambda i: A[i // 2 / 2, 0], name="bad")


def test_floordiv_on_floats():
    with pytest.raises(TensorExprError, match="needs integer operands"):
        te.compute((4,), lambda i: A[i, 0] // 2.0, name="bad")


@pytest.mark.parametrize("shape", [(0, 3), (-1,), (2.5,), (True, 2), ("4",)])
def test_bad_shape(shape):
    with pytest.raises(TensorExprError, match="shape .* must hold positive integers"):
        te.placeholder(shape, name="P")
    with pytest.raises(TensorExprError, match="must hold positive integers"):
        te.compute(shape, lambda *idx: 0.0, name="Q")


@pytest.mark.parametrize("dtype", ["float", "int8", "uint32", "float128", ""])
def test_bad_dtype(dtype):
    with pytest.raises(TensorExprError, match=f"unknown dtype {dtype!r}; expected one of .*float32"):
        te.placeholder((3,), dtype=dtype, name="P")
    with pytest.raises(TensorExprError, match="unknown dtype"):
        te.compute((3,), lambda i: V[i], name="Q", dtype=dtype)


def test_bad_names():
    for name in ("", "1x", "a-b", "x y"):
        with pytest.raises(TensorExprError, match="must be an identifier"):
            te.placeholder((3,), name=name)


@pytest.mark.parametrize("fcompute, n", [(lambda i: 0.0, 1), (lambda i, j, k: 0.0, 3)])
def test_compute_fcompute_arity_mismatch(fcompute, n):
    with pytest.raises(TensorExprError, match=f"shape has 2 dimension\\(s\\) but fcompute takes {n} argument"):
        te.compute((4, 5), fcompute, name="bad")


def test_bad_reduce_axis_extent():
    for extent in (0, -3, 2.0, (1, 4)):
        with pytest.raises(TensorExprError, match="reduce_axis"):
            te.reduce_axis(extent, "k")


def test_python_truth_value_of_expression():
    with pytest.raises(TensorExprError, match="no truth value; use te.select"):
        te.compute((4,), lambda i: A[i, 0] if A[i, 0] > 0.0 else 0.0, name="bad")


def test_where_must_be_condition_and_unknown_intrinsic():
    k = te.reduce_axis(5, "k")
    with pytest.raises(TensorExprError, match="condition"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k, where=A[i, k]), name="bad")
    from tensorgen.te.expr import call

    with pytest.raises(TensorExprError, match="unknown intrinsic 'erfinv'"):
        call("erfinv", 1.0)


def test_cannot_use_object_in_expression():
    with pytest.raises(TensorExprError, match="cannot use"):
        te.compute((4,), lambda i: A[i, 0] + "x", name="bad")


# ---------------------------------------------------------------------------------------------
# schedule errors: named error, helpful message, state unchanged


def _matmul_relu():
    a = te.placeholder((8, 6), name="A")
    b = te.placeholder((6, 4), name="B")
    k = te.reduce_axis(6, "k")
    c = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((8, 4), lambda i, j: te.max_expr(c[i, j], 0.0), name="D")
    return State([a, b, d])


def _elementwise_chain():
    x = te.placeholder((8, 4), name="X")
    e1 = te.compute((8, 4), lambda i, j: x[i, j] * 2.0, name="E1")
    e2 = te.compute((8, 4), lambda i, j: e1[i, j] + 1.0, name="E2")
    e3 = te.compute((8, 4), lambda i, j: e2[i, j] - e1[i, j], name="E3")
    return State([x, e3])


@pytest.fixture
def s():
    st = _matmul_relu()
    st.split("D", "i", [2])
    return st


def _fails(state: State, action, match: str, error=ScheduleError):
    steps, stages = state.steps, state.stages
    json_before = state.to_json()
    with pytest.raises(error, match=match):
        action(state)
    assert state.steps is steps or state.steps == steps
    assert state.stages == stages
    assert all(a is b for a, b in zip(state.stages, stages))
    assert state.to_json() == json_before


def test_unknown_stage_name_lists_stages(s):
    _fails(s, lambda st: st.split("Q", "i", [2]), "no stage named 'Q'; stages: A, B, C, D")
    _fails(s, lambda st: st.compute_at("C", "Z", "i"), "no stage named 'Z'; stages: A, B, C, D")
    _fails(s, lambda st: st.parallel(9, 0), r"no stage with index 9 \(the state has 4 stages\)")


def test_unknown_iterator_name_lists_iterators(s):
    _fails(s, lambda st: st.split("D", "i", [2]), "stage D has no iterator 'i'; its iterators are i_0, i_1, j")
    _fails(s, lambda st: st.parallel("C", "x"), "stage C has no iterator 'x'; its iterators are i, j, k")
    _fails(s, lambda st: st.reorder("C", ["k", "j", "q"]), "no iterator 'q'")
    _fails(s, lambda st: st.unroll("C", 3), "stage C has 3 iterators .*index 3 is out of range")


def test_split_lengths_too_large(s):
    _fails(s, lambda st: st.split("C", "i", [3, 3]), r"multiply to 9, more than the iterator's extent 8")
    _fails(s, lambda st: st.split("C", "j", [5]), "more than the iterator's extent 4")


def test_split_bad_lengths(s):
    _fails(s, lambda st: st.split("C", "i", []), "at least one length")
    _fails(s, lambda st: st.split("C", "i", [0]), "positive integers")
    _fails(s, lambda st: st.split("C", "i", [2.0]), "positive integers")


def test_fuse_non_consecutive(s):
    s.reorder("C", ["i", "k", "j"])
    _fails(s, lambda st: st.fuse("D", ["i_0", "j"]), r"iterators \['i_0', 'j'\] are not consecutive")
    _fails(s, lambda st: st.fuse("D", ["i_1", "i_0"]), "not consecutive")
    _fails(s, lambda st: st.fuse("C", ["i", "k"]), "cannot fuse spatial and reduce")
    _fails(s, lambda st: st.fuse("C", ["i"]), "at least two iterators")


def test_reorder_missing_or_repeating_iterator(s):
    _fails(s, lambda st: st.reorder("D", ["j", "i_0"]), r"give every iterator exactly once \(i_0, i_1, j\)")
    _fails(s, lambda st: st.reorder("D", ["j", "i_0", "i_0"]), "exactly once")


def test_parallel_on_reduce_iterator(s):
    _fails(s, lambda st: st.parallel("C", "k"), "cannot parallelize stage C, iterator k: it is a reduce iterator")


def test_vectorize_non_innermost_reduce(s):
    s.reorder("C", ["i", "k", "j"])
    _fails(s, lambda st: st.vectorize("C", "k"), "cannot vectorize stage C, iterator k: a reduce iterator")


def test_double_annotation_and_unknown_annotation(s):
    s.parallel("D", "i_0")
    _fails(s, lambda st: st.vectorize("D", "i_0"), "already annotated 'parallel'")
    _fails(s, lambda st: st.annotate("D", "j", "simd"), "unknown annotation 'simd'")


def test_compute_inline_reduction(s):
    _fails(s, lambda st: st.compute_inline("C"), "C is a reduction and cannot be inlined")


def test_compute_inline_output(s):
    _fails(s, lambda st: st.compute_inline("D"), "D is an output and must be stored")


def test_compute_inline_placeholder(s):
    _fails(s, lambda st: st.compute_inline("A"), "A is an input placeholder")


def test_compute_at_non_consumer():
    st = _elementwise_chain()
    # E1 is read by E2 and E3: it has no single consumer to be computed at
    _fails(st, lambda x: x.compute_at("E1", "E2", "i"), "E1 can only be computed at its sole consumer.*E2, E3")
    # E2 is read by E3 only; computing it at E1 (its producer) is wrong
    _fails(st, lambda x: x.compute_at("E2", "E1", "i"), "read by E3 .*not just E1")


def test_compute_at_output_and_into_itself(s):
    _fails(s, lambda st: st.compute_at("D", "C", "i"), "D is an output")
    _fails(s, lambda st: st.compute_at("C", "C", "i"), "sole consumer")


def test_unknown_pragma(s):
    _fails(s, lambda st: st.pragma("C", "i", "unroll_explicit"), "unknown pragma 'unroll_explicit'; supported")
    _fails(s, lambda st: st.pragma("C", "i", "auto_unroll_max_step$x"), "unknown pragma")
    _fails(s, lambda st: st.pragma("C", "i", "auto_unroll_max_step"), "unknown pragma")


def test_rfactor_spatial_iterator(s):
    _fails(s, lambda st: st.rfactor("C", "i", 0), r"C\.i is not a reduce iterator")
    _fails(s, lambda st: st.rfactor("D", "j", 0), "D is not a reduction")
    _fails(s, lambda st: st.rfactor("C", "k", 5), r"factor_iter_id must be in 0\.\.2")


def test_rfactor_whole_reduction_leaves_no_reduce_iterator(s):
    _fails(s, lambda st: st.rfactor("C", "k", 0), "leave at least one reduce iterator")


def test_storage_align_errors(s):
    _fails(s, lambda st: st.storage_align("D", "j", 8, 1), "output's layout is fixed")
    _fails(s, lambda st: st.storage_align("C", "k", 8, 1), "not an untransformed spatial axis")
    _fails(s, lambda st: st.storage_align("C", "i", 8, 8), "0 <= offset < factor")


def test_follow_split_errors(s):
    _fails(s, lambda st: st.follow_split("C", "i", 5, 1), "step 5 is not a split step")
    _fails(s, lambda st: st.follow_split("C", "i", 0, 3), "n_split 3 must be in 1..1")
    _fails(s, lambda st: st.follow_fused_split("C", "i", [0], 4, True), "level 4 out of range")


def test_cache_write_after_transform_and_cache_read_non_reader(s):
    s.split("C", "i", [2])
    _fails(s, lambda st: st.cache_write("C", "local"), "apply it before transforming")
    _fails(s, lambda st: st.cache_read("A", "shared", ["D"]), "stage D does not read it")
    _fails(s, lambda st: st.cache_read("A", "shared", []), "at least one reader")


def test_steps_on_inlined_stage():
    st = _elementwise_chain()
    st.compute_inline("E2")
    _fails(st, lambda x: x.split("E2", "i", [2]), "E2 is inlined and has no loops")
    _fails(st, lambda x: x.compute_at("E2", "E3", "i"), "inlined")


def test_from_json_garbage():
    st = _matmul_relu()
    with pytest.raises(ScheduleError, match="not a serialized step"):
        State.from_json(st.dag, '[["XX", 1]]')


# ---------------------------------------------------------------------------------------------
# lowering and runtime errors


def test_unfilled_split_length_is_a_lowering_error():
    st = _matmul_relu()
    st.split("C", "i", [None])
    assert st.stage("C").iters[0].extent is None
    assert "None" in str(st)
    with pytest.raises(LoweringError, match="iterator i_.* has an unfilled split length"):
        build(st)
    st2 = State.from_json(st.dag, st.to_json())
    assert st2 == st


def test_gpu_binding_is_a_lowering_error():
    st = _matmul_relu()
    st.bind("D", "i", "threadIdx.x")
    with pytest.raises(LoweringError, match="GPU bindings need a CUDA target"):
        build(st)


def test_runtime_wrong_dtype_shape_count_layout():
    st = _matmul_relu()
    f = build(st)
    a = np.ones((8, 6), "float32")
    b = np.ones((6, 4), "float32")
    d = np.empty((8, 4), "float32")
    f(a, b, d)
    np.testing.assert_allclose(d, 6.0)
    with pytest.raises(RuntimeCallError, match=r"argument A: expected float32\[8, 6\], got float64\[8, 6\]"):
        f.run(a.astype("float64"), b)
    with pytest.raises(RuntimeCallError, match=r"argument B: expected float32\[6, 4\], got float32\[4, 6\]"):
        f.run(a, np.ones((4, 6), "float32"))
    with pytest.raises(RuntimeCallError, match="takes 3 arrays"):
        f(a, b)
    with pytest.raises(RuntimeCallError, match="not C-contiguous"):
        f.run(np.asfortranarray(a), b)
    with pytest.raises(RuntimeCallError, match="expected a numpy array"):
        f.run(a.tolist(), b)
