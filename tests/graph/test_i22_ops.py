"""Issue 22's operator bugs found against ONNX Runtime: ceil-mode pooling shapes, NaN propagation, Gather
bounds. Each compiled model is compared with ONNX Runtime on the same inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.load import load_graph
from tensorgen.runtime.model import CompiledModel

OPSET = 19


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "i22", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def _ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the declared output shapes are what ONNX shape inference says
    return ort.InferenceSession(proto.SerializeToString(), options).run(None, feeds)


def _ours(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path) -> list[np.ndarray]:
    model = CompiledModel(build_model(proto, tmp_path / "model"), threads=1)
    return model.run([feeds[n] for n in load_graph(proto).inputs])


def _random_pool(rng: np.random.Generator, k: int) -> tuple[onnx.NodeProto, onnx.ValueInfoProto, str]:
    """One 2-D pooling node drawn at random: Max or Average (count_include_pad either way), kernel,
    stride, dilation, pads below the kernel, ceil_mode, and an input the dilated window fits in."""
    op = ["MaxPool", "AveragePool"][rng.integers(2)]
    kernel, stride, dil = ([int(v) for v in rng.integers(1, hi, 2)] for hi in (4, 4, 3))
    pads = [int(rng.integers(0, kv)) if rng.integers(2) else 0 for kv in kernel * 2]
    size = [int(rng.integers(max(1, d * (kv - 1) + 1 - p - q), 8)) for kv, d, p, q in zip(kernel, dil, pads[:2],
                                                                                          pads[2:])]
    attrs = {"kernel_shape": kernel, "strides": stride, "dilations": dil, "pads": pads,
             "ceil_mode": int(rng.integers(2))}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(2))
    x = helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, 2, *size])
    return helper.make_node(op, [f"x{k}"], [f"y{k}"], **attrs), x, f"y{k}"


def test_random_pools_match_onnxruntime_shapes_and_values(tmp_path):
    """Among them the reproducer: kernel 1, stride 2, 2x2 input, ceil_mode: the second window would
    start past the input (ONNX shape inference says 2x2, ONNX Runtime gives 1x1)."""
    rng = np.random.default_rng(22)
    nodes, inputs, outputs = [], [], []
    for k in range(48):
        node, x, y = _random_pool(rng, k)
        nodes.append(node)
        inputs.append(x)
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    repro = helper.make_tensor_value_info("xr", TensorProto.FLOAT, [1, 1, 2, 2])
    for op in ("MaxPool", "AveragePool"):
        nodes.append(helper.make_node(op, ["xr"], [f"r_{op}"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1))
        outputs.append(helper.make_tensor_value_info(f"r_{op}", TensorProto.FLOAT, None))
    proto = _model(nodes, [*inputs, repro], outputs)
    feeds = {x.name: rng.standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim]).astype(np.float32)
             for x in proto.graph.input}
    ref = _ort(proto, feeds)
    assert ref[-1].shape == ref[-2].shape == (1, 1, 1, 1)
    for node, a, b in zip(nodes, _ours(proto, feeds, tmp_path), ref):
        assert a.shape == b.shape, node
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(node))


def _nan_data(rng: np.random.Generator, shape) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    x.ravel()[rng.permutation(x.size)[: x.size // 4]] = np.nan
    return x


def test_nan_propagates_through_max_min_relu_clip_as_in_onnxruntime_and_through_reductions(tmp_path):
    """ONNX Runtime returns NaN where an operand of Relu, Max, Min or Clip is NaN; the generated
    `a > b ? a : b` returned the other operand (Relu(NaN) = 0). Its MaxPool (and ReduceMax) give NaN
    only where the NaN is the last (first) element of the window, an artifact of their loop order;
    tensorgen's give NaN wherever a NaN is, as NumPy and PyTorch do, the one answer that does not
    depend on the schedule."""
    shape = [2, 3, 8, 16]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "y"))
    lo, hi = (helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("lo", -0.5), ("hi", 0.5)))
    nodes = [helper.make_node("Relu", ["x"], ["relu"]), helper.make_node("Max", ["x", "y"], ["max"]),
             helper.make_node("Min", ["x", "y"], ["min"]), helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
             helper.make_node("MaxPool", ["y"], ["pool"], kernel_shape=[2, 2], strides=[2, 2])]
    names = ["relu", "max", "min", "clip", "pool"]
    proto = _model(nodes, [x, y], [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
                   [lo, hi])
    rng = np.random.default_rng(4)
    feeds = {"x": _nan_data(rng, shape), "y": _nan_data(rng, shape)}
    feeds["y"][0, 0, 0, :] = np.nan  # Max/Min with NaN on both sides as well
    ours = _ours(proto, feeds, tmp_path)
    ref = _ort(proto, feeds)[:4]
    assert np.isnan(ref[0]).any()
    for name, a, b in zip(names, ours, ref):
        np.testing.assert_array_equal(a, b, err_msg=name)  # NaN where ORT has NaN, equal elsewhere
    windows = feeds["y"].reshape(2, 3, 4, 2, 8, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 4, 8, 4)
    np.testing.assert_array_equal(ours[4], windows.max(axis=-1))


def _embedding(vocab: int = 10, width: int = 4, tokens: int = 6) -> onnx.ModelProto:
    """Token ids -> Gather rows of a [vocab, width] table -> Relu (a kernel of its own after the gather)."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [vocab, width],
                               np.arange(vocab * width, dtype=np.float32) - 7)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, tokens])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0), helper.make_node("Relu", ["rows"], ["y"])]
    return _model(nodes, [ids], [y], [table])


