"""ONNX reductions (ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSumExp), LpNormalization, LRN, GroupNormalization,
MeanVarianceNormalization and Shrink: small models built with onnx.helper, compiled, and compared with ONNX Runtime
on generated inputs (after a Conv too, where the layout pass makes its output channels-last)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.ir import GraphError
from tensorgen.graph.load import load_graph
from tensorgen.graph.reference.torch_eval import TorchModel
from tensorgen.runtime.model import CompiledModel

FLOAT = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "h3", inputs, outputs, list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    ops = {n.op_type for n in nodes}
    if "GroupNormalization" not in ops or opset >= 21:  # the checker calls GroupNormalization-18 deprecated
        # and its shape inference fails inside MeanVarianceNormalization's function body with the default axes
        onnx.checker.check_model(proto, full_check="MeanVarianceNormalization" not in ops)
    return proto


def _vi(name: str, shape, elem: int = FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _feeds(proto: onnx.ModelProto, seed: int, scale: float = 1.0, offset: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {x.name: (rng.standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim]) * scale + offset)
            .astype(helper.tensor_dtype_to_np_dtype(x.type.tensor_type.elem_type)) for x in proto.graph.input}


def _reference(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's results; tensorgen's PyTorch reference for what ONNX Runtime refuses (an even LRN size; its
    window is checked against the spec in test_lrn_reference_window_follows_the_spec; onnx.reference's LRN loops over
    the batch where it means the channels)."""
    even_lrn = any(n.op_type == "LRN" and helper.get_node_attr_value(n, "size") % 2 == 0 for n in proto.graph.node)
    if even_lrn:
        return TorchModel(import_onnx(proto)).run(feeds)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(proto: onnx.ModelProto, tmp_path, feeds: dict[str, np.ndarray] | None = None, seed: int = 0,
           rtol: float = 1e-5, atol: float = 1e-5) -> list[np.ndarray]:
    feeds = feeds if feeds is not None else _feeds(proto, seed)
    ref = _reference(proto, feeds)
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run(
        [feeds[n] for n in load_graph(proto).inputs])
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return ours


def _reduced(shape, axes, keepdims: int) -> list[int]:
    axes = [a % len(shape) for a in axes] if axes else list(range(len(shape)))
    return [1 if d in axes else n for d, n in enumerate(shape) if keepdims or d not in axes]


# --- ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSumExp ----------------------------------------------------------

REDUCTIONS = ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize(("shape", "axes", "keepdims", "opset"), [
    ((3, 4, 5), [1], 1, 13), ((3, 4, 5), [-1, 0], 0, 13), ((2, 3, 4, 5), None, 0, 13),
    ((3, 4, 5), [2], 0, 18), ((2, 3, 4, 5), [0, 2, 3], 1, 18), ((6, 7), None, 1, 18)])
def test_norm_reductions_match_onnxruntime(op, shape, axes, keepdims, opset, tmp_path):
    """Axes as the attribute (opset 13) or the constant input (18), none meaning every axis, with and without
    keepdims."""
    inits, inputs, attrs = [], ["x"], {"keepdims": keepdims}
    if axes is not None and opset >= 18:
        inits, inputs = [_const("axes", axes, np.int64)], ["x", "axes"]
    elif axes is not None:
        attrs["axes"] = axes
    node = helper.make_node(op, inputs, ["y"], **attrs)
    _check(_model([node], [_vi("x", list(shape))], [_vi("y", _reduced(shape, axes, keepdims))], inits, opset=opset),
           tmp_path, seed=len(shape))


