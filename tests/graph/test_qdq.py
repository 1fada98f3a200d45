"""Quantized models (tensorgen.graph.frontend.onnx_quantized): QDQ pairs, integer weights and the integer ops of
dynamic quantization computed in float, against ONNX Runtime running the same model op by op and against NumPy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fuzz_graph_check import onnxruntime_outputs, tensorgen_outputs
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

from tensorgen.graph.frontend.onnx_quantized import INTEGER_RANGES, quantized_in_float
from tensorgen.graph.ir import GraphError
from tensorgen.graph.load import load_graph

ort.set_default_logger_severity(3)


def _quantize_numpy(x, scale, zero, low, high):
    return np.clip(np.round(x / scale) + zero, low, high)  # np.round: half to even, as QuantizeLinear


@pytest.mark.parametrize("kind", [TensorProto.UINT8, TensorProto.INT8, TensorProto.INT16])
@pytest.mark.parametrize("per_axis", [False, True])
@pytest.mark.parametrize("zero_point", [True, False])
def test_a_quantize_dequantize_pair_equals_onnxruntime_exactly(kind, per_axis, zero_point, tmp_path):
    """x -> QuantizeLinear -> DequantizeLinear -> Relu, on values that land on half steps (rounded to even) and
    past the integer range (saturated); a scale per channel (axis 1) or one for the tensor."""
    rng = np.random.default_rng(kind)
    channels = 3
    scale = (rng.uniform(0.01, 0.1, channels) if per_axis else np.array(0.05)).astype(np.float32)
    low, high = INTEGER_RANGES[kind]
    np_type = helper.tensor_dtype_to_np_dtype(kind)
    zero = (rng.integers(low // 4, high // 4 + 1, channels) if per_axis else np.array(3 if low < 0 else 100))
    zero = zero.astype(np_type)
    shape = (2, channels, 5)
    steps = rng.integers(-2 * abs(low) - 50, 2 * high + 50, shape) + rng.choice([0, 0.5, 0.25], shape)
    shaped = scale.reshape(1, channels, 1) if per_axis else scale
    x = (steps * shaped).astype(np.float32)
    init = [numpy_helper.from_array(scale, "s")] + ([numpy_helper.from_array(zero, "z")] if zero_point else [])
    qz = ["x", "s", "z"] if zero_point else ["x", "s"]
    attrs = {"axis": 1} if per_axis else {}
    typed = not zero_point and kind != TensorProto.UINT8  # the integer type from output_dtype (opset 21)
    attrs_q = {**attrs, "output_dtype": kind} if typed else attrs
    opset = 21 if typed or kind == TensorProto.INT16 else 13
    nodes = [helper.make_node("QuantizeLinear", qz, ["q"], **attrs_q),
             helper.make_node("DequantizeLinear", ["q", *qz[1:]], ["d"], **attrs),
             helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    (ours,) = tensorgen_outputs(model, {"x": x}, tmp_path)
    (theirs,) = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(ours, theirs)
    z = zero.astype(np.float32).reshape(shaped.shape) if zero_point else 0.0
    expected = np.maximum((_quantize_numpy(x, shaped, z, low, high) - z) * shaped, 0)
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)
    assert {n.op_type for n in quantized_in_float(model).graph.node}.isdisjoint({"QuantizeLinear", "DequantizeLinear"})


class Calibration(CalibrationDataReader):
    def __init__(self, name: str, shape: tuple[int, ...], count: int = 4):
        self.name, self.shape, self.left = name, shape, count

    def get_next(self):
        self.left -= 1
        return {self.name: np.random.default_rng(self.left).standard_normal(self.shape).astype(np.float32)} \
            if self.left >= 0 else None


def _small_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32))

    inits = [w(8, 3, 3, 3), w(8), w(16, 8, 3, 3), w(16), w(10, 16 * 4 * 4), w(10)]
    for t, name in zip(inits, ("w1", "b1", "w2", "b2", "fw", "fb")):
        t.name = name
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("activations", [QuantType.QUInt8, QuantType.QInt8])
def test_a_model_quantized_by_onnxruntime_equals_it_to_a_step(per_channel, activations, tmp_path):
    """onnxruntime.quantization.quantize_static (QDQ, int8 weights per tensor or per channel, int32 biases) over a
    small CNN: every output within one step of the output's grid of ONNX Runtime's (two engines that sum in
    different orders may round a value at a step's edge either way), and most of them equal."""
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_small_cnn(), src)
    quantize_static(str(src), str(dst), Calibration("x", (1, 3, 8, 8)), quant_format=QuantFormat.QDQ,
                    activation_type=activations, weight_type=QuantType.QInt8, per_channel=per_channel)
    model = onnx.load(dst)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    x = np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (ours,) = tensorgen_outputs(model, {"x": x}, tmp_path)
    (theirs,) = onnxruntime_outputs(model, {"x": x})
    last_dq = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == last_dq.input[1])))
    assert np.abs(ours - theirs).max() <= step * 1.001 and np.mean(ours == theirs) >= 0.7, (ours, theirs, step)


