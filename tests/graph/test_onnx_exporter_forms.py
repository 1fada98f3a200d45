"""Valid ONNX models in forms exporters write that a fault hunt found refused or mangled (session 37): each is built
and compared with ONNX Runtime on the same inputs."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.cli import main
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.load import load_graph
from tensorgen.runtime.model import CompiledModel

FLOAT = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "forms", inputs, outputs, list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, FLOAT, shape)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _check(proto: onnx.ModelProto, tmp_path, seed: int = 0, tol: float = 1e-5) -> None:
    rng = np.random.default_rng(seed)
    feeds = {x.name: rng.standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim]).astype(np.float32)
             for x in proto.graph.input}
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run(
        [feeds[n] for n in load_graph(proto).inputs])
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 17])
def test_reduce_mean_over_everything_before_opset_18(opset, keepdims, tmp_path):
    """torch.mean(x) as exported: no axes, and no noop_with_empty_axes attribute before opset 18."""
    node = helper.make_node("ReduceMean", ["x"], ["y"], keepdims=keepdims)
    _check(_model([node], [_vi("x", [2, 3])], [_vi("y", [1, 1] if keepdims else [])], opset=opset), tmp_path)


def test_layer_norm_with_its_mean_output_left_out(tmp_path):
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "", "inv_std"], axis=-1)
    rng = np.random.default_rng(1)
    _check(_model([node], [_vi("x", [3, 8])], [_vi("y", [3, 8]), _vi("inv_std", [3, 1])],
                  [_const("g", rng.standard_normal(8))]), tmp_path)


def test_erf_gelu_whose_constant_broadcasts_x_to_a_higher_rank(tmp_path):
    """Not rewritten into a Gelu of x's shape: the (1, 1) half makes the output (1, 7)."""
    nodes = [helper.make_node("Div", ["x", "s2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["x", "e1"], ["xm"]),
             helper.make_node("Mul", ["xm", "half"], ["y"])]
    _check(_model(nodes, [_vi("x", [7])], [_vi("y", [1, 7])],
                  [_const("s2", np.sqrt(2)), _const("one", 1.0), _const("half", np.full((1, 1), 0.5))]), tmp_path)


def test_a_scalar_input_given_in_an_npz_file(tmp_path, monkeypatch):
    """`run --inputs` with a 0-d array for a 0-d input (it was read as shape (1,) and refused)."""
    monkeypatch.chdir(tmp_path)
    proto = _model([helper.make_node("Mul", ["x", "s"], ["y"])], [_vi("x", [3, 4]), _vi("s", [])], [_vi("y", [3, 4])])
    onnx.save(proto, "m.onnx")
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32), "s": np.array(1.5, np.float32)}
    np.savez("in.npz", **feeds)
    assert main(["run", "m.onnx", "--inputs", "in.npz", "-o", "out.npz"]) == 0
    np.testing.assert_allclose(np.load("out.npz")["y"], feeds["x"] * 1.5, rtol=1e-6)


UNARY = {"Log": {}, "Elu": {"alpha": 0.7}, "Selu": {}, "Celu": {"alpha": 1.5}, "ThresholdedRelu": {"alpha": 0.3},
         "Softplus": {}, "Softsign": {}, "Mish": {}}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_activations_match_onnxruntime(op, tmp_path):
    """On values from -30 to 30 (Softplus and Mish where exp over- and underflows; Log of their absolute value)."""
    x = np.concatenate([np.linspace(-30, 30, 61), np.random.default_rng(3).standard_normal(67)]).astype(np.float32)
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node(op, ["a"], ["y"], **UNARY[op])] if op == "Log" \
        else [helper.make_node(op, ["x"], ["y"], **UNARY[op])]
    proto = _model(nodes, [_vi("x", [2, 64])], [_vi("y", [2, 64])], opset=18)
    feeds = {"x": x.reshape(2, 64)}
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([feeds["x"]])[0]
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-6 if op != "Mish" else 1e-5)