def test_token_ids_past_the_vocabulary_are_a_named_error_and_negative_ids_wrap(tmp_path):
    """The generated Gather read outside the table (garbage, or a segfault for a huge id) where ONNX
    Runtime returns INVALID_ARGUMENT."""
    import pytest

    from tensorgen.errors import TensorgenError

    proto = _embedding()
    model = CompiledModel(build_model(proto, tmp_path / "model"), threads=1)
    ok = np.array([[0, 9, -1, -10, 3, 5]], dtype=np.int64)  # negative ids count from the end, as in ORT
    np.testing.assert_array_equal(model.run([ok])[0], _ort(proto, {"ids": ok})[0])
    for bad, position in ((10, 4), (-11, 0), (2**40, 5)):
        ids = ok.copy()
        ids[0, position] = bad
        with pytest.raises(TensorgenError, match=rf"input 'ids' .*Gather.* holds {bad} at flat position {position}, "
                                                  r"outside \[-10, 10\)") as err:
            model.run([ids])
        assert "\n" not in str(err.value)
        with pytest.raises(Exception, match="out of bounds|INVALID_ARGUMENT|invalid"):
            _ort(proto, {"ids": ids})
    np.testing.assert_array_equal(model.run([ok])[0], _ort(proto, {"ids": ok})[0])  # the model still runs


def test_constant_indices_outside_the_table_are_refused_at_build(tmp_path):
    import pytest

    from tensorgen.errors import TensorgenError

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    idx = helper.make_tensor("idx", TensorProto.INT64, [2], [1, 5])
    proto = _model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=0)], [x], [y], [idx])
    with pytest.raises(TensorgenError, match=r"indices 1..5 out of range for axis 0 of size 5"):
        build_model(proto, tmp_path / "model")


def test_computed_token_ids_are_checked_too(tmp_path):
    """ids + 1 would fuse into the Gather's kernel, where no check sees it: the Gather runs apart."""
    import pytest

    from tensorgen.errors import TensorgenError

    proto = _embedding()
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    proto.graph.initializer.append(one)
    proto.graph.node.insert(0, helper.make_node("Add", ["ids", "one"], ["next"]))
    proto.graph.node[1].input[1] = "next"
    model = CompiledModel(build_model(proto, tmp_path / "model"), threads=1)
    ok = np.array([[0, 8, -1, -11, 3, 5]], dtype=np.int64)
    np.testing.assert_array_equal(model.run([ok])[0], _ort(proto, {"ids": ok})[0])
    with pytest.raises(TensorgenError, match=r"value 'next' .* holds 10 at flat position 1"):
        model.run([ok + np.array([[0, 1, 0, 0, 0, 0]])])