def test_what_stays_refused_is_one_line():
    """A QuantizeLinear whose integers are returned: no 8-bit tensors leave a compiled model."""
    s = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    graph = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s"], ["q"])], "q",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("q", TensorProto.UINT8, [4])], [s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphError, match="QuantizeLinear.*: its integers are read by an op that is not a quantized") \
            as err:
        load_graph(model)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("weight_zero", ["none", "scalar", "per_column"])
def test_dynamic_quantization_of_a_matmul_equals_onnxruntime(weight_zero, tmp_path):
    """DynamicQuantizeLinear -> MatMulInteger (int8 weights, their zero point absent, one, or per column) -> Cast ->
    Mul by both scales, as quantize_dynamic writes a Linear layer: equal to the integer arithmetic in NumPy.

    Not ONNX Runtime: on an x86 CPU with AVX2 and no VNNI its u8 x s8 MatMulInteger adds products in pairs that
    saturate at int16 (vpmaddubsw), so its answer differs from the operator's definition wherever two products of
    a pair add past 32767 (a third of this test's outputs on an AMD EPYC without VNNI: 10.81 where the sum is 12.97)."""
    rng = np.random.default_rng(4)
    k, n = 32, 6
    weights = rng.integers(-128, 128, (k, n)).astype(np.int8)
    zero = {"none": None, "scalar": np.array(3, np.int8), "per_column": rng.integers(-5, 6, n).astype(np.int8)}
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array(0.02, np.float32), "ws")]
    mm_inputs = ["xq", "w", "xz"]
    if zero[weight_zero] is not None:
        inits.append(numpy_helper.from_array(zero[weight_zero], "wz"))
        mm_inputs.append("wz")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", mm_inputs, ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 5, k)).astype(np.float32) + 0.3
    (ours,) = tensorgen_outputs(model, {"x": x}, tmp_path)
    low, high = np.float32(min(0.0, x.min())), np.float32(max(0.0, x.max()))  # DynamicQuantizeLinear, as ONNX says
    x_scale = (high - low) / np.float32(255)
    x_zero = np.clip(np.round(-low / x_scale), 0, 255)
    xq = _quantize_numpy(x, x_scale, x_zero, 0, 255).astype(np.int64) - int(x_zero)
    wq = weights.astype(np.int64) - (0 if zero[weight_zero] is None else zero[weight_zero].astype(np.int64))
    want = (xq @ wq).astype(np.float32) * (x_scale * np.float32(0.02))
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=0)


def test_dynamic_quantization_of_a_conv_equals_onnxruntime(tmp_path):
    """DynamicQuantizeLinear -> ConvInteger (padded: the padding reads the zero point; strided; a weight zero point)
    -> Cast."""
    rng = np.random.default_rng(5)
    weights = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array(-2, np.int8), "wz")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "xs"], ["y"])]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    (ours,) = tensorgen_outputs(model, {"x": x}, tmp_path)
    (theirs,) = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(ours, theirs)


def test_a_model_quantized_dynamically_by_onnxruntime(tmp_path):
    """onnxruntime.quantization.quantize_dynamic over an MLP (DynamicQuantizeLinear + MatMulInteger for each Linear
    layer): equal to ONNX Runtime within float32 rounding."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "table"),
             numpy_helper.from_array((rng.standard_normal((16, 32)) / 4).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((32, 8)) / 6).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 8])], inits)
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gather"])
    model = onnx.load(dst)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    ids = rng.integers(0, 50, (2, 7)).astype(np.int64)
    (ours,) = tensorgen_outputs(model, {"ids": ids}, tmp_path)
    (theirs,) = onnxruntime_outputs(model, {"ids": ids})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_integers_moved_between_quantized_ops(tmp_path):
    """A Gather of an int8 embedding table (quantize_dynamic's), and a MaxPool and Reshape of uint8 activations
    between a QuantizeLinear and its DequantizeLinear: the same ops on the grids, equal to ONNX Runtime."""
    rng = np.random.default_rng(8)
    constants = {"table": rng.integers(-128, 128, (20, 8)).astype(np.int8), "ts": np.array(0.05, np.float32),
                 "tz": np.array(4, np.int8), "s": np.array(0.1, np.float32), "z": np.array(128, np.uint8),
                 "shape": np.array([2, 8, 4], np.int64)}
    inits = [numpy_helper.from_array(a, name) for name, a in constants.items()]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("DequantizeLinear", ["e", "ts", "tz"], ["ef"]),
             helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("MaxPool", ["xq"], ["pq"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["pq", "shape"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["p"])]
    graph = helper.make_graph(nodes, "moves", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3]),
                                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 8, 8])],
                              [helper.make_tensor_value_info("ef", TensorProto.FLOAT, [3, 8]),
                               helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 8, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"ids": np.array([3, 19, 0], np.int64), "x": rng.standard_normal((2, 2, 8, 8)).astype(np.float32) * 5}
    for ours, theirs in zip(tensorgen_outputs(model, feeds, tmp_path), onnxruntime_outputs(model, feeds)):
        np.testing.assert_array_equal(ours, theirs)