@pytest.mark.parametrize("op", REDUCTIONS)
def test_norm_reductions_with_noop_for_empty_axes(op, tmp_path):
    """noop_with_empty_axes and no axes: no reduction, each element mapped (|x|, x * x, x)."""
    node = helper.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)
    _check(_model([node], [_vi("x", [3, 4])], [_vi("y", [3, 4])], opset=18), tmp_path)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_sum_exp_of_large_values(dtype, tmp_path):
    """Around 1000, where exp overflows even in float64: the maximum is subtracted first."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)
    proto = _model([node], [_vi("x", [4, 50], elem)], [_vi("y", [4], elem)], [_const("axes", [1], np.int64)],
                   opset=18)
    feeds = {"x": (np.random.default_rng(1).standard_normal((4, 50)) * 5 + 1000).astype(dtype)}
    feeds["x"][1] -= 2000  # around -1000, where exp underflows to 0
    ours = _check(proto, tmp_path, feeds)
    assert np.isfinite(ours[0]).all()


def test_log_sum_exp_of_infinities(tmp_path):
    """A row of -inf is -inf (exp(-inf - -inf) would be NaN), a row holding +inf is +inf."""
    node = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=1)
    proto = _model([node], [_vi("x", [3, 4])], [_vi("y", [3, 1])], opset=13)
    x = np.array([[-np.inf] * 4, [1, np.inf, 2, 3], [1, 2, 3, 4]], np.float32)
    np.testing.assert_array_equal(_check(proto, tmp_path, {"x": x})[0][:2, 0], [-np.inf, np.inf])


def test_integer_sum_of_squares_and_l1(tmp_path):
    nodes = [helper.make_node("ReduceSumSquare", ["x"], ["s"], axes=[0], keepdims=0),
             helper.make_node("ReduceL1", ["x"], ["l"], axes=[1], keepdims=1)]
    i64 = TensorProto.INT64
    proto = _model(nodes, [_vi("x", [5, 6], i64)], [_vi("s", [6], i64), _vi("l", [5, 1], i64)], opset=13)
    _check(proto, tmp_path, {"x": np.random.default_rng(2).integers(-50, 50, (5, 6))})


# --- LpNormalization ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize(("shape", "axis"), [((4, 6), -1), ((2, 5, 3), 1), ((2, 3, 4, 5), 0)])
def test_lp_normalization(p, shape, axis, tmp_path):
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)
    proto = _model([node], [_vi("x", list(shape))], [_vi("y", list(shape))])
    feeds = _feeds(proto, seed=p)
    np.moveaxis(feeds["x"], axis, -1)[..., 0, :] = 0.0  # a zero vector: 0, not NaN, as in ONNX Runtime
    assert np.isfinite(_check(proto, tmp_path, feeds)[0]).all()


def test_lp_normalization_of_other_orders_is_refused():
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=3)
    with pytest.raises(GraphError, match=r"LpNormalization\): p=3 is not supported"):
        import_onnx(_model([node], [_vi("x", [2, 3])], [_vi("y", [2, 3])]))


def test_f_normalize_as_torch_onnx_writes_it(tmp_path):
    """F.normalize(x, dim=1): ReduceL2 (keepdims), Clip at eps, Expand, Div; after a Conv."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceL2", ["c", "axes"], ["n"], keepdims=1),
             helper.make_node("Clip", ["n", "eps"], ["nc"]),
             helper.make_node("Expand", ["nc", "shape"], ["ne"]),
             helper.make_node("Div", ["c", "ne"], ["y"])]
    _check(_model(nodes, [_vi("x", [2, 3, 5, 5])], [_vi("y", [2, 8, 5, 5])],
                  [_const("w", rng.standard_normal((8, 3, 3, 3))), _const("axes", [1], np.int64),
                   _const("eps", 1e-12), _const("shape", [2, 8, 5, 5], np.int64)], opset=18), tmp_path)


# --- LRN ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("size", "alpha", "beta", "bias"), [(5, 1e-4, 0.75, 1.0), (4, 0.02, 0.5, 2.0),
                                                             (1, 0.1, 1.0, 1.0), (3, 2e-3, 0.75, 0.5)])
@pytest.mark.parametrize("shape", [(2, 7, 5, 6), (1, 3, 4, 4)])
def test_lrn_matches_onnxruntime(size, alpha, beta, bias, shape, tmp_path):
    """Odd and even windows (even: the larger half after the channel; checked against onnx.reference, as ONNX
    Runtime refuses them), windows wider than the channels."""
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    proto = _model([node], [_vi("x", list(shape))], [_vi("y", list(shape))])
    _check(proto, tmp_path, _feeds(proto, seed=size, scale=3.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6])
