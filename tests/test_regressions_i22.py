"""Issue 22's wrong-answer and crash bugs in scheduling and code generation, each from its smallest reproducer."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tensorgen import te
from tensorgen.build import build
from tensorgen.graph.build import build_model
from tensorgen.graph.compare import onnxruntime_runner
from tensorgen.graph.load import load_graph
from tensorgen.graph.tasks import extract_tasks
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
