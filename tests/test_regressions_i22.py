"""Issue 22's wrong-answer and crash bugs in scheduling and code generation, each from its smallest reproducer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tensorgen import te
from tensorgen.build import build
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.load import load_graph
from tensorgen.graph.reference.compare import onnxruntime_runner
from tensorgen.measure.types import MeasureResult
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.record import Record
from tensorgen.runtime.model import CompiledModel
from tensorgen.schedule.layout_rewrite import rewrite_layout
from tensorgen.schedule.state import State
from tensorgen.te import ops

OPSET = [helper.make_opsetid("", 17)]


def _cls_concat(constant: bool) -> State:
    """ViT's token sequence: a class token [1, C] before the patches, read as cls[i, j] under i < 1."""
    cls = te.placeholder((1, 8), name="cls", constant=constant)
    x = te.placeholder((4, 8), name="x")
    return State([cls, x, ops.concatenate([cls, x], axis=0)])


def test_a_constant_read_under_a_guard_is_not_repacked_to_its_readers_extent():
    """The concat's loop i spans 5 rows, cls has 1: a layout from i's tiles held 5 rows (ViT build:
    "cannot reshape array of size 192 into shape (197,192)")."""
    state = _cls_concat(constant=True)
    rewritten, plans = rewrite_layout(state)
    assert plans == [] and rewritten is state
    rng = np.random.default_rng(0)
    cls, x = rng.standard_normal((1, 8), dtype=np.float32), rng.standard_normal((4, 8), dtype=np.float32)
    (out,) = build(rewritten).run(cls, x)
    np.testing.assert_array_equal(out, np.concatenate([cls, x]))


def test_run_time_packing_of_a_guarded_read_copies_the_tensor_as_it_is():
    state = _cls_concat(constant=False).pack_layout("cls", "concatenate")
    assert state.stage("cls_packed").tensor.shape == (1, 8)
    rng = np.random.default_rng(1)
    cls, x = rng.standard_normal((1, 8), dtype=np.float32), rng.standard_normal((4, 8), dtype=np.float32)
    (out,) = build(state).run(cls, x)
    np.testing.assert_array_equal(out, np.concatenate([cls, x]))