def test_lrn_reference_window_follows_the_spec(size):
    """The PyTorch reference against the ONNX spec's sum, written as a loop: channels c - floor((size - 1) / 2) to
    c + ceil((size - 1) / 2)."""
    x = np.random.default_rng(size).standard_normal((2, 5, 3, 2)).astype(np.float32)
    alpha, beta, bias = 0.3, 0.75, 1.5
    squares = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + -(-(size - 1) // 2) + 1)
        squares[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    expected = x / (bias + alpha / size * squares) ** beta
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    got = TorchModel(import_onnx(_model([node], [_vi("x", list(x.shape))], [_vi("y", list(x.shape))]))).run([x])
    np.testing.assert_allclose(got[0], expected, rtol=1e-6)


@pytest.mark.parametrize("size", [5, 4])
def test_lrn_between_convs_as_alexnet_has_it(size, tmp_path):
    """Conv -> Relu -> LRN -> MaxPool -> Conv: the LRN runs on the channels-last output of the Conv."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("LRN", ["r"], ["n"], size=size, alpha=1e-2, beta=0.75, bias=1.0),
             helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    proto = _model(nodes, [_vi("x", [2, 3, 8, 8])], [_vi("y", [2, 4, 4, 4])],
                   [_const("w1", rng.standard_normal((16, 3, 3, 3))), _const("b1", rng.standard_normal(16)),
                    _const("w2", rng.standard_normal((4, 16, 1, 1)))])
    _check(proto, tmp_path, rtol=1e-4, atol=1e-4)


def test_lrn_after_a_conv_runs_channels_last():
    from tensorgen.graph.passes.layout import to_channels_last

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("LRN", ["c"], ["y"], size=3)]
    graph = to_channels_last(import_onnx(_model(nodes, [_vi("x", [1, 3, 6, 6])], [_vi("y", [1, 8, 6, 6])],
                                                [_const("w", rng.standard_normal((8, 3, 1, 1)))])))
    lrn = next(n for n in graph.nodes if n.op == "LRN")
    assert lrn.attrs["layout"] == "NHWC" and graph.value(lrn.inputs[0]).shape == (1, 6, 6, 8)


@pytest.mark.parametrize(("attrs", "shape", "message"), [({"size": 0}, [1, 3, 4, 4], "size=0"),
                                                         ({"size": 3}, [2, 3], "is not")])
def test_lrn_refusals(attrs, shape, message):
    proto = helper.make_model(helper.make_graph([helper.make_node("LRN", ["x"], ["y"], **attrs)], "g",
                                                [_vi("x", shape)], [_vi("y", shape)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphError, match=rf"\(LRN\): .*{message}"):
        import_onnx(proto)


# --- GroupNormalization ------------------------------------------------------------------------------------------

def _group_norm(shape, groups: int, opset: int, epsilon: float = 1e-5, before=(), x: str = "x"):
    rng = np.random.default_rng(groups + opset)
    params = shape[1] if opset >= 21 else groups
    node = helper.make_node("GroupNormalization", [x, "s", "b"], ["y"], num_groups=groups, epsilon=epsilon)
    return [*before, node], [_const("s", rng.standard_normal(params)), _const("b", rng.standard_normal(params))]


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize(("shape", "groups"), [((2, 6, 5, 4), 3), ((2, 4, 7), 4), ((1, 8, 3, 2, 2), 2),
                                               ((3, 5, 6), 1)])
def test_group_normalization_matches_onnxruntime(opset, shape, groups, tmp_path):
    """Opset 18's scale and bias per group, opset 21's per channel."""
    nodes, inits = _group_norm(shape, groups, opset, epsilon=1e-3)
    proto = _model(nodes, [_vi("x", list(shape))], [_vi("y", list(shape))], inits, opset=opset)
    _check(proto, tmp_path, _feeds(proto, seed=3, scale=2.0, offset=1.0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_after_a_conv(opset, tmp_path):
    """A UNet block: Conv -> GroupNormalization -> Sigmoid * x (SiLU) -> Conv, the Conv channels-last."""
    rng = np.random.default_rng(6)
    conv = helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1])
    nodes, inits = _group_norm((2, 8, 6, 6), 4, opset, before=[conv], x="c")
    nodes += [helper.make_node("Sigmoid", ["y"], ["sg"]), helper.make_node("Mul", ["y", "sg"], ["silu"]),
              helper.make_node("Conv", ["silu", "w2"], ["out"], pads=[1, 1, 1, 1])]
    inits += [_const("w1", rng.standard_normal((8, 3, 3, 3))), _const("b1", rng.standard_normal(8)),
              _const("w2", rng.standard_normal((4, 8, 3, 3)))]
    _check(_model(nodes, [_vi("x", [2, 3, 6, 6])], [_vi("out", [2, 4, 6, 6])], inits, opset=opset), tmp_path,
           rtol=1e-4, atol=1e-4)


def test_group_normalization_with_run_time_scale_and_bias(tmp_path):
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    proto = _model([node], [_vi("x", [2, 4, 3]), _vi("s", [4]), _vi("b", [4])], [_vi("y", [2, 4, 3])], opset=21)
    _check(proto, tmp_path)


@pytest.mark.parametrize(("groups", "params", "opset", "message"), [
    (3, 3, 18, "num_groups=3 does not divide the channels"),
    (2, 4, 18, r"scale \[4\] must be \(2,\): one per group"),
    (2, 2, 21, r"scale \[2\] must be \(4,\): one per channel")])
def test_group_normalization_refusals(groups, params, opset, message):
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups)
    proto = helper.make_model(helper.make_graph([node], "g", [_vi("x", [1, 4, 3])], [_vi("y", [1, 4, 3])],
                                                [_const("s", np.ones(params)), _const("b", np.zeros(params))]),
                              opset_imports=[helper.make_opsetid("", opset)])
    with pytest.raises(GraphError, match=rf"\(GroupNormalization\): {message}"):
        import_onnx(proto)


# --- MeanVarianceNormalization, Shrink ---------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "axes"), [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1]), ((3, 4, 6), [0, -1]),
                                             ((2, 5, 3, 4), [1, 2, 3])])
def test_mean_variance_normalization(shape, axes, tmp_path):
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], **attrs)
    proto = _model([node], [_vi("x", list(shape))], [_vi("y", list(shape))], opset=13)
    _check(proto, tmp_path, _feeds(proto, seed=7, scale=3.0, offset=2.0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("lambd", "bias"), [(0.5, 0.0), (1.5, 1.5), (0.0, -0.3)])
def test_shrink_after_a_conv(lambd, bias, tmp_path):
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Shrink", ["c"], ["y"], lambd=lambd, bias=bias)]
    _check(_model(nodes, [_vi("x", [2, 3, 5, 5])], [_vi("y", [2, 4, 5, 5])],
                  [_const("w", rng.standard_normal((4, 3, 3, 3)))]), tmp_path)
