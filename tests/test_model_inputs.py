"""A model's real inputs (issue 24): integer inputs get the range of what they index through shape-preserving ops,
`--shape NAME=DIMS` fixes symbolic dimensions, `--inputs FILE.npz` hands in a user's arrays (checked by name, shape
and dtype), and `tensorgen run` writes a model's outputs on them. Checked against ONNX Runtime, which refuses an
index out of range and computes the GPT-2-style model on its own."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.cli import main
from tensorgen.graph.frontend.onnx_inputs import random_inputs
from tensorgen.graph.ir import GraphError

VOCAB, POSITIONS, WIDTH = 50, 32, 16


def _model(nodes, inputs, outputs, weights=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(w, n) for n, w in weights])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ids(name="ids", elem=TensorProto.INT64, shape=(2, 8)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _out(name="y", shape=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _table(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


def _ort(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def test_ids_through_a_reshape_take_the_rows_of_the_table_they_gather_from():
    nodes = [helper.make_node("Reshape", ["ids", "flat"], ["r"]), helper.make_node("Gather", ["table", "r"], ["y"])]
    model = _model(nodes, [_ids()], [_out()], [("table", _table(7)), ("flat", np.array([-1], np.int64))])
    ids = random_inputs(model, seed=1)["ids"]
    assert ids.dtype == np.int64 and ids.shape == (2, 8) and ids.min() >= 0 and ids.max() == 6
    np.testing.assert_array_equal(_ort(model, {"ids": ids})[0], _table(7)[ids.reshape(-1)])


def test_a_chain_through_cast_and_unsqueeze_takes_the_smallest_table_it_reaches():
    nodes = [helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["c", "zero"], ["u"]),
             helper.make_node("Gather", ["big", "u"], ["y"]),
             helper.make_node("Squeeze", ["u", "zero"], ["s"]),
             helper.make_node("Gather", ["small", "s"], ["z"], axis=1)]
    model = _model(nodes, [_ids(elem=TensorProto.INT32)], [_out(), _out("z")],
                   [("big", _table(9)), ("small", _table(3).T.copy()), ("zero", np.array([0], np.int64))])
    feed = random_inputs(model, seed=2)
    assert feed["ids"].dtype == np.int32 and feed["ids"].max() == 2 and feed["ids"].min() == 0  # [0, 3): small's axis 1
    y, z = _ort(model, feed)
    np.testing.assert_array_equal(z, _table(3).T[:, feed["ids"]])


def test_an_integer_input_nothing_bounds_says_how_to_pass_inputs():
    nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT), helper.make_node("Neg", ["f"], ["y"])]
    model = _model(nodes, [_ids()], [_out()])
    with pytest.raises(GraphError, match=r"input 'ids' \(int64\[2, 8\]\) is not float.*--inputs FILE\.npz"):
        random_inputs(model)


def _gpt2_style() -> onnx.ModelProto:
    """What torch.onnx exports of GPT-2, small: token ids (batch, seq) viewed as (-1, seq) into the token table,
    position ids from Shape -> Gather -> Range -> Unsqueeze into the position table, LayerNormalization, one
    causal attention head (mask: ConstantOfShape -> Trilu -> Cast -> Where with float32's lowest), logits."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def c(value):
        return np.array(value, np.int64)

    weights = [("wte", w(VOCAB, WIDTH)), ("wpe", w(POSITIONS, WIDTH)), ("gamma", 1 + w(WIDTH) / 4),
               ("beta", w(WIDTH) / 4), ("wq", w(WIDTH, WIDTH)), ("wk", w(WIDTH, WIDTH)), ("wv", w(WIDTH, WIDTH)),
               ("bq", w(WIDTH) / 4), ("head", w(WIDTH, VOCAB)), ("last", c(-1)), ("minus1", c([-1])),
               ("zero", c(0)), ("one", c(1)), ("axis0", c([0])), ("scale", np.array(WIDTH ** -0.5, np.float32)),
               ("lowest", np.array(np.finfo(np.float32).min, np.float32))]
    n = helper.make_node
    nodes = [
        n("Shape", ["input_ids"], ["shape"]), n("Gather", ["shape", "last"], ["seq"]),
        n("Unsqueeze", ["seq", "axis0"], ["seq1"]), n("Concat", ["minus1", "seq1"], ["view"], axis=0),
        n("Reshape", ["input_ids", "view"], ["ids"]), n("Gather", ["wte", "ids"], ["tok"]),
        n("Range", ["zero", "seq", "one"], ["pos"]), n("Unsqueeze", ["pos", "axis0"], ["pos2"]),
        n("Gather", ["wpe", "pos2"], ["pe"]), n("Add", ["tok", "pe"], ["h"]),
        n("LayerNormalization", ["h", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]), n("MatMul", ["ln", "wk"], ["k"]),
        n("MatMul", ["ln", "wv"], ["v"]), n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]),
        n("Concat", ["seq1", "seq1"], ["square"], axis=0),
        n("ConstantOfShape", ["square"], ["ones"], value=numpy_helper.from_array(np.array([1], np.int64))),
        n("Trilu", ["ones"], ["lower"], upper=0), n("Cast", ["lower"], ["mask"], to=TensorProto.BOOL),
        n("Where", ["mask", "s", "lowest"], ["masked"]), n("Softmax", ["masked"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["ctx"]), n("Add", ["h", "ctx"], ["h2"]),
        n("LayerNormalization", ["h2", "gamma", "beta"], ["ln2"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln2", "head"], ["logits"]),
    ]  # fmt: skip
    return _model(nodes, [_ids("input_ids", shape=("batch", "seq"))],
                  [_out("logits", ("batch", "seq", VOCAB))], weights)


@pytest.fixture
def gpt2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no tuning.db of the working directory: every kernel gets the default schedule
    onnx.save(_gpt2_style(), tmp_path / "gpt2.onnx")
    return str(tmp_path / "gpt2.onnx")


def test_a_symbolic_dimension_needs_a_shape_and_a_shape_needs_the_declared_rank(gpt2, capsys):
    assert main(["bench", gpt2]) == 2
    assert "input 'input_ids' has a symbolic dimension int64[batch, seq]; fix it with --shape input_ids=1x1" in \
           capsys.readouterr().err
    assert main(["tune", gpt2, "--trials", "0", "--db", "t.db"]) == 2
    assert "--shape input_ids=1x1" in capsys.readouterr().err
    assert main(["tune", gpt2, "--shape", "input_ids=1x16", "--trials", "0", "--db", "t.db"]) == 0
    assert "tasks; tuning 0 trials" in capsys.readouterr().out
    for bad, says in [("input_ids=1x16x2", "declares int64[batch, seq]"), ("ids=1x16", "'ids', which the model"),
                      ("input_ids=1xa", "is not dimensions"), ("input_ids", "is not NAME=DIMS")]:
        assert main(["build", gpt2, "--shape", bad, "-o", "out"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tensorgen: error:") and says in err and err.count("\n") == 1


def test_inputs_that_do_not_match_the_model_are_one_line_naming_the_input(gpt2, tmp_path, capsys):
    ids = np.zeros((1, 16), np.int64)
    cases = [({"ids": ids}, "has no array 'input_ids'"), ({"input_ids": ids, "mask": ids}, "has 'mask', which the"),
             ({"input_ids": ids[0]}, "input 'input_ids' the shape 16, but the model declares int64[batch, seq]"),
             ({"input_ids": ids.astype(np.int32)}, "input 'input_ids' is int32, but the model takes int64")]
    for arrays, says in cases:
        np.savez(tmp_path / "in.npz", **arrays)
        assert main(["bench", gpt2, "--inputs", "in.npz"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tensorgen: error: in.npz") and says in err and err.count("\n") == 1, err
    np.savez(tmp_path / "in.npz", input_ids=ids)
    assert main(["run", gpt2, "--inputs", "in.npz", "--shape", "input_ids=1x8", "-o", "out.npz"]) == 2
    assert "has the shape 1x16, but --shape says 1x8" in capsys.readouterr().err
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert main(["run", gpt2, "--inputs", "junk.npz", "-o", "out.npz"]) == 2
    assert "inputs file 'junk.npz' is not an .npz of arrays" in capsys.readouterr().err


def test_a_gpt2_style_model_benches_end_to_end_with_its_outputs_equal_to_onnxruntime(gpt2, capsys, quick_timing):
    assert main(["bench", gpt2, "--shape", "input_ids=1x16", "--candidates", "1", "--blocks", "2", "--threads", "1",
                 "--json", "b.json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(open("b.json").read())
    assert result["output_ok"] is True and result["max_rel_err_vs_onnxruntime"] <= result["output_rtol"], out
    assert "tensorgen is" in out and "as fast" in out


def test_run_writes_the_outputs_onnxruntime_computes_on_the_same_inputs(gpt2, capsys):
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, 12)).astype(np.int64)
    np.savez("in.npz", input_ids=ids)
    (want,) = _ort(_gpt2_style(), {"input_ids": ids})
    assert main(["build", gpt2, "--inputs", "in.npz", "--candidates", "1", "-o", "built"]) == 0
    for model in (gpt2, "built"):  # an .onnx file (built into a temporary directory) and a build directory
        assert main(["run", model, "--inputs", "in.npz", "-o", "out.npz"]) == 0
        assert "wrote out.npz: logits float32[2, 12, 50]" in capsys.readouterr().out
        with np.load("out.npz") as got:
            assert list(got.files) == ["logits"]
            np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.savez("in.npz", input_ids=ids[:1])
    assert main(["run", "built", "--inputs", "in.npz", "-o", "out.npz"]) == 2
    assert "input 'input_ids': expected int64[2, 12], got int64[1, 12]" in capsys.readouterr().err
