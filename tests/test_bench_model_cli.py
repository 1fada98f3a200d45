"""What `tensorgen bench MODEL` reports: a speedup only for an output that equals ONNX Runtime's within
float32 tolerance (graph.compare.OUTPUT_RTOL; HALF_OUTPUT_RTOL for a float16 output), through the real CLI entry
point."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorgen.graph.reference.compare as compare
from tensorgen.cli import main
from tensorgen.records.database import SQLiteDatabase


def _tiny_model(dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", dtype, [2, 8])
    y = helper.make_tensor_value_info("y", dtype, [2, 4])
    w = helper.make_tensor("w", dtype, [8, 4], np.linspace(-1, 1, 32))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "tiny", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _bench(tmp_path, capsys, dtype: int = TensorProto.FLOAT) -> tuple[int, str, dict]:
    path, db = tmp_path / "tiny.onnx", tmp_path / "t.db"
    onnx.save(_tiny_model(dtype), path)
    SQLiteDatabase(db).close()
    rc = main(["bench", str(path), "--db", str(db), "--blocks", "2", "--threads", "1", "--json",
               str(tmp_path / "b.json")])
    return rc, capsys.readouterr().out, json.loads((tmp_path / "b.json").read_text())


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_bench_reports_the_speedup_of_a_correct_output(dtype, tmp_path, capsys, quick_timing):
    rc, out, result = _bench(tmp_path, capsys, dtype)
    assert rc == 0 and "as fast" in out and "WRONG OUTPUT" not in out
    half = dtype == TensorProto.FLOAT16
    assert result["output_rtol"] == (compare.HALF_OUTPUT_RTOL if half else compare.OUTPUT_RTOL)
    assert result["output_ok"] is True and result["max_rel_err_vs_onnxruntime"] <= result["output_rtol"]
    assert set(result["ratios"]) == {"onnxruntime"}  # the node-by-node interpreter is no peer
    assert result["ratios"]["onnxruntime"] == result["onnxruntime_ms"] / result["tensorgen_ms"]  # one statistic
    assert result["torch_ms"] is None and "torch " not in out


def test_bench_refuses_a_speedup_for_a_wrong_output(tmp_path, capsys, monkeypatch, quick_timing):
    """Against a peer that computes twice the model, tensorgen's output differs: no speedup, exit 1."""
    real = compare.onnxruntime_engine

    def doubled(onnx_model, feeds, threads):
        run, reference = real(onnx_model, feeds, threads)
        return run, [2 * np.asarray(o) + 1 for o in reference]

    monkeypatch.setattr(compare, "onnxruntime_engine", doubled)
    rc, out, result = _bench(tmp_path, capsys)
    assert rc == 1 and "WRONG OUTPUT" in out and "as fast" not in out
    assert result["output_ok"] is False and result["ratios"] == {}
    assert result["max_rel_err_vs_onnxruntime"] > compare.OUTPUT_RTOL