def test_prelu_sum_mean_global_max_pool_and_log_softmax_after_a_conv(tmp_path):
    """A per-channel PRelu slope (C, 1, 1) and GlobalMaxPool on the channels-last values a Conv leaves, 3-input
    Sum and Mean with broadcasting, LogSoftmax on the channel axis."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("PRelu", ["c", "slope"], ["p"]),
             helper.make_node("Sum", ["p", "c", "b"], ["s"]),
             helper.make_node("Mean", ["s", "p", "b"], ["m"]),
             helper.make_node("GlobalMaxPool", ["m"], ["g"]),
             helper.make_node("LogSoftmax", ["m"], ["ls"], axis=1)]
    _check(_model(nodes, [_vi("x", [2, 3, 6, 6])], [_vi("g", [2, 8, 1, 1]), _vi("ls", [2, 8, 6, 6])],
                  [_const("w", rng.standard_normal((8, 3, 3, 3))), _const("slope", rng.random((8, 1, 1))),
                   _const("b", rng.standard_normal((6,)))]), tmp_path)


def test_log_softmax_is_stable_on_large_logits(tmp_path):
    proto = _model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], [_vi("x", [3, 1000])],
                   [_vi("y", [3, 1000])])
    feeds = {"x": (np.random.default_rng(5).standard_normal((3, 1000)) * 100).astype(np.float32)}
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([feeds["x"]])[0]
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-3)


def test_masks_computed_at_run_time(tmp_path):
    """Comparisons and logic on run-time tensors (HuggingFace's attention masks, x > 0): Where reads them, Cast
    turns one into floats, and one is itself an output (bool)."""
    vi_int = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 6])
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Where", ["pos", "x", "neg"], ["w"]),
             helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["keep"]),
             helper.make_node("LessOrEqual", ["x", "half"], ["small"]),
             helper.make_node("And", ["keep", "small"], ["both"]),
             helper.make_node("Or", ["both", "pos"], ["either"]),
             helper.make_node("Xor", ["either", "is_pad"], ["odd"]),
             helper.make_node("Cast", ["odd"], ["f"], to=FLOAT),
             helper.make_node("Less", ["w", "f"], ["lt"]),
             helper.make_node("GreaterOrEqual", ["ids", "pad"], ["ge"])]
    outputs = [_vi("w", [2, 6]), _vi("f", [2, 6]), helper.make_tensor_value_info("lt", TensorProto.BOOL, [2, 6]),
               helper.make_tensor_value_info("ge", TensorProto.BOOL, [2, 6])]
    proto = _model(nodes, [_vi("x", [2, 6]), vi_int], outputs,
                   [_const("zero", 0.0), _const("neg", -1.0), _const("half", 0.5),
                    numpy_helper.from_array(np.array(3, np.int64), "pad")])
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 6)).astype(np.float32), "ids": rng.integers(0, 6, (2, 6))}
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([feeds["x"], feeds["ids"]])
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(2, 8, 5, 6), (3, 8, 7)])
def test_instance_normalization_after_a_conv(shape, tmp_path):
    rng = np.random.default_rng(7)
    kernel = [3] * (len(shape) - 2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * (2 * len(kernel))),
             helper.make_node("InstanceNormalization", ["c", "s", "b"], ["y"], epsilon=1e-4)]
    _check(_model(nodes, [_vi("x", [shape[0], 4, *shape[2:]])], [_vi("y", list(shape))],
                  [_const("w", rng.standard_normal((8, 4, *kernel))), _const("s", rng.standard_normal(8)),
                   _const("b", rng.standard_normal(8))]), tmp_path)


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("out", [(9, 5), (3, 2), (12, 12)])
def test_linear_resize_after_a_conv(mode, out, tmp_path):
    """Bilinear up- and downsampling (segmentation heads), every coordinate mode, checked against ONNX Runtime."""
    rng = np.random.default_rng(8)
    sizes = numpy_helper.from_array(np.array([2, 4, *out], np.int64), "sizes")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["y"], mode="linear",
                              coordinate_transformation_mode=mode)]
    _check(_model(nodes, [_vi("x", [2, 3, 6, 4])], [_vi("y", [2, 4, *out])],
                  [_const("w", rng.standard_normal((4, 3, 3, 3))), sizes], opset=13), tmp_path)


def test_nodes_named_like_the_functions_and_keywords_of_c(tmp_path):
    """Float64 Log/Exp named `log`, `exp`, `for`: a buffer named `log` shadowed log() (`log[i] = log(x[i])` did not
    compile in a model's pooled loop)."""
    double = TensorProto.DOUBLE
    nodes = [helper.make_node(op, [x], [y], name=name) for op, x, y, name in (
        ("Log", "x", "log", "log"), ("Exp", "log", "exp", "exp"), ("Sqrt", "exp", "for", "for"),
        ("Tanh", "for", "y", "int"))]
    proto = _model(nodes, [helper.make_tensor_value_info("x", double, [64, 3])],
                   [helper.make_tensor_value_info("y", double, [64, 3])])
    feeds = {"x": np.random.default_rng(9).random((64, 3)) + 0.1}
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([feeds["x"]])[0],
                               ref, rtol=1e-12)


def test_bool_masks_moved_around_and_returned(tmp_path):
    """A mask made after a conv (channels-last there) is a graph output, transposed, expanded, sliced, gathered and
    concatenated; one cast from floats (0.5 is true) selects."""
    rng = np.random.default_rng(10)
    boolean = TensorProto.BOOL
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Greater", ["c", "zero"], ["mask"]),
             helper.make_node("Transpose", ["mask"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Gather", ["s", "index"], ["g"], axis=3),
             helper.make_node("Expand", ["g", "shape"], ["e"]),
             helper.make_node("Concat", ["e", "e"], ["cat"], axis=0),
             helper.make_node("Cast", ["x"], ["xb"], to=boolean),
             helper.make_node("Where", ["xb", "x", "zero"], ["wb"])]
    outputs = [helper.make_tensor_value_info("mask", boolean, [2, 4, 5, 7]),
               helper.make_tensor_value_info("cat", boolean, [4, 3, 7, 2]), _vi("wb", [2, 3, 5, 7])]
    proto = _model(nodes, [_vi("x", [2, 3, 5, 7])], outputs,
                   [_const("w", rng.standard_normal((4, 3, 3, 3))), _const("zero", 0.0),
                    *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                      (("starts", [1]), ("ends", [4]), ("axes", [1]), ("index", [0, 2]), ("shape", [2, 3, 7, 2])))])
    feeds = {"x": rng.standard_normal((2, 3, 5, 7)).astype(np.float32)}
    feeds["x"][0, 0, 0, :3] = (0.0, 0.5, -0.25)
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([feeds["x"]])
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keepdims, last", [(1, 0, 0), (-1, 1, 0), (0, 1, 1), (2, 0, 1)])
def test_arg_max_and_min_with_ties(op, axis, keepdims, last, tmp_path):
    """Segmentation heads end in ArgMax over the classes; ties (the first, or the last index) as ONNX Runtime."""
    x = np.random.default_rng(11).integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    shape = [1 if d == axis % 3 else n for d, n in enumerate((3, 4, 5)) if keepdims or d != axis % 3]
    proto = _model([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
                   [_vi("x", [3, 4, 5])], [helper.make_tensor_value_info("y", TensorProto.INT64, shape)])
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([x])[0], ref)


def test_arg_max_of_a_vector_is_a_scalar(tmp_path):
    x = np.array([1.0, 3.0, np.nan, 3.0, np.nan], np.float32)  # NaN is the largest, the first one: 2
    proto = _model([helper.make_node("ArgMax", ["x"], ["y"], keepdims=0)], [_vi("x", [5])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, [])])
    assert CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([x])[0] == 2


