"""A model built with programs that store their arguments in layouts of their own (ALT): the model follows them
(graph.backend.layouts: conversion kernels, packed constants, layouts propagated along element-wise kernels,
absorbed Transposes) and still computes what ONNX Runtime computes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fuzz_graph_check import compare, feeds, validate
from fuzz_graphs import random_model
from onnx import TensorProto, helper

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.backend.default_schedule import default_schedule
from tensorgen.graph.backend.layout_choice import layout_tasks
from tensorgen.graph.backend.layouts import conversion_dag
from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.load import load_graph
from tensorgen.measure.types import MeasureResult
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.record import Record
from tensorgen.runtime.model import CompiledModel
from tensorgen.schedule.laid_out import lay_out
from tensorgen.schedule.layout import Fuse, Layout, Pad, Reorder, Split, StoreAt
from tensorgen.schedule.state import with_layouts
from tensorgen.search.layouts import LAYOUT_TEMPLATES
from tensorgen.tuning.tune import make_task


def random_layout(shape: tuple[int, ...], rng: np.random.Generator) -> list:
    """A few random splits, reorders, fuses and pads of a tensor of `shape` (unfold needs a sliding reader)."""
    prims: list = []
    for _ in range(rng.integers(1, 4)):
        dims = Layout.of(shape, prims).new_shape
        d = int(rng.integers(len(dims)))
        kind = rng.choice(["split", "reorder", "fuse", "pad"])
        if kind == "split":
            divisors = [f for f in range(2, dims[d]) if dims[d] % f == 0]
            if not divisors:
                continue
            f = int(rng.choice(divisors))
            prim = Split(d, (dims[d] // f, f))
        elif kind == "reorder":
            prim = Reorder(tuple(int(i) for i in rng.permutation(len(dims))))
        elif kind == "fuse":
            prim = Fuse(d, int(rng.integers(d, len(dims))))
        else:
            prim = Pad(d, int(rng.integers(1, 3)))
        try:
            Layout.of(shape, [*prims, prim])
        except Exception:  # noqa: BLE001 - a pad of a split dimension, ...: draw another
            continue
        prims.append(prim)
    return prims


def commit_laid_out(db, task, layouts, cost: float = 1e-9) -> None:
    """A record of `task` storing its tensors in `layouts`, with the default loops, "measured" at `cost`."""
    state = with_layouts(task.dag, layouts, default_schedule(lay_out(task.dag, layouts), 2))
    db.commit_record(Record.from_measure(task, state, MeasureResult((cost,))))


def kernels(out) -> list[str]:
    return [k["name"].split("_", 1)[1] for k in json.loads((out / "model.json").read_text())["kernels"]]


def run(proto, out) -> list[np.ndarray]:
    inputs = feeds(proto)
    return CompiledModel(out, threads=2).run([inputs[i.name] for i in proto.graph.input])


def commit_random_layouts(db, graph, rng: np.random.Generator, cost=lambda: 1e-9) -> int:
    """A record with random argument layouts (ALT's template's or any) for about every other task of `graph`, at
    `cost()`; how many tasks got one."""
    template = LAYOUT_TEMPLATES["tiling"]
    laid = 0
    for model_task in extract_tasks(graph):
        dag = model_task.task.dag
        space = template.space(dag)
        if space is not None and rng.random() < 0.5:
            layouts = template.layouts(dag, space.sample(rng))  # ALT's own: unfolded conv inputs, tiled outputs
        else:
            layouts = {t.name: random_layout(t.shape, rng) for t in [*dag.inputs, *dag.outputs] if rng.random() < 0.6}
        layouts = {name: prims for name, prims in layouts.items() if prims}
        laid += bool(layouts)
        commit_laid_out(db, model_task.task, layouts, cost())
    return laid


@pytest.mark.parametrize("seed", [3, 8, 14, 21, 33])
def test_random_models_follow_random_argument_layouts(seed, tmp_path):
    rng = np.random.default_rng(seed)
    proto = random_model(rng)
    graph = load_graph(proto)
    db = SQLiteDatabase(tmp_path / "db")
    laid = commit_random_layouts(db, graph, rng)
    out = build_model(graph, tmp_path / "model", db=db)
    assert compare(run(proto, out), validate(proto)) is None
    assert not laid or "layout_transform" in kernels(out)


@pytest.mark.parametrize("seed", [5, 12])
def test_random_models_charge_random_layouts_for_their_conversions(seed, tmp_path):
    """Plain and laid-out records of random costs: whichever layouts the build keeps, the model computes the same."""
    rng = np.random.default_rng(seed)
    proto = random_model(rng)
    graph = load_graph(proto)
    db = SQLiteDatabase(tmp_path / "db")
    commit_random_layouts(db, graph, rng, cost=lambda: float(rng.uniform(1e-6, 1e-4)))
    for model_task in extract_tasks(graph):
        if rng.random() < 0.7:
            commit_laid_out(db, model_task.task, {}, float(rng.uniform(1e-6, 1e-4)))
    out = build_model(graph, tmp_path / "model", db=db)
    assert compare(run(proto, out), validate(proto)) is None


def _onnx(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "laid", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _tensor(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _weight(name, shape):
    data = np.linspace(-1, 1, int(np.prod(shape))).astype(np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT, shape, data)


def test_element_wise_kernels_take_the_layout_of_what_they_read(tmp_path):
    """m is read by two kernels (so nothing fuses into the matmul): both run in m's tiled layout (the second, with
    the Add fused, reads the first's output in it too); the only conversion is the graph output's, back to plain."""
    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
                   helper.make_node("Tanh", ["m"], ["t"]), helper.make_node("Add", ["s", "t"], ["y"])],
                  [_tensor("x", [8, 16])], [_tensor("y", [8, 12])], [_weight("w", [16, 12])])
    db = SQLiteDatabase(tmp_path / "db")
    (matmul, *others) = [t.task for t in extract_tasks(load_graph(proto))]
    commit_laid_out(db, matmul, {matmul.dag.outputs[0].name: [Split(1, (3, 4)), Reorder((1, 0, 2))]})
    out = build_model(proto, tmp_path / "model", db=db)
    assert kernels(out) == ["mat_mul", "tanh", "sigmoid_add", "layout_transform"]
    assert compare(run(proto, out), validate(proto)) is None


def test_a_padded_layout_is_not_propagated(tmp_path):
    """ALT's constraint: padding (data expansion) stops at the element-wise kernel, which reads a plain copy."""
    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
                   helper.make_node("Tanh", ["m"], ["y"])],
                  [_tensor("x", [8, 16])], [_tensor("s", [8, 12]), _tensor("y", [8, 12])], [_weight("w", [16, 12])])
    db = SQLiteDatabase(tmp_path / "db")
    matmul = extract_tasks(load_graph(proto))[0].task
    commit_laid_out(db, matmul, {matmul.dag.outputs[0].name: [Pad(1, 4)], matmul.dag.inputs[1].name: [Pad(0, 3)]})
    out = build_model(proto, tmp_path / "model", db=db)
    assert kernels(out) == ["mat_mul", "layout_transform", "sigmoid", "tanh"]
    assert compare(run(proto, out), validate(proto)) is None


