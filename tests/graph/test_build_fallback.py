"""build_model survives a program it cannot use: a record whose steps do not replay on its subgraph, and a
kernel the compiler rejects, each get the default schedule with a warning, and the model still matches ONNX
Runtime."""

from __future__ import annotations

import json
import logging
import os
import stat

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import partition
from tensorgen.hardware import hardware_for
from tensorgen.measure.types import MeasureResult
from tensorgen.records import SQLiteDatabase
from tensorgen.records.record import Record
from tensorgen.runtime.model import CompiledModel
from tensorgen.schedule.state import State
from tensorgen.target import Target
from tensorgen.task import SearchTask


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _store(db_path, proto, make_record) -> None:
    """One record for the model's first subgraph, made by `make_record(task, state)`."""
    target = Target.parse("cpu")
    sub = partition(load_graph(proto)).subgraphs[0]
    task = SearchTask(sub.dag, target, hardware_for(target))
    with SQLiteDatabase(db_path) as db:
        db.commit_record(make_record(task, State(sub.dag)))


def _check(proto, out) -> dict:
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    (want,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    (got,) = CompiledModel(out, threads=1).run([x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return json.loads((out / "model.json").read_text())["kernels"][0]


def test_a_record_that_does_not_replay_falls_back_with_a_warning(tmp_path, caplog):
    proto = _mlp()

    def broken(task, state):
        good = Record.from_measure(task, state, MeasureResult((1e-3,)))
        return Record.from_dict({**good.to_dict(), "steps": [["SP", 0, "nope", [2], True]]})

    _store(tmp_path / "t.db", proto, broken)
    with SQLiteDatabase(tmp_path / "t.db") as db, caplog.at_level(logging.WARNING):
        out = build_model(proto, tmp_path / "m", db=db)
    assert "does not replay" in caplog.text
    assert _check(proto, out)["schedule"] == "default"


def test_a_kernel_the_compiler_rejects_gets_the_default_schedule(tmp_path, caplog):
    """A compiler that rejects one construct (here: any `#pragma GCC unroll`, which only the tuned program of
    the first kernel has) fails the module; the kernel is found by compiling each alone and rebuilt."""
    proto = _mlp()

    def unrolled(task, state):
        name = state.stages[-1].name
        state.unroll(name, state.stages[-1].iters[-1].name)
        return Record.from_measure(task, state, MeasureResult((1e-3,)))

    _store(tmp_path / "t.db", proto, unrolled)
    cc = tmp_path / "picky-cc"
    cc.write_text("#!/bin/sh\nfor a; do case $a in *.c) grep -q 'pragma GCC unroll' \"$a\" && "
                  "{ echo \"$a: error: unroll is not supported\" >&2; exit 1; };; esac; done\nexec gcc \"$@\"\n")
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    os.environ["CC"], old = str(cc), os.environ.get("CC")
    try:
        with SQLiteDatabase(tmp_path / "t.db") as db, caplog.at_level(logging.WARNING):
            out = build_model(proto, tmp_path / "m", db=db)
    finally:
        os.environ.pop("CC") if old is None else os.environ.__setitem__("CC", old)
    kernel = _check(proto, out)
    assert kernel["schedule"] == "default" and "unroll is not supported" in kernel["fallback"]
    assert "gets the default schedule" in caplog.text and "pragma GCC unroll" not in (out / "model.c").read_text()