@pytest.mark.parametrize(("mode", "coordinates", "scale"), [
    ("linear", "align_corners", 0.5), ("linear", "align_corners", 1.7), ("nearest", "align_corners", 0.5),
    ("linear", "pytorch_half_pixel", 0.2), ("nearest", "pytorch_half_pixel", 0.2)])
def test_resize_whose_scaled_length_is_fractional(mode, coordinates, scale, tmp_path):
    """F.interpolate(scale_factor=0.5, align_corners=True) of 5 -> 2 points reads rows 0 and 4 (the output length
    less one divides, as in ONNX Runtime and PyTorch); it read 0 and 2.67. A one-element output of
    pytorch_half_pixel reads coordinate 0."""
    scales = np.array([1, 1, scale, scale], np.float32)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=coordinates,
                            **({"nearest_mode": "floor"} if mode == "nearest" else {}))
    out = [int(np.floor(5 * scale))] * 2
    proto = _model([node], [_vi("x", [1, 2, 5, 5])], [_vi("y", [1, 2, *out])], [numpy_helper.from_array(scales, "s")],
                   opset=18)
    _check(proto, tmp_path)


def _i64(name: str, *values: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def test_an_empty_slice_concatenated_back_and_returned(tmp_path):
    """GPT-J's rotary embedding with rotary_dim equal to the head size: the pass-through part is x[..., 8:] of an
    axis of 8, empty, computed on (Neg) and concatenated back; an empty value is also a graph output."""
    nodes = [helper.make_node("Slice", ["x", "s0", "s8", "ax"], ["rot"]),
             helper.make_node("Slice", ["x", "s8", "end", "ax"], ["rest"]),
             helper.make_node("Neg", ["rest"], ["e"]),
             helper.make_node("Relu", ["rot"], ["r"]),
             helper.make_node("Concat", ["r", "e"], ["y"], axis=-1)]
    inits = [_i64("s0", 0), _i64("s8", 8), _i64("end", 100), _i64("ax", 3)]
    _check(_model(nodes, [_vi("x", [1, 8, 4, 8])], [_vi("y", [1, 8, 4, 8]), _vi("e", [1, 8, 4, 0])], inits), tmp_path)


def test_an_empty_input_gives_an_empty_output(tmp_path):
    """Valid ONNX, once refused as a fault: an input with a dim of 0, its Relu empty too (a constant, no kernel)."""
    _check(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [0, 4])], [_vi("y", [0, 4])]), tmp_path)