def test_a_transpose_of_a_laid_out_value_is_absorbed_into_its_conversion(tmp_path):
    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]),
                   helper.make_node("Transpose", ["m"], ["y"], perm=[1, 0])],
                  [_tensor("x", [8, 16])], [_tensor("y", [12, 8])], [_weight("w", [16, 12])])
    db = SQLiteDatabase(tmp_path / "db")
    matmul = extract_tasks(load_graph(proto))[0].task
    commit_laid_out(db, matmul, {matmul.dag.outputs[0].name: [Split(0, (2, 4))]})
    out = build_model(proto, tmp_path / "model", db=db)
    assert kernels(out) == ["mat_mul", "layout_transform"]  # no transpose kernel: one copy, laid out -> transposed
    assert compare(run(proto, out), validate(proto)) is None


@pytest.mark.parametrize("laid, plain, conversion, kept", [(1e-6, 2e-6, None, True), (1e-6, 1.01e-6, None, False),
                                                           (1e-6, 2e-6, 5e-6, False)])
def test_a_layout_is_kept_only_where_it_pays_for_its_conversions(laid, plain, conversion, kept, tmp_path):
    """The first MatMul's laid-out record beats its plain one; the second reads m plain, so the layout costs a
    conversion (untimed: its bytes at layout_choice.UNTIMED_GBS, about 0.1 us here; timed: its record). The layout stays
    only where its gain is larger."""
    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("MatMul", ["m", "v"], ["y"])],
                  [_tensor("x", [8, 16])], [_tensor("y", [8, 4])], [_weight("w", [16, 12]), _weight("v", [12, 4])])
    db = SQLiteDatabase(tmp_path / "db")
    first = extract_tasks(load_graph(proto))[0].task
    tiled = [Split(1, (3, 4)), Reorder((1, 0, 2))]
    commit_laid_out(db, first, {first.dag.outputs[0].name: tiled}, laid)
    commit_laid_out(db, first, {}, plain)
    if conversion is not None:
        copy = make_task(lay_out(conversion_dag((8, 12), "float32"), {"input0": tiled}))
        commit_laid_out(db, copy, {}, conversion)
    out = build_model(proto, tmp_path / "model", db=db)
    assert ("layout_transform" in kernels(out)) == kept
    assert compare(run(proto, out), validate(proto)) is None