def _vit_embedding() -> onnx.ModelProto:
    """Patches [1, 4, 8] -> Concat(class token, patches) -> + positional embedding, as ViT starts."""
    rng = np.random.default_rng(2)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 8])
    cls = helper.make_tensor("cls", TensorProto.FLOAT, [1, 1, 8], rng.standard_normal(8).astype(np.float32))
    pos = helper.make_tensor("pos", TensorProto.FLOAT, [1, 5, 8], rng.standard_normal(40).astype(np.float32))
    nodes = [helper.make_node("Concat", ["cls", "x"], ["t"], axis=1), helper.make_node("Add", ["t", "pos"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "vit_embed", [x], [y], [cls, pos]), opset_imports=OPSET,
                             ir_version=8)


def test_model_with_a_record_computing_the_guarded_read_at_root_builds(tmp_path):
    proto = _vit_embedding()
    db = SQLiteDatabase(tmp_path / "t.db")
    (task,) = extract_tasks(load_graph(proto))
    state = State(task.task.dag)  # every stage at root: the concat reads the class token at its own loops
    db.commit_record(Record.from_measure(task.task, state, MeasureResult((1e-6,))))
    directory = build_model(proto, tmp_path / "out", db=db)
    graph = load_graph(proto)
    x = np.random.default_rng(3).standard_normal((1, 4, 8), dtype=np.float32)
    (ours,) = CompiledModel(directory, threads=1).run([x])
    (ref,) = onnxruntime_runner(proto, graph, 1)([x])
    np.testing.assert_array_equal(ours, ref)


def test_integer_product_of_a_quotient_keeps_its_grouping_in_c():
    """`i * ((i + 1) // 2)` was printed `i * (i + 1) / 2`, which C evaluates as (i * (i + 1)) / 2: a dilated
    average pool divided by the wrong counts."""
    out = te.compute((8,), lambda i: te.cast(i * ((i + 1) // 2) + i * ((i + 2) % 3), "float32"), name="out")
    f = build(State([out]))
    i = np.arange(8)
    np.testing.assert_array_equal(f.run()[0], (i * ((i + 1) // 2) + i * ((i + 2) % 3)).astype(np.float32))


def _with_nans(shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x.ravel()[rng.permutation(x.size)[: x.size // 4]] = np.nan
    return x


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vectorized"])
def test_max_min_relu_and_max_reduction_propagate_nan(vector):
    """Relu(NaN) came out 0 (`a > b ? a : b`): NumPy's maximum/minimum and max reduction give NaN, as
    ONNX Runtime does, in a scalar loop and in a vectorized one."""
    x, y = te.placeholder((4, 32), name="x"), te.placeholder((4, 32), name="y")
    ew = te.compute((4, 32), lambda i, j: te.max_expr(x[i, j], 0.0) + te.min_expr(x[i, j], y[i, j])
                    + te.max_expr(y[i, j], x[i, j]), name="ew")
    k = te.reduce_axis(4, "k")
    red = te.compute((32,), lambda j: te.max(x[k, j], axis=k), name="red")
    a, b = _with_nans((4, 32), 0), _with_nans((4, 32), 1)
    for out, ref in ((ew, np.maximum(a, 0) + np.minimum(a, b) + np.maximum(b, a)), (red, a.max(axis=0))):
        s = State([x, y, out] if out is ew else [x, out])
        if vector:
            s.split(out.name, "j", [8])
            if out is red:
                s.reorder(out.name, ["j_0", "k", "j_1"])
            s.vectorize(out.name, "j_1")
        f = build(s)
        got = f.run(a, b)[0] if out is ew else f.run(a)[0]
        assert np.isnan(ref).any()
        np.testing.assert_array_equal(got, ref, err_msg=f.source)


def test_a_lane_invariant_sum_times_a_vector_keeps_its_parentheses():
    """Graph fuzzer, seed 1020 (ansor): `(s[0] - c) * b[i, j]` vectorized over j was emitted as
    `(s[0] - c * vector)`: the lane-invariant operand lost its parentheses (the scalar tail was right)."""
    from tensorgen.dag import ComputeDAG

    s = te.placeholder((1,), name="s")
    b = te.placeholder((4, 14), name="b")
    out = te.compute((4, 14), lambda i, j: (s[0] - (-0.25)) * b[i, j], name="out")
    state = State(ComputeDAG([s, b, out]))
    state.split("out", "j", [7])
    state.vectorize("out", "j_1")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(1).astype(np.float32), rng.standard_normal((4, 14)).astype(np.float32)
    (got,) = build(state).run(x, y)
    np.testing.assert_allclose(got, (x[0] + 0.25) * y, rtol=1e-6)


def test_unrolled_loops_over_a_stack_tile_come_out_right_from_gcc():
    """Graph fuzzer, seed 2014 (random): a grouped, dilated conv whose padded input is a 108-float stack tile read
    under six `#pragma GCC unroll 2` loops was wrong from gcc 12.2 -O3 alone (right at -O2, under UBSan, or
    with any one pragma removed); gcc's loop-pattern distribution (memset/memcpy) is off for every kernel."""
    from pathlib import Path

    from reference import conv

    record = Record.from_json_line((Path(__file__).parent / "data" / "gcc12_stack_tile_conv.jsonl").read_text())
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in [(4, 8, 7, 3), (2, 2, 1, 6), (6,)])
    f = build(record.state())
    assert f.source.count("#pragma GCC unroll 2") == 6 and "conv_pad[108]" in f.source  # still the case it was
    (out,) = f.run(x, w, b)
    ref = conv(x, w, stride=(1, 2), padding=(0, 0, 0, 2), dilation=(1, 2), groups=3) + b
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f.source)