def test_gather_elements_along_an_axis_of_64_or_more_folds(tmp_path):
    """BERT's token type ids as the TorchScript exporter writes them: a (1, 64) buffer of zeros, GatherElements of
    its first 8 positions folded at import (onnx.reference's own fails from 64 choices on)."""
    buffer = numpy_helper.from_array(np.arange(128, dtype=np.int64).reshape(1, 128) % 3, "buffer")
    nodes = [helper.make_node("GatherElements", ["buffer", "positions"], ["ids"], axis=1),
             helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Add", ["x", "rows"], ["y"])]
    positions = numpy_helper.from_array(np.array([[5, 70, 127, -1, 0, 64, 100, 2]], np.int64), "positions")
    table = _const("table", np.random.default_rng(2).standard_normal((3, 4)))
    _check(_model(nodes, [_vi("x", [1, 8, 4])], [_vi("y", [1, 8, 4])], [buffer, positions, table]), tmp_path)


@pytest.mark.parametrize("op, attrs", [
    ("AveragePool", {"ceil_mode": 1, "count_include_pad": 1}), ("AveragePool", {"ceil_mode": 1, "pads": [1, 0, 1, 0]}),
    ("MaxPool", {"ceil_mode": 1}), ("MaxPool", {"ceil_mode": 1, "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"ceil_mode": 1, "dilations": [2, 1], "strides": [5120, 2560]}),
])
def test_a_pool_window_far_wider_than_its_input(op, attrs, tmp_path):
    """EfficientNet's pooler as HuggingFace writes it, AvgPool2d(hidden_dim, ceil_mode=True) over the last feature
    map: a 2560 x 2560 window over 3 x 2 pixels. Only the window offsets that meet the input are read: padded to the
    whole window, EfficientNet's input took 67 GB."""
    from tensorgen.graph.backend.tasks import extract_tasks

    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[2560, 2560], **{"strides": [2560, 2560], **attrs})
    proto = _model([node], [_vi("x", [1, 4, 3, 2])], [_vi("y", [1, 4, 1, 1])])
    (task,) = extract_tasks(load_graph(proto))
    assert max(math.prod(t.shape) for t in task.task.dag.compute_tensors) <= 4 * 5 * 4
    _check(proto, tmp_path)


def test_fnet_token_mixing_by_two_dfts(tmp_path):
    """FNet's mixing, fft2(x).real, as torch.onnx (dynamo) writes it: the hidden axis transformed as a real signal,
    the sequence axis as a complex one, the real part kept; and an inverse transform cut to 12 of 16 samples."""
    nodes = [helper.make_node("Unsqueeze", ["x", "last"], ["signal"]),
             helper.make_node("DFT", ["signal", "", "hidden"], ["hidden_mixed"]),
             helper.make_node("DFT", ["hidden_mixed", "", "seq"], ["mixed"]),
             helper.make_node("DFT", ["mixed", "cut", "hidden"], ["back"], inverse=1),
             helper.make_node("Slice", ["mixed", "zero", "one", "last"], ["real"]),
             helper.make_node("Squeeze", ["real", "last"], ["y"])]
    scalars = [numpy_helper.from_array(np.array(v, np.int64), name)
               for name, v in (("hidden", 2), ("seq", 1), ("cut", 12))]
    inits = [_i64("last", -1), _i64("zero", 0), _i64("one", 1), *scalars]
    _check(_model(nodes, [_vi("x", [1, 8, 16])], [_vi("y", [1, 8, 16]), _vi("back", [1, 8, 12, 2])], inits, opset=20),
           tmp_path, tol=1e-4)