@pytest.mark.parametrize("absorbed, kept", [(2e-6, True), (9e-6, False)])
def test_a_reader_reads_its_producers_layout_where_its_record_pays(absorbed, kept, tmp_path):
    """The second MatMul (2 us plain) reading m in the first one's tiled layout: a task of its own (layout_tasks,
    seeded with its own loops, next to the conversion it would save); where its record beats 2 us plus the
    conversion, the build reads m so, no copy."""
    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("MatMul", ["m", "v"], ["y"])],
                  [_tensor("x", [8, 16])], [_tensor("y", [8, 4])], [_weight("w", [16, 12]), _weight("v", [12, 4])])
    db = SQLiteDatabase(tmp_path / "db")
    first, second = [t.task for t in extract_tasks(load_graph(proto))]
    commit_laid_out(db, first, {first.dag.outputs[0].name: [Split(1, (3, 4)), Reorder((1, 0, 2))]}, 1e-6)
    commit_laid_out(db, second, {}, 2e-6)
    (copy, no_seeds), (reader, (seed,)) = layout_tasks(proto, db)  # the conversion, or the reader absorbing it
    assert copy.task.desc == "layout_transform" and not no_seeds
    assert reader.task.dag.inputs[0].shape == (3, 8, 4) and seed.dag is reader.task.dag
    db.commit_record(Record.from_measure(reader.task, seed, MeasureResult((absorbed,))))
    out = build_model(proto, tmp_path / "model", db=db)
    assert kernels(out) == (["mat_mul", "mat_mul"] if kept else ["mat_mul", "layout_transform", "mat_mul"])
    assert compare(run(proto, out), validate(proto)) is None


def test_tune_policy_alt_tunes_the_kernels_its_layouts_add(tmp_path, capsys, monkeypatch):
    """`tensorgen tune MODEL --policy alt`: after the model's tasks, the last tenth of the budget goes to the tasks
    the database's layouts add (layout_tasks, here of a database where the first MatMul's layout won); a reader of
    its producer's layout starts from its own loops, measured first."""
    from tensorgen.cli.main import main

    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("MatMul", ["m", "v"], ["y"])],
                  [_tensor("x", [8, 16])], [_tensor("y", [8, 4])], [_weight("w", [16, 12]), _weight("v", [12, 4])])
    path = tmp_path / "two_matmuls.onnx"
    path.write_bytes(proto.SerializeToString())
    first = extract_tasks(load_graph(proto))[0].task
    with SQLiteDatabase(tmp_path / "won") as won:
        commit_laid_out(won, first, {first.dag.outputs[0].name: [Split(1, (3, 4)), Reorder((1, 0, 2))]}, 1e-9)
        found = layout_tasks(proto, won)
    monkeypatch.setattr("tensorgen.graph.backend.layout_choice.layout_tasks", lambda *args: found)
    db_path = tmp_path / "db"
    assert main(["tune", str(path), "--policy", "alt", "--trials", "40", "--batch-size", "2",
                 "--db", str(db_path)]) == 0  # 36 trials on the model's tasks, 2 on each layout task
    assert "2 tasks of layout conversions" in capsys.readouterr().out
    (reader, (seed,)) = found[1]
    with SQLiteDatabase(db_path) as db:
        records = db.top_k(reader.task.workload_key, "cpu", 5)
        assert len(records) == 2 and seed.steps in [r.state(reader.task.dag).steps for r in records]


def test_tune_policy_alt_without_layouts_spends_the_whole_budget_on_the_model(tmp_path, capsys):
    """No record lays out anything (no layout task): the tenth kept for layout tasks goes to the model's tasks."""
    from tensorgen.cli.main import main

    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["y"])], [_tensor("x", [8, 16])], [_tensor("y", [8, 12])],
                  [_weight("w", [16, 12])])
    path = tmp_path / "matmul.onnx"
    path.write_bytes(proto.SerializeToString())
    assert main(["tune", str(path), "--policy", "alt", "--trials", "20", "--batch-size", "2",
                 "--db", str(tmp_path / "db")]) == 0
    out = capsys.readouterr().out
    assert "layout conversions" not in out and "20 trials in" in out


def test_a_bias_stored_in_its_weights_buffer_is_packed_with_it(tmp_path):
    """store_at: the MatMul + Add kernel's record stores the bias after each column of the weight; the build packs
    both constants into one buffer, the kernel takes no bias argument, and the model computes what ORT does."""
    proto = _onnx([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                  [_tensor("x", [8, 16])], [_tensor("y", [8, 12])], [_weight("w", [16, 12]), _weight("b", [12])])
    db = SQLiteDatabase(tmp_path / "db")
    (task,) = [t.task for t in extract_tasks(load_graph(proto))]
    weight, bias = (t for t in task.dag.inputs if t.attrs.get("constant"))
    commit_laid_out(db, task, {weight.name: [StoreAt(0, bias.name), Split(1, (3, 4)), Reorder((1, 0, 2))]})
    out = build_model(proto, tmp_path / "model", db=db)
    (kernel,) = json.loads((out / "model.json").read_text())["kernels"]
    signature = next(line for line in (out / "model.c").read_text().splitlines()
                     if line.startswith(f"void {kernel['name']}("))
    assert signature.count("float*") == 3  # x, the weight with its bias, y
    assert compare(run(proto, out), validate(proto)) is None
