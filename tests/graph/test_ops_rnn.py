"""ONNX RNN, GRU and LSTM, unrolled over the sequence at import (tensorgen.graph.frontend.normalize_rnn), built and
compared with ONNX Runtime: every direction, initial states, peepholes, GRU's linear_before_reset, LSTM's clip and
input_forget, other activations, outputs left out, and the batch-first layout (which ONNX Runtime lacks: it runs
the same weights in layout 0 on the transposed inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.ir import GraphError
from tensorgen.runtime.model import CompiledModel

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
STEPS, BATCH, SIZE, HIDDEN = 4, 2, 3, 5


def _model(op: str, direction: str = "forward", layout: int = 0, initial: bool = False, peepholes: bool = False,
           outputs: tuple[bool, ...] = (True, True, True), seed: int = 0, **attrs) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(seed)
    gates, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((BATCH, STEPS, SIZE) if layout else (STEPS, BATCH, SIZE)).astype(np.float32)
    weights = {"W": (dirs, gates * HIDDEN, SIZE), "R": (dirs, gates * HIDDEN, HIDDEN), "B": (dirs, 2 * gates * HIDDEN)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), k) for k, s in weights.items()]
    inputs, feeds = ["x", "W", "R", "B", ""], {"x": x}
    if initial:
        state = (BATCH, dirs, HIDDEN) if layout else (dirs, BATCH, HIDDEN)
        for name in ("h0", "c0")[:2 if op == "LSTM" else 1]:
            feeds[name] = rng.standard_normal(state).astype(np.float32)
            inputs.append(name)
    if peepholes:
        inputs += [""] * (7 - len(inputs)) + ["P"]
        inits.append(numpy_helper.from_array((rng.standard_normal((dirs, 3 * HIDDEN)) * 0.5).astype(np.float32), "P"))
    names = [name if kept else "" for name, kept in zip(("Y", "Y_h", "Y_c")[:3 if op == "LSTM" else 2], outputs)]
    node = helper.make_node(op, inputs, names, hidden_size=HIDDEN, direction=direction, layout=layout, **attrs)
    infos = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in feeds.items()]
    graph = helper.make_graph([node], "recurrent", infos,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), feeds


def _onnxruntime(model: onnx.ModelProto, feeds: dict, layout: int) -> list[np.ndarray]:
    if not layout:
        return ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    seq_first = onnx.ModelProto()
    seq_first.CopyFrom(model)
    next(a for a in seq_first.graph.node[0].attribute if a.name == "layout").i = 0
    for vi in seq_first.graph.input:
        dims = vi.type.tensor_type.shape.dim
        dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    outs = ort.InferenceSession(seq_first.SerializeToString()).run(
        None, {k: np.swapaxes(v, 0, 1).copy() for k, v in feeds.items()})
    return [np.transpose(y, (2, 0, 1, 3)) if y.ndim == 4 else np.swapaxes(y, 0, 1) for y in outs]


def _side_by_side(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """One model running the one-node models on their shared input x, each node's weights and outputs renamed."""
    nodes, inits, outputs = [], [], []
    for k, model in enumerate(models):
        rename = {t.name: f"{t.name}{k}" for t in model.graph.initializer}
        rename.update({o.name: f"{o.name}{k}" for o in model.graph.output})
        node = model.graph.node[0]
        nodes.append(helper.make_node(node.op_type, [rename.get(i, i) for i in node.input],
                                      [rename.get(o, o) for o in node.output], name=f"n{k}"))
        nodes[-1].attribute.extend(node.attribute)
        for t in model.graph.initializer:
            inits.append(numpy_helper.from_array(numpy_helper.to_array(t), rename[t.name]))
        outputs += [helper.make_tensor_value_info(rename[o.name], TensorProto.FLOAT, None) for o in model.graph.output]
    graph = helper.make_graph(nodes, "side_by_side", list(models[0].graph.input), outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


@pytest.mark.parametrize("op", sorted(GATES))
def test_each_direction_matches_onnxruntime(op, tmp_path):
    """Forward, reverse and bidirectional, side by side in one model (one build)."""
    models = [_model(op, direction)[0] for direction in ("forward", "reverse", "bidirectional")]
    _check(_side_by_side(models), _model(op)[1], 0, tmp_path)


@pytest.mark.parametrize(("op", "options"), [
    ("LSTM", {"direction": "bidirectional", "layout": 1, "initial": True}),
    ("LSTM", {"peepholes": True, "initial": True, "clip": 0.5}),
    ("LSTM", {"input_forget": 1, "activations": ["HardSigmoid", "Tanh", "Softsign"], "activation_alpha": [0.3],
              "outputs": (False, True, False)}),
    ("GRU", {"direction": "bidirectional", "layout": 1, "linear_before_reset": 1, "initial": True}),
    ("RNN", {"activations": ["Relu"], "initial": True, "outputs": (False, True)}),
])
def test_options_match_onnxruntime(op, options, tmp_path):
    _check(*_model(op, **options), options.get("layout", 0), tmp_path)


def _check(model: onnx.ModelProto, feeds: dict, layout: int, tmp_path) -> None:
    ref = _onnxruntime(model, feeds, layout)
    ours = CompiledModel(build_model(model, tmp_path / "model"), threads=1).run(list(feeds.values()))
    assert [y.shape for y in ours] == [y.shape for y in ref]
    for got, want in zip(ours, ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_refusals_are_one_line():
    model, _ = _model("LSTM")
    lens = numpy_helper.from_array(np.array([STEPS, STEPS - 1], np.int32), "lens")
    model.graph.initializer.append(lens)
    model.graph.node[0].input[4] = "lens"
    with pytest.raises(GraphError, match=r"\(LSTM\): sequence_lens \[4, 3\] shorter than the sequence"):
        import_onnx(model)
    model, _ = _model("GRU", activations=["Sigmoid", "ScaledTanh"])
    with pytest.raises(GraphError, match=r"\(GRU\): activation 'ScaledTanh' is not supported"):
        import_onnx(model)
    model, _ = _model("RNN")
    model.graph.initializer.pop(1)  # R becomes a graph input: computed at run time
    model.graph.input.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, [1, HIDDEN, HIDDEN]))
    with pytest.raises(GraphError, match=r"\(RNN\): input 'R' \(R\) must be a constant"):
        import_onnx(model)
